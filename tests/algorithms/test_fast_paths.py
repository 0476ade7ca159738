"""The chunked fast paths of the GAE family (ragen.algorithms.scan) against plain loops and the references.

The estimator tests elsewhere use short rows; here rows span many CHUNK-token chunks, turns end exactly on
chunk borders, turns touch (no env gap), T is not a multiple of CHUNK, and the discount is 0, tiny, < 1 or 1.
"""

import inspect

import pytest
import torch

from ragen.algorithms import AdvantageInputs, compute_advantage
from ragen.algorithms.reference import REFERENCES, random_inputs
from ragen.algorithms.scan import CHUNK, chunked_scan, reverse_linear_scan, run_view, turn_view

D = torch.float64


def loop_scan(u, c, steps=None, cuts=None):
    """x_j = u_j + a_j x_{j+1}: a = c on steps, 1 elsewhere, 0 at cuts (plain Python)."""
    B, T = u.shape
    out = torch.zeros_like(u)
    for b in range(B):
        x = 0.0
        for j in reversed(range(T)):
            a = c if steps is None or bool(steps[b, j]) else 1.0
            if cuts is not None and j in cuts[b]:
                a = 0.0
            x = float(u[b, j]) + a * x
            out[b, j] = x
    return out


def aligned_layout(T: int, B: int = 3, seed: int = 0):
    """Turn ids with edges on chunk borders, touching turns, a turn at position 0 and one ending at T - 1."""
    g = torch.Generator().manual_seed(seed)
    tid = torch.full((B, T), -1, dtype=torch.long)
    for b in range(B):
        j, k = (0 if b == 0 else CHUNK * (b + 1)), 0
        while j < T:
            n = int(torch.randint(1, 3 * CHUNK, (1,), generator=g))
            if b == 1:
                n = CHUNK  # every edge on a chunk border
            tid[b, j:j + n] = k
            k += 1
            j += n + (0 if (b == 2 and k % 2) else int(torch.randint(0, CHUNK + 3, (1,), generator=g)))
    return tid


@pytest.mark.parametrize("T", [5, CHUNK, 7 * CHUNK, 7 * CHUNK + 5])
@pytest.mark.parametrize("c", [0.0, 0.05, 0.5, 0.95, 1.0])
def test_chunked_scan_matches_loop(T, c):
    g = torch.Generator().manual_seed(T)
    u = torch.randn(3, T, generator=g, dtype=D)
    tid = aligned_layout(T)
    view = turn_view(tid, tid >= 0)
    ends = view.ends_or_neg()
    cuts = [set(ends[b][ends[b] >= 0].tolist()) for b in range(3)]
    x = chunked_scan(u, c, cut_pos=ends)  # bi-level layout: cut after each turn
    torch.testing.assert_close(x, loop_scan(u, c, cuts=cuts), atol=1e-12, rtol=0)
    steps = tid >= 0  # token-GAE layout: other tokens pass through with u = 0
    marks = torch.cat([view.firsts_or_neg(), ends], dim=1)
    x = chunked_scan(u * steps, c, steps=steps, mark_pos=marks)
    torch.testing.assert_close(x * steps, loop_scan(u * steps, c, steps=steps) * steps, atol=1e-12, rtol=0)


def test_chunked_scan_agrees_with_doubling_scan_on_float32():
    g = torch.Generator().manual_seed(1)
    u = torch.randn(4, 40 * CHUNK + 3, generator=g)
    x = chunked_scan(u, 0.97)
    ref = reverse_linear_scan(u.double(), 0.97)
    assert x.dtype == torch.float32
    torch.testing.assert_close(x.double(), ref, atol=2e-5, rtol=0)


@pytest.mark.parametrize("T", [CHUNK - 3, 6 * CHUNK, 6 * CHUNK + 1])
def test_turn_view_helpers_match_loops(T):
    tid = aligned_layout(T, seed=T)
    model = tid >= 0
    view = turn_view(tid, model)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, T, generator=g, dtype=D) * 100  # garbage off the mask must not leak
    y = torch.randn(3, view.K, generator=g, dtype=D)
    want_sum = torch.zeros(3, view.K, dtype=D)
    want_bc = torch.zeros(3, T, dtype=D)
    for b in range(3):
        for j in range(T):
            if model[b, j]:
                want_sum[b, tid[b, j]] += x[b, j]
                want_bc[b, j] = y[b, tid[b, j]]
    torch.testing.assert_close(view.sum_tokens(x), want_sum, atol=1e-9, rtol=0)
    torch.testing.assert_close(view.broadcast(y), want_bc, atol=0, rtol=0)
    torch.testing.assert_close(view.mask_(x.clone()), torch.where(model, x, 0.0), atol=0, rtol=0)
    torch.testing.assert_close(view.broadcast_add_(x.clone(), y, alpha=0.3), x + 0.3 * want_bc, atol=1e-12, rtol=0)
    assert view.num_turns.tolist() == (tid.amax(dim=1) + 1).tolist()
    runs = run_view(model)  # touching turns are one run
    assert bool((runs.num_turns <= view.num_turns).all()) and int(runs.num_turns[1]) < int(view.num_turns[1]) + 1


def test_turn_view_rejects_split_and_reordered_turns():
    split = torch.tensor([[0, 0, -1, 0, 1]])
    with pytest.raises(ValueError, match="must number each row"):
        turn_view(split, split >= 0)
    reordered = torch.tensor([[1, 1, -1, 0, 0]])
    with pytest.raises(ValueError, match="must number each row"):
        turn_view(reordered, reordered >= 0)


def long_inputs(dtype, seed=0, T=40 * CHUNK):
    """Rows of T tokens (a multiple of CHUNK takes the chunk-wise masking path, others the fallback)."""
    return random_inputs(5, seed=seed, min_turns=3, max_turns=12, model_len=(1, 3 * CHUNK), env_len=(0, 2 * CHUNK),
                         prompt_len=(0, CHUNK), dense_reward_frac=0.3, dtype=dtype, T=T)


def run_both(name, inp, **params):
    adv, ret = compute_advantage(name, inp, **params)
    accepted = inspect.signature(REFERENCES[name]).parameters
    ref_adv, ref_ret = REFERENCES[name](inp, **{k: v for k, v in params.items() if k in accepted})
    return adv, ret, torch.tensor(ref_adv, dtype=D), torch.tensor(ref_ret, dtype=D)


@pytest.mark.usefixtures("gae_path")
@pytest.mark.parametrize("name", ["gae", "turn_gae", "bilevel_gae", "weighted_gae"])
@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (1.0, 0.95), (0.9, 0.8), (0.25, 0.2), (0.7, 0.0)])
@pytest.mark.parametrize("skip_env_tokens", [True, False])
@pytest.mark.parametrize("return_mode", ["adv_plus_value", "reward_to_go"])
@pytest.mark.parametrize("T", [40 * CHUNK, 40 * CHUNK + 7])
def test_long_rows_match_reference_float64(name, gamma, lam, skip_env_tokens, return_mode, T):
    inp = long_inputs(D, seed=3, T=T)
    adv, ret, ref_adv, ref_ret = run_both(
        name, inp, gamma=gamma, lam=lam, high_level_gamma=0.9, high_level_lam=0.8, turn_level_weight=0.4,
        skip_env_tokens=skip_env_tokens, return_mode=return_mode,
    )
    torch.testing.assert_close(adv, ref_adv, atol=1e-9, rtol=0)
    torch.testing.assert_close(ret, ref_ret, atol=1e-9, rtol=0)


@pytest.mark.usefixtures("gae_path")
@pytest.mark.parametrize("name", ["gae", "turn_gae", "bilevel_gae", "weighted_gae"])
@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (1.0, 0.95), (0.99, 0.9)])
@pytest.mark.parametrize("seed,T", [(0, 40 * CHUNK), (1, 40 * CHUNK + 7)])
def test_long_rows_match_reference_float32(name, gamma, lam, seed, T):
    inp = long_inputs(torch.float32, seed=seed, T=T)
    adv, ret, ref_adv, ref_ret = run_both(name, inp, gamma=gamma, lam=lam, high_level_gamma=0.95, high_level_lam=0.95)
    assert adv.dtype == ret.dtype == torch.float32
    torch.testing.assert_close(adv.double(), ref_adv, atol=1e-5, rtol=0)
    torch.testing.assert_close(ret.double(), ref_ret, atol=1e-5, rtol=0)
    off = inp.response_mask == 0
    assert bool((adv[off] == 0).all()) and bool((ret[off] == 0).all())


@pytest.mark.usefixtures("gae_path")
def test_bilevel_closed_form_at_gamma_lam_one():
    # gamma = lam = 1: A_t = G_k - V_t on every token of turn k, and the return is G_k itself
    inp = long_inputs(D, seed=4)
    adv, ret = compute_advantage("bilevel_gae", inp, gamma=1.0, lam=1.0, high_level_gamma=0.9)
    model = inp.response_mask > 0
    torch.testing.assert_close(adv[model], (ret - inp.values)[model], atol=1e-12, rtol=0)
    for b in range(inp.batch_size):  # ret is constant over each turn
        for k in range(int(inp.num_turns[b])):
            vals = ret[b][inp.turn_ids[b] == k]
            assert bool((vals == vals[0]).all())


def test_per_turn_inputs_are_checked_only_when_needed():
    inp = random_inputs(4, seed=2, min_turns=3, max_turns=3)
    short = AdvantageInputs(**{**inp.__dict__, "step_rewards": inp.step_rewards[:, :1]})
    compute_advantage("gae", short)  # gae never reads step rewards
    with pytest.raises(ValueError, match="step_rewards must be"):
        compute_advantage("ms_grpo", short)


@pytest.mark.usefixtures("gae_path")
@pytest.mark.parametrize("name", ["gae", "turn_gae", "bilevel_gae", "weighted_gae"])
@pytest.mark.parametrize("shape", [(0, 10), (3, 0), (2, 40)])
def test_batches_without_model_tokens_give_zeros(name, shape):
    B, T = shape
    tid = torch.full((B, T), -1)
    inp = AdvantageInputs(torch.ones(B, T), torch.zeros(B, T, dtype=torch.long), tid, values=torch.randn(B, T),
                          truncated=torch.ones(B, dtype=torch.bool))
    for params in (dict(lam=0.9), dict(lam=1.0, skip_env_tokens=False), dict(return_mode="reward_to_go")):
        adv, ret = compute_advantage(name, inp, **params)
        assert adv.shape == ret.shape == (B, T)
        assert bool((adv == 0).all()) and bool((ret == 0).all())


def _bootstrap_loop(values, truncated, real):
    """Per-row loop: V at the last position where ``real`` > 0 for truncated rows, else 0."""
    out = []
    for b in range(values.shape[0]):
        idx = [j for j in range(values.shape[1]) if real[b, j] > 0]
        out.append(float(values[b, idx[-1]]) if truncated[b] and idx else 0.0)
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("T", [1, 37, 32768])
def test_bootstrap_values_match_loop(T):
    from ragen.algorithms.inputs import bootstrap_values

    g = torch.Generator().manual_seed(T)
    B = 6
    values = torch.randn(B, T, generator=g)
    attention = torch.randint(-1, 3, (B, T), generator=g)  # int64 with 2 (counts) and -1 (does not count)
    attention[0] = 0  # a truncated row without real tokens bootstraps 0
    attention[1, : T // 2] = 0  # left padding
    attention[2, T // 2:] = 0  # right padding
    truncated = torch.tensor([True, True, True, True, False, True])
    got = bootstrap_values(values, truncated, attention > 0, attention)
    assert torch.allclose(got.double(), _bootstrap_loop(values, truncated, attention), atol=0, rtol=0)
    resp = attention > 1  # without attention_mask the response mask locates the bootstrap
    got = bootstrap_values(values, truncated, resp, None)
    assert torch.allclose(got.double(), _bootstrap_loop(values, truncated, resp.long()), atol=0, rtol=0)


def test_marked_chunks_sorted_and_unsorted_positions_agree():
    from ragen.algorithms.scan import _marked_chunks

    g = torch.Generator().manual_seed(1)
    B, T, Q = 5, 400, -(-400 // CHUNK)
    pos = torch.randint(-1, T, (B, 9), generator=g)
    expected = sorted({b * Q + int(p) // CHUNK for b in range(B) for p in pos[b] if p >= 0})
    assert _marked_chunks([pos], Q, CHUNK).tolist() == expected  # unsorted rows: general path
    sorted_pos = torch.where(pos >= 0, pos.sort(dim=1).values, -1)  # -1 entries ignored anywhere in a row
    expected = sorted({b * Q + int(p) // CHUNK for b in range(B) for p in sorted_pos[b] if p >= 0})
    assert _marked_chunks([sorted_pos.sort(dim=1).values], Q, CHUNK).tolist() == expected  # sorted fast path
    assert _marked_chunks([pos[:, :0]], Q, CHUNK).tolist() == []
