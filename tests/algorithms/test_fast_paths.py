"""The building blocks of the vectorised estimators (ragen.algorithms.scan) against plain loops, and long rows
(thousands of tokens, >100 turns, many CHUNK-column blocks) against the references.

``discounted_suffix_sum`` works in blocks of CHUNK columns and carries each block's total into the blocks before
it, so the tests use lengths that are not multiples of CHUNK, turns that span several blocks and discounts from 0
(no carry) and 1e-3 (c^CHUNK = 1e-192) to 1 (no decay).
"""

import functools
import math

import pytest
import torch
from estimator_helpers import D, assert_matches_reference, replace

from ragen.algorithms import compute_advantage
from ragen.algorithms.reference import random_inputs
from ragen.algorithms.scan import CHUNK, compact, discounted_suffix_sum, scatter_back, turn_view

# ---- discounted_suffix_sum ----------------------------------------------------------------------------------


def loop_suffix_sum(u: torch.Tensor, c: float) -> torch.Tensor:
    """x_j = u_j + c * x_{j+1}, one Python float at a time."""
    out = []
    for row in u.tolist():
        x, acc = 0.0, [0.0] * len(row)
        for j in reversed(range(len(row))):
            x = row[j] + c * x
            acc[j] = x
        out.append(acc)
    return torch.tensor(out, dtype=D).reshape(u.shape)


@pytest.mark.parametrize("c", [0.0, 1e-3, 0.5, 0.95, 1.0])
def test_discounted_suffix_sum_matches_loop(c):
    g = torch.Generator().manual_seed(int(c * 1000))
    for N in (1, 5, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 7, 4099):
        u = torch.randn(3, N, generator=g, dtype=D)
        u[1, N // 2:] = 0.0  # a row whose tail is zero
        x = discounted_suffix_sum(u, c)
        assert x.dtype == D and x.shape == (3, N)
        torch.testing.assert_close(x, loop_suffix_sum(u, c), atol=1e-10, rtol=1e-12)
        x32 = discounted_suffix_sum(u.float(), c)  # float32 input, float64 result of the float32 values
        assert x32.dtype == D
        torch.testing.assert_close(x32, loop_suffix_sum(u.float().double(), c), atol=1e-10, rtol=1e-12)
    u0 = torch.randn(2, 70, generator=g, dtype=D)
    before = u0.clone()
    discounted_suffix_sum(u0, c)[:] = 0  # the result never aliases the input
    assert torch.equal(u0, before)
    assert discounted_suffix_sum(torch.zeros(4, 0, dtype=D), c).shape == (4, 0)


@pytest.mark.parametrize("c", [1e-3, 0.5, 0.999, 1.0])
def test_discounted_suffix_sum_of_an_impulse_is_the_power_of_c(c):
    # u = 1 at the last column only: x_j = c^(N - 1 - j), carried across ~40 blocks
    N = 40 * CHUNK + 13
    u = torch.zeros(1, N, dtype=D)
    u[0, -1] = 1.0
    x = discounted_suffix_sum(u, c)[0]
    want = torch.tensor([c ** (N - 1 - j) for j in range(N)], dtype=D)
    torch.testing.assert_close(x, want, atol=1e-300, rtol=1e-12)
    if c == 1e-3:  # exact zeros (underflow) far from the impulse, never NaN
        assert bool(torch.isfinite(x).all()) and float(x[0]) == 0.0 and math.isclose(float(x[-3]), 1e-6)


# ---- compact / scatter_back ---------------------------------------------------------------------------------


def test_compact_gathers_each_rows_steps_in_order_and_scatter_back_inverts_it():
    g = torch.Generator().manual_seed(0)
    steps = torch.rand(5, 300, generator=g) < 0.4
    steps[0] = False  # a row without steps
    steps[1] = True  # a row of steps only
    steps[2, :250] = False  # left padding
    pos, valid = compact(steps)
    N = int(steps.sum(dim=1).max())
    assert pos.shape == valid.shape == (5, N) and pos.dtype == torch.long
    for b in range(5):
        where = steps[b].nonzero().flatten().tolist()
        assert valid[b].tolist() == [i < len(where) for i in range(N)]
        assert pos[b, : len(where)].tolist() == where
    x = torch.randn(5, 300, generator=g, dtype=D)
    gathered = x.gather(1, pos)
    assert torch.equal(scatter_back(gathered, pos, valid, 300), torch.where(steps, x, 0.0))
    # whatever sits in the invalid columns is dropped, and nothing lands off the steps
    noisy = torch.where(valid, gathered, torch.full_like(gathered, float("nan")))
    assert torch.equal(scatter_back(noisy, pos, valid, 300), torch.where(steps, x, 0.0))
    pos0, valid0 = compact(torch.zeros(3, 7, dtype=torch.bool))
    assert pos0.shape == valid0.shape == (3, 0)
    assert torch.equal(scatter_back(torch.zeros(3, 0, dtype=D), pos0, valid0, 7), torch.zeros(3, 7, dtype=D))


# ---- TurnView -----------------------------------------------------------------------------------------------


def layouts():
    """Random layouts: left and right padding, env gaps, touching turns (no gap), a row without model tokens,
    and long rows whose turns span several CHUNK blocks."""
    short = random_inputs(9, seed=8, max_turns=5, env_len=(0, 2))
    long = random_inputs(3, seed=9, min_turns=5, max_turns=12, model_len=(1, 3 * CHUNK), env_len=(0, CHUNK))
    out = []
    for inp in (short, long):
        tid = inp.turn_ids.clone()
        tid[-1] = -1  # no model tokens in the last row
        out.append(tid)
    return out


def test_turn_view_helpers_match_loops():
    g = torch.Generator().manual_seed(2)
    for tid in layouts():
        B, T = tid.shape
        model = tid >= 0
        tv = turn_view(tid, model.long())  # a 0/1 mask works like a bool one
        x = torch.randn(B, T, generator=g, dtype=D)
        x = torch.where(model, x, torch.full_like(x, float("nan")))  # nothing off the mask may leak
        n_turns = [int(tid[b].max()) + 1 for b in range(B)]
        K = max(n_turns)
        assert tv.K == K and tv.num_turns.tolist() == n_turns
        assert tv.exists.tolist() == [[k < n for k in range(K)] for n in n_turns]
        y = torch.randn(B, K, generator=g, dtype=D)
        want_sum = torch.zeros(B, K, dtype=D)
        want_first = torch.zeros(B, K, dtype=D)
        want_bc = torch.zeros(B, T, dtype=D)
        want_gather = torch.zeros(B, tv.pos.shape[1], dtype=D)
        want_per_token = torch.zeros(B, tv.pos.shape[1], dtype=D)
        for b in range(B):
            seen, i = set(), 0
            for j in range(T):
                k = int(tid[b, j])
                if k < 0:
                    continue
                want_sum[b, k] += x[b, j]
                if k not in seen:
                    seen.add(k)
                    want_first[b, k] = x[b, j]
                    assert int(tv.first[b, k]) == i
                want_bc[b, j] = y[b, k]
                want_gather[b, i] = x[b, j]
                want_per_token[b, i] = y[b, k]
                i += 1
        torch.testing.assert_close(tv.sum_tokens(x), want_sum, atol=1e-12, rtol=0)
        assert torch.equal(tv.at_first(x), want_first)
        assert torch.equal(tv.gather(x), want_gather)
        assert torch.equal(tv.per_token(y), want_per_token)
        assert torch.equal(tv.broadcast(y), want_bc)
        assert torch.equal(tv.scatter(want_gather), torch.where(model, x, 0.0))
        assert tv.sum_tokens(x.float()).dtype == D and tv.at_first(x.float()).dtype == D


TURN_ORDER_CASES = {
    # (row 1's turn ids, model-token index, got, expected)
    "turn_skipped": ([0, 0, -1, 2, 2, -1], 2, 2, "0 or 1"),
    "turns_out_of_order": ([0, 0, -1, 1, -1, 0], 3, 0, "1 or 2"),
    "starts_at_1": ([-1, -1, 1, 1, -1, 2], 0, 1, "0"),
    "skip_after_left_padding": ([-1, -1, 0, 1, 3, -1], 2, 3, "1 or 2"),
}


@pytest.mark.parametrize("case", sorted(TURN_ORDER_CASES))
def test_turn_view_rejects_bad_turn_numbering_naming_the_row(case):
    row, index, got, want = TURN_ORDER_CASES[case]
    tid = torch.tensor([[0, 0, -1, 1, 1, -1], row])
    expected = f"renumber the turns of row 1 (model token {index} has turn id {got}, expected {want})"
    with pytest.raises(ValueError, match="must number each row's turns 0, 1, 2") as err:
        turn_view(tid, tid >= 0)
    assert expected in str(err.value)


# ---- long rows against the references -----------------------------------------------------------------------


@functools.cache
def long_batch(dtype: torch.dtype, T: int, seed: int):
    """3 rows of up to T tokens, 100-150 turns each, turns of 1..3 CHUNK tokens and env gaps up to 2 CHUNK, some
    rows truncated, dense rewards and per-token penalties."""
    inp = random_inputs(3, seed=seed, min_turns=100, max_turns=150, model_len=(1, 3 * CHUNK), env_len=(0, 2 * CHUNK),
                        prompt_len=(0, CHUNK), dense_reward_frac=0.3, penalties=True, dtype=dtype, T=T)
    assert int(inp.num_turns.min()) > CHUNK
    return replace(inp, truncated=torch.tensor([True, False, True]))  # rows 0 and 2 bootstrap


RTG = "reward_to_go"
LONG_CASES = [
    ("gae", dict(gamma=1.0, lam=1.0)),
    ("gae", dict(gamma=0.99, lam=0.95, skip_env_tokens=False)),
    ("gae", dict(gamma=1.0, lam=1e-3)),  # c = gamma * lam = 1e-3
    ("turn_gae", dict(high_level_gamma=1.0, high_level_lam=1.0)),
    ("turn_gae", dict(high_level_gamma=0.95, high_level_lam=0.9, return_mode=RTG)),
    ("turn_gae", dict(high_level_gamma=0.5, high_level_lam=2e-3)),  # c_H = 1e-3
    ("bilevel_gae", dict(gamma=1.0, lam=1.0, high_level_gamma=1.0, high_level_lam=1.0)),
    ("bilevel_gae", dict(gamma=0.99, lam=0.95, high_level_gamma=0.95, high_level_lam=0.9)),
    ("bilevel_gae", dict(gamma=1.0, lam=1e-3, high_level_gamma=0.5, high_level_lam=2e-3)),
    ("weighted_gae", dict(turn_level_weight=0.4, gamma=0.99, lam=0.95, high_level_gamma=0.9, high_level_lam=0.8)),
    ("reinforce_pp", dict(gamma=0.999)),
]


@pytest.mark.parametrize("dtype,T", [(torch.float64, 20011), (torch.float32, 16001)], ids=["f64", "f32"])
@pytest.mark.parametrize("name,params", LONG_CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(LONG_CASES)])
def test_long_rows_match_reference(name, params, dtype, T):
    inp = long_batch(dtype, T, seed=3 if dtype == D else 4)
    atol, rtol = (1e-9, 1e-12) if dtype == D else (1e-5, 1e-6)
    assert_matches_reference(name, inp, atol=atol, rtol=rtol, **params)


def test_bilevel_closed_form_at_gamma_lam_one_on_long_rows():
    # no penalties, gamma = lam = 1: A_t = G_k - V_t, the return is G_k on every token of turn k, and G_k is
    # turn_gae's return
    inp = replace(long_batch(D, 20011, 3), token_penalties=None)
    kw = dict(high_level_gamma=0.9, high_level_lam=0.7)
    adv, ret = compute_advantage("bilevel_gae", inp, gamma=1.0, lam=1.0, **kw)
    _, ret_turn = compute_advantage("turn_gae", inp, **kw)
    model = inp.response_mask > 0
    torch.testing.assert_close(adv[model], (ret - inp.values)[model], atol=1e-9, rtol=0)
    torch.testing.assert_close(ret, ret_turn, atol=1e-9, rtol=0)
