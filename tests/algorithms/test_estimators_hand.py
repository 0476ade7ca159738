"""Hand-computed examples, invariances and error handling of the advantage estimators."""

import pytest
import torch

from ragen.algorithms import ADVANTAGE_ESTIMATORS, AdvantageInputs, compute_advantage
from ragen.algorithms.reference import random_inputs
from ragen.algorithms.scan import _suffix_scan_doubling, run_ids, suffix_scan, turn_view

pytestmark = pytest.mark.usefixtures("gae_path")  # fused kernel and tensor code (conftest.py)

D = torch.float64


def design_example():
    """DESIGN.md: 10 model tokens, turns 0..4 and 5..9, rewards 1 at 4 and 9, V = 0.1..1.0."""
    r = torch.zeros(1, 10, dtype=D)
    r[0, 4] = r[0, 9] = 1.0
    return AdvantageInputs(
        token_rewards=r, response_mask=torch.ones(1, 10, dtype=torch.long),
        turn_ids=torch.tensor([[0] * 5 + [1] * 5]), values=torch.arange(1, 11, dtype=D)[None] / 10,
    )


def test_design_bilevel_example():
    adv, ret = compute_advantage("bilevel_gae", design_example(), gamma=1.0, lam=1.0, high_level_gamma=0.95,
                                 high_level_lam=1.0)
    torch.testing.assert_close(adv[0], torch.tensor([1.85, 1.75, 1.65, 1.55, 1.45, 0.4, 0.3, 0.2, 0.1, 0.0], dtype=D))
    torch.testing.assert_close(ret[0], torch.tensor([1.95] * 5 + [1.0] * 5, dtype=D))


def test_design_example_turn_gae_and_weighted_mix():
    inp = design_example()
    a_turn, r_turn = compute_advantage("turn_gae", inp, high_level_gamma=0.95, high_level_lam=1.0)
    torch.testing.assert_close(a_turn[0], torch.tensor([1.45] * 5 + [0.0] * 5, dtype=D))
    torch.testing.assert_close(r_turn[0], torch.tensor([1.95] * 5 + [1.0] * 5, dtype=D))
    a_tok, r_tok = compute_advantage("gae", inp, gamma=1.0, lam=1.0)
    # gamma = lam = 1: A_t = (sum of future rewards) - V_t, return = sum of future rewards
    future = torch.tensor([2.0] * 5 + [1.0] * 5, dtype=D)
    torch.testing.assert_close(a_tok[0], future - inp.values[0])
    torch.testing.assert_close(r_tok[0], future)
    for w, (ea, er) in {0.0: (a_tok, r_tok), 1.0: (a_turn, r_turn)}.items():
        a, r = compute_advantage("weighted_gae", inp, turn_level_weight=w, high_level_gamma=0.95, high_level_lam=1.0)
        torch.testing.assert_close(a, ea)
        torch.testing.assert_close(r, er)
    a, _ = compute_advantage("weighted_gae", inp, turn_level_weight=0.25, high_level_gamma=0.95, high_level_lam=1.0)
    torch.testing.assert_close(a, 0.75 * a_tok + 0.25 * a_turn)


def test_ms_grpo_and_ms_po_issue_reference():
    mask = torch.tensor([[1, 1, 0, 1, 1, 0]] * 3)
    inp = AdvantageInputs(
        token_rewards=torch.zeros(3, 6, dtype=D), response_mask=mask, turn_ids=torch.tensor([[0, 0, -1, 1, 1, -1]] * 3),
        group_ids=torch.zeros(3, dtype=torch.long),
        step_rewards=torch.tensor([[0.7, 0.0], [0.2, 0.0], [0.0, 0.0]], dtype=D),
        outcome_rewards=torch.tensor([1.0, 0.2, 0.0], dtype=D),
    )
    adv, ret = compute_advantage("ms_grpo", inp, eps=1e-4)
    torch.testing.assert_close(adv[:, 0], torch.tensor([2.2428, -0.6552, -1.5876], dtype=D), atol=1e-4, rtol=0)
    torch.testing.assert_close(adv[:, 3], torch.tensor([1.1337, -0.3779, -0.7558], dtype=D), atol=1e-4, rtol=0)
    assert bool((adv[:, 2] == 0).all()) and torch.equal(adv, ret)
    # ms_po, d = 1: turn 0 normalises [1.7, 0.4, 0.0], turn 1 normalises R^O
    adv_po, _ = compute_advantage("ms_po", inp, eps=1e-4, discount_factor=1.0)
    x = torch.tensor([1.7, 0.4, 0.0], dtype=D)
    torch.testing.assert_close(adv_po[:, 0], (x - x.mean()) / (x.std() + 1e-4))
    torch.testing.assert_close(adv_po[:, 3], adv[:, 3])


def test_zero_reward_middle_turn_is_still_a_turn():
    # 3 turns of 2 tokens with env gaps; rewards 0 on the middle turn. V = 0.5 on every model token.
    tid = torch.tensor([[0, 0, -1, 1, 1, -1, 2, 2]])
    r = torch.zeros(1, 8, dtype=D)
    r[0, 1], r[0, 7] = 1.0, 2.0
    inp = AdvantageInputs(r, (tid >= 0).long(), tid, values=torch.full((1, 8), 0.5, dtype=D))
    adv, ret = compute_advantage("turn_gae", inp, high_level_gamma=0.5, high_level_lam=1.0)
    # delta_2 = 2 - 0.5 = 1.5; delta_1 = 0 + 0.25 - 0.5 = -0.25; delta_0 = 1 + 0.25 - 0.5 = 0.75
    # A_2 = 1.5, A_1 = -0.25 + 0.5 * 1.5 = 0.5, A_0 = 0.75 + 0.5 * 0.5 = 1.0
    torch.testing.assert_close(adv[0], torch.tensor([1.0, 1.0, 0, 0.5, 0.5, 0, 1.5, 1.5], dtype=D))
    torch.testing.assert_close(ret[0], torch.tensor([1.5, 1.5, 0, 1.0, 1.0, 0, 2.0, 2.0], dtype=D))
    _, rtg = compute_advantage("turn_gae", inp, high_level_gamma=0.5, return_mode="reward_to_go")
    torch.testing.assert_close(rtg[0], torch.tensor([1.5, 1.5, 0, 1.0, 1.0, 0, 2.0, 2.0], dtype=D))


def test_gae_skips_env_tokens_and_bootstraps_truncated_rows():
    # model tokens at 0, 1, 4 (env at 2, 3, pad at 5); gamma = 0.5, lam = 1.
    tid = torch.tensor([[0, 0, -1, -1, 1, -1]])
    r = torch.tensor([[0.0, 1.0, 9.0, 9.0, 2.0, 9.0]], dtype=D)  # 9s off the mask are ignored
    v = torch.tensor([[1.0, 2.0, 7.0, 7.0, 4.0, 8.0]], dtype=D)
    att = torch.tensor([[1, 1, 1, 1, 1, 0]])
    inp = AdvantageInputs(r, (tid >= 0).long(), tid, values=v, truncated=torch.tensor([False]), attention_mask=att)
    adv, ret = compute_advantage("gae", inp, gamma=0.5, lam=1.0)
    # deltas: p=4: 2 - 4 = -2; p=1: 1 + 0.5*4 - 2 = 1; p=0: 0 + 0.5*2 - 1 = 0
    # A_4 = -2, A_1 = 1 + 0.5*(-2) = 0, A_0 = 0 + 0.5*0 = 0
    torch.testing.assert_close(adv[0], torch.tensor([0.0, 0.0, 0, 0, -2.0, 0], dtype=D))
    torch.testing.assert_close(ret[0], torch.tensor([1.0, 2.0, 0, 0, 2.0, 0], dtype=D))
    # truncated: after the last model token bootstrap from V at the last non-pad position (4.0 at index 4)
    inp.truncated = torch.tensor([True])
    adv_t, _ = compute_advantage("gae", inp, gamma=0.5, lam=1.0)
    torch.testing.assert_close(adv_t[0, 4], torch.tensor(-2.0 + 0.5 * 4.0, dtype=D))
    # with skip_env_tokens=False the env tokens 2, 3 are steps with reward 0 and their own values
    adv_s, _ = compute_advantage("gae", inp.__class__(r, inp.response_mask, tid, values=v), gamma=0.5, lam=1.0,
                                 skip_env_tokens=False)
    # A_4 = -2; A_3 = 0.5*4 - 7 + 0.5*(-2) = -6; A_2 = 0.5*7 - 7 + 0.5*(-6) = -6.5
    # A_1 = 1 + 0.5*7 - 2 + 0.5*(-6.5) = -0.75; A_0 = 0.5*2 - 1 + 0.5*(-0.75) = -0.375
    torch.testing.assert_close(adv_s[0], torch.tensor([-0.375, -0.75, 0, 0, -2.0, 0], dtype=D))


def test_truncated_turn_methods_bootstrap_from_last_non_pad_token():
    tid = torch.tensor([[0, 0, -1, 1, -1, -1]])
    r = torch.tensor([[0.0, 1.0, 0.0, 0.0, 0.0, 0.0]], dtype=D)
    v = torch.tensor([[0.2, 0.3, 0.0, 0.6, 0.8, 5.0]], dtype=D)
    inp = AdvantageInputs(r, (tid >= 0).long(), tid, values=v, truncated=torch.tensor([True]),
                          attention_mask=torch.tensor([[1, 1, 1, 1, 1, 0]]))
    adv, _ = compute_advantage("turn_gae", inp, high_level_gamma=0.5, high_level_lam=1.0)
    # delta_1 = 0 + 0.5*0.8 - 0.6 = -0.2; delta_0 = 1 + 0.5*0.6 - 0.3 = 1.0; A_0 = 1.0 + 0.5*(-0.2) = 0.9
    torch.testing.assert_close(adv[0], torch.tensor([0.9, 0.9, 0, -0.2, 0, 0], dtype=D))
    inp.attention_mask = None  # fallback: the last model token stands in for the last non-pad token
    adv, _ = compute_advantage("turn_gae", inp, high_level_gamma=0.5, high_level_lam=1.0)
    torch.testing.assert_close(adv[0, 3], torch.tensor(0.5 * 0.6 - 0.6, dtype=D))


def test_single_turn_bilevel_equals_gae():
    inp = random_inputs(6, seed=5, max_turns=1, model_len=(3, 12), truncated_frac=0.5)
    kw = dict(gamma=0.9, lam=0.7, high_level_gamma=0.9, high_level_lam=0.3)
    a_b, r_b = compute_advantage("bilevel_gae", inp, **kw)
    a_g, r_g = compute_advantage("gae", inp, **kw)
    torch.testing.assert_close(a_b, a_g)
    torch.testing.assert_close(r_b, r_g)


@pytest.mark.parametrize("name", ["gae", "turn_gae", "bilevel_gae", "weighted_gae", "reinforce_pp", "gigpo"])
def test_values_and_rewards_off_model_tokens_change_nothing(name):
    inp = random_inputs(9, seed=2, max_turns=4)
    adv, ret = compute_advantage(name, inp, gamma=0.9, lam=0.9)
    off = inp.response_mask == 0
    keep = torch.zeros_like(off)  # the bootstrap token of truncated rows is the one off-model value used
    last = (inp.attention_mask * torch.arange(inp.attention_mask.shape[1])).argmax(dim=1)
    keep[torch.arange(9), last] = inp.truncated
    noisy = AdvantageInputs(**{**inp.__dict__})
    noisy.values = torch.where(off & ~keep, torch.randn_like(inp.values) * 100, inp.values)
    noisy.token_rewards = torch.where(off, torch.randn_like(inp.values) * 100, inp.token_rewards)
    adv2, ret2 = compute_advantage(name, noisy, gamma=0.9, lam=0.9)
    torch.testing.assert_close(adv, adv2, atol=1e-12, rtol=0)
    torch.testing.assert_close(ret, ret2, atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
def test_permuting_rows_permutes_outputs(name):
    inp = random_inputs(12, seed=4)
    perm = torch.randperm(12, generator=torch.Generator().manual_seed(0))
    fields = {k: (v[perm] if isinstance(v, torch.Tensor) else v) for k, v in inp.__dict__.items()}
    fields["turn_obs_keys"] = [inp.turn_obs_keys[i] for i in perm.tolist()]
    fields["group_ids"] = inp.group_ids[perm] * 7 + 3  # group labels themselves do not matter either
    adv, ret = compute_advantage(name, inp)
    adv_p, ret_p = compute_advantage(name, AdvantageInputs(**fields))
    torch.testing.assert_close(adv[perm], adv_p, atol=1e-12, rtol=0)
    torch.testing.assert_close(ret[perm], ret_p, atol=1e-12, rtol=0)


def test_whiten_uses_population_variance():
    inp = random_inputs(8, seed=1)
    adv_raw, _ = compute_advantage("gae", inp)
    adv, _ = compute_advantage("gae", inp, whiten=True, eps=0.0)
    m = inp.response_mask.bool()
    x = adv_raw[m]
    pop_std = (x - x.mean()).square().mean().sqrt()
    torch.testing.assert_close(adv[m], (x - x.mean()) / pop_std)
    assert abs(float(adv[m].mean())) < 1e-12
    assert abs(float(adv[m].square().mean()) - 1.0) < 1e-12  # population variance is exactly 1
    assert float(adv[m].var(unbiased=True)) > 1.0  # the unbiased estimate is n / (n - 1)
    assert bool((adv[~m] == 0).all())


def test_grpo_and_rloo_hand_example():
    tid = torch.tensor([[0, -1], [0, -1], [0, 0], [0, -1]])
    r = torch.tensor([[1.0, 0], [0.0, 0], [0.0, 3.0], [5.0, 0]], dtype=D)
    inp = AdvantageInputs(r, (tid >= 0).long(), tid, group_ids=torch.tensor([0, 0, 0, 9]))
    adv, _ = compute_advantage("grpo", inp, eps=0.0)
    # group 0 totals [1, 0, 3]: mean 4/3, unbiased std sqrt(7/3); group 9 is a singleton -> 0
    s = (7 / 3) ** 0.5
    torch.testing.assert_close(adv[:, 0], torch.tensor([-1 / 3 / s, -4 / 3 / s, 5 / 3 / s, 0.0], dtype=D))
    adv, _ = compute_advantage("grpo", inp, norm_by_std=False)
    torch.testing.assert_close(adv[:, 0], torch.tensor([-1 / 3, -4 / 3, 5 / 3, 0.0], dtype=D))
    adv, _ = compute_advantage("rloo", inp)
    torch.testing.assert_close(adv[:, 0], torch.tensor([1 - 1.5, 0 - 2.0, 3 - 0.5, 0.0], dtype=D))
    assert float(adv[2, 1]) == 2.5 and float(adv[0, 1]) == 0.0
    same = AdvantageInputs(torch.ones(3, 2, dtype=D), torch.ones(3, 2, dtype=torch.long),
                           torch.zeros(3, 2, dtype=torch.long), group_ids=torch.zeros(3, dtype=torch.long))
    assert bool((compute_advantage("grpo", same)[0] == 0).all())  # equal rewards -> exactly 0


def test_gigpo_hand_example():
    # one group of two trajectories, 2 turns each; both first turns saw "start" (one step group), the second
    # turns saw different observations (singletons -> 0). gamma = 0.5.
    tid = torch.tensor([[0, 1], [0, 1]])
    r = torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=D)
    inp = AdvantageInputs(r, torch.ones(2, 2, dtype=torch.long), tid, group_ids=torch.tensor([4, 4]),
                          turn_obs_keys=[["start", "a"], ["start", "b"]])
    adv, _ = compute_advantage("gigpo", inp, gamma=0.5, step_advantage_weight=2.0, eps=0.0)
    # totals equal (1, 1) -> episode term 0. Turn-0 returns: 0 + 0.5*1 = 0.5 and 1 + 0 = 1.0 -> Ahat = -/+ 1/sqrt2
    h = 2 ** -0.5
    torch.testing.assert_close(adv, torch.tensor([[-2 * h, 0.0], [2 * h, 0.0]], dtype=D))


def test_suffix_scan_paths_agree():
    g = torch.Generator().manual_seed(0)
    u = torch.randn(3, 50, generator=g, dtype=D)
    steps = torch.rand(3, 50, generator=g) < 0.7
    u = u * steps
    segs = turn_view(run_ids(steps), steps).segments  # each run of steps is a segment
    for c in (0.3, 0.9, 1.0):
        for seg in (None, segs):
            fast, slow = suffix_scan(u, steps, c, seg), _suffix_scan_doubling(u, steps, c, seg)
            torch.testing.assert_close(fast * steps, slow * steps)
    # segments really cut: the last step of each run does not see what follows
    x = suffix_scan(u, steps, 1.0, segs)
    ends = segs.seg_last
    torch.testing.assert_close(x.gather(1, ends) * segs.seg_exists, u.gather(1, ends) * segs.seg_exists)


def test_errors_are_clear():
    inp = design_example()
    with pytest.raises(ValueError, match="unknown advantage estimator 'nope'.*bilevel_gae"):
        compute_advantage("nope", inp)
    no_values = AdvantageInputs(inp.token_rewards, inp.response_mask, inp.turn_ids)
    with pytest.raises(ValueError, match="values is None"):
        compute_advantage("gae", no_values)
    with pytest.raises(ValueError, match="group_ids is None"):
        compute_advantage("grpo", no_values)
    bad = AdvantageInputs(inp.token_rewards, inp.response_mask, torch.tensor([[0] * 5 + [-1] + [1] * 4]),
                          values=inp.values)
    with pytest.raises(ValueError, match="disagree at row 0, position 5"):
        compute_advantage("gae", bad)
    gap = AdvantageInputs(inp.token_rewards, inp.response_mask, torch.tensor([[0] * 5 + [2] * 5]), values=inp.values)
    with pytest.raises(ValueError, match="must number each row.s turns"):
        compute_advantage("turn_gae", gap)
    with pytest.raises(ValueError, match="return_mode"):
        compute_advantage("gae", inp, return_mode="mc")
    with pytest.raises(ValueError, match="turn_level_weight"):
        compute_advantage("weighted_gae", inp, turn_level_weight=2.0)
