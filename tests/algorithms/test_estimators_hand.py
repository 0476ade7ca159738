"""Hand-computed examples of every advantage estimator (docs/estimators.md).

Every example goes through ``check``: the vectorised implementation and the plain-loop reference must agree
(the reference is the truth on random inputs elsewhere), and both must give the numbers derived in the comments.
Notation: V(s_k) = the value at turn k's first model token, e_k = its last model token, r_k = the turn reward.
"""

import pytest
import torch
from estimator_helpers import D, check, replace, tokens

from ragen.algorithms import AdvantageInputs, compute_advantage


def t(*xs):
    return torch.tensor(xs, dtype=D)


def design_example(**extra):
    """The worked example of docs/estimators.md: 10 model tokens, turns 0..4 and 5..9, rewards 1 at tokens 4 and 9,
    V = 0.1..1.0."""
    r = torch.zeros(1, 10, dtype=D)
    r[0, 4] = r[0, 9] = 1.0
    return AdvantageInputs(
        token_rewards=r, response_mask=torch.ones(1, 10, dtype=torch.long),
        turn_ids=torch.tensor([[0] * 5 + [1] * 5]), values=torch.arange(1, 11, dtype=D)[None] / 10, **extra,
    )


# ---- GAE family -----------------------------------------------------------------------------------------------


def test_design_bilevel_example_lam_h_1():
    # V(s_0) = V_0 = 0.1, V(s_1) = V_5 = 0.6, r_0 = r_1 = 1, gamma_H = 0.95, lam_H = 1:
    # delta_1 = 1 + 0 - 0.6 = 0.4; delta_0 = 1 + 0.95 * 0.6 - 0.1 = 1.47; A^H_1 = 0.4, A^H_0 = 1.47 + 0.95 * 0.4 = 1.85
    # G_0 = 1.85 + 0.1 = 1.95, G_1 = 0.4 + 0.6 = 1.0; gamma = lam = 1: A_t = G_k - V_t, return = G_k
    adv, ret = check("bilevel_gae", design_example(), gamma=1.0, lam=1.0, high_level_gamma=0.95, high_level_lam=1.0)
    torch.testing.assert_close(adv[0], t(1.85, 1.75, 1.65, 1.55, 1.45, 0.4, 0.3, 0.2, 0.1, 0.0))
    torch.testing.assert_close(ret[0], t(*[1.95] * 5, *[1.0] * 5))


def test_design_bilevel_and_turn_gae_example_lam_h_half():
    # as above with lam_H = 0.5: A^H_1 = 0.4, A^H_0 = 1.47 + 0.95 * 0.5 * 0.4 = 1.66; G_0 = 1.76, G_1 = 1.0
    kw = dict(high_level_gamma=0.95, high_level_lam=0.5)
    adv, ret = check("bilevel_gae", design_example(), gamma=1.0, lam=1.0, **kw)
    torch.testing.assert_close(adv[0], t(1.66, 1.56, 1.46, 1.36, 1.26, 0.4, 0.3, 0.2, 0.1, 0.0))
    torch.testing.assert_close(ret[0], t(*[1.76] * 5, *[1.0] * 5))
    # turn_gae: every token of turn k gets A^H_k, return A^H_k + V(s_k)
    adv, ret = check("turn_gae", design_example(), **kw)
    torch.testing.assert_close(adv[0], t(*[1.66] * 5, *[0.4] * 5))
    torch.testing.assert_close(ret[0], t(*[1.76] * 5, *[1.0] * 5))


def test_design_example_gae_turn_gae_and_weighted_mix():
    inp = design_example()
    a_turn, r_turn = check("turn_gae", inp, high_level_gamma=0.95, high_level_lam=1.0)
    torch.testing.assert_close(a_turn[0], t(*[1.85] * 5, *[0.4] * 5))  # A^H from the lam_H = 1 example
    torch.testing.assert_close(r_turn[0], t(*[1.95] * 5, *[1.0] * 5))
    a_tok, r_tok = check("gae", inp, gamma=1.0, lam=1.0)
    # gamma = lam = 1: A_t = (sum of rewards from t on) - V_t, return = that sum: 2 on turn 0, 1 on turn 1
    future = t(*[2.0] * 5, *[1.0] * 5)
    torch.testing.assert_close(a_tok[0], future - inp.values[0])
    torch.testing.assert_close(r_tok[0], future)
    for w, (want_adv, want_ret) in {0.0: (a_tok, r_tok), 1.0: (a_turn, r_turn)}.items():
        a, r = check("weighted_gae", inp, turn_level_weight=w, high_level_gamma=0.95, high_level_lam=1.0)
        assert torch.equal(a, want_adv) and torch.equal(r, want_ret)  # exactly the pure methods at w = 0 and 1
    a, r = check("weighted_gae", inp, turn_level_weight=0.25, high_level_gamma=0.95, high_level_lam=1.0)
    torch.testing.assert_close(a, 0.75 * a_tok + 0.25 * a_turn)
    torch.testing.assert_close(r, 0.75 * r_tok + 0.25 * r_turn)


def test_turn_gae_uses_the_value_before_the_turn_not_at_its_end():
    # turn 0 = tokens 0, 1; env at 2; turn 1 = tokens 3, 4, 5; env 6. Reward 1 at e_1 = 5. gamma_H = 0.5, lam_H = 1.
    tid, mask = tokens([0, 0, -1, 1, 1, 1, -1])
    r = t(0, 0, 0, 0, 0, 1, 0)[None]
    v = t(0.2, 0.9, 5.0, 0.5, 0.1, 0.3, 5.0)[None]
    inp = AdvantageInputs(r, mask, tid, values=v)
    adv, ret = check("turn_gae", inp, high_level_gamma=0.5, high_level_lam=1.0)
    # V(s_0) = 0.2, V(s_1) = 0.5: delta_1 = 1 - 0.5 = 0.5, delta_0 = 0 + 0.5 * 0.5 - 0.2 = 0.05
    # A^H_1 = 0.5, A^H_0 = 0.05 + 0.5 * 0.5 = 0.3; returns A^H + V(s_k): 0.5 and 1.0
    torch.testing.assert_close(adv[0], t(0.3, 0.3, 0, 0.5, 0.5, 0.5, 0))
    torch.testing.assert_close(ret[0], t(0.5, 0.5, 0, 1.0, 1.0, 1.0, 0))
    # with V(e_k) (0.9, 0.3) instead it would be A^H_1 = 1 - 0.3 = 0.7, A^H_0 = 0.5 * 0.3 - 0.9 + 0.5 * 0.7 = -0.4
    assert abs(float(adv[0, 0]) - (-0.4)) > 0.5
    # values past each turn's first token are never read
    v2 = v.clone()
    v2[0, [1, 4, 5]] = t(-7.0, 8.0, 9.0)
    adv2, ret2 = check("turn_gae", replace(inp, values=v2), high_level_gamma=0.5, high_level_lam=1.0)
    assert torch.equal(adv, adv2) and torch.equal(ret, ret2)


def test_zero_reward_middle_turn_is_still_a_turn():
    # 3 turns of 2 tokens with env gaps; rewards 1 and 2 at e_0 and e_2, 0 on the middle turn. V = 0.5 everywhere.
    tid, mask = tokens([0, 0, -1, 1, 1, -1, 2, 2])
    r = torch.zeros(1, 8, dtype=D)
    r[0, 1], r[0, 7] = 1.0, 2.0
    inp = AdvantageInputs(r, mask, tid, values=torch.full((1, 8), 0.5, dtype=D))
    adv, ret = check("turn_gae", inp, high_level_gamma=0.5, high_level_lam=1.0)
    # delta_2 = 2 - 0.5 = 1.5; delta_1 = 0 + 0.5 * 0.5 - 0.5 = -0.25; delta_0 = 1 + 0.25 - 0.5 = 0.75
    # A_2 = 1.5, A_1 = -0.25 + 0.5 * 1.5 = 0.5, A_0 = 0.75 + 0.5 * 0.5 = 1.0; returns A + 0.5
    torch.testing.assert_close(adv[0], t(1.0, 1.0, 0, 0.5, 0.5, 0, 1.5, 1.5))
    torch.testing.assert_close(ret[0], t(1.5, 1.5, 0, 1.0, 1.0, 0, 2.0, 2.0))
    # reward-to-go with gamma_H = 0.5: turn 2: 2; turn 1: 0 + 0.5 * 2 = 1; turn 0: 1 + 0.5 * 1 = 1.5
    _, rtg = check("turn_gae", inp, high_level_gamma=0.5, return_mode="reward_to_go")
    torch.testing.assert_close(rtg[0], t(1.5, 1.5, 0, 1.0, 1.0, 0, 2.0, 2.0))


def penalty_example():
    """Turn 0 = tokens 0, 1; env at 2; turn 1 = tokens 3, 4. Env rewards 1 at e_0 = 1 and 0.5 at e_1 = 4; KL-like
    penalties -0.1, -0.2 | -0.1, 0.0 on the model tokens; garbage (3, 5, 9) on the env token."""
    tid, mask = tokens([0, 0, -1, 1, 1])
    return AdvantageInputs(
        token_rewards=t(0, 1.0, 3.0, 0, 0.5)[None], response_mask=mask, turn_ids=tid,
        values=t(0.5, 0.4, 9.0, 0.3, 0.2)[None], token_penalties=t(-0.1, -0.2, 5.0, -0.1, 0.0)[None],
    )


def test_turn_gae_sums_penalties_into_the_turn_reward():
    adv, ret = check("turn_gae", penalty_example(), high_level_gamma=0.5, high_level_lam=1.0)
    # r_0 = 1 - 0.1 - 0.2 = 0.7, r_1 = 0.5 - 0.1 + 0 = 0.4; V(s_0) = 0.5, V(s_1) = 0.3
    # delta_1 = 0.4 - 0.3 = 0.1; delta_0 = 0.7 + 0.5 * 0.3 - 0.5 = 0.35; A^H_0 = 0.35 + 0.5 * 0.1 = 0.4
    torch.testing.assert_close(adv[0], t(0.4, 0.4, 0, 0.1, 0.1))
    torch.testing.assert_close(ret[0], t(0.9, 0.9, 0, 0.4, 0.4))


def test_bilevel_gae_applies_penalties_at_the_low_level_only():
    inp = penalty_example()
    adv, ret = check("bilevel_gae", inp, gamma=1.0, lam=0.5, high_level_gamma=0.5, high_level_lam=1.0)
    # high level on the env rewards only: r_0 = 1, r_1 = 0.5. delta_1 = 0.5 - 0.3 = 0.2;
    # delta_0 = 1 + 0.5 * 0.3 - 0.5 = 0.65; A^H_0 = 0.65 + 0.5 * 0.2 = 0.75. G_0 = 0.75 + 0.5 = 1.25, G_1 = 0.5.
    # low level, gamma = 1, lam = 0.5:
    #   e_0 = 1: delta = p_1 + G_0 - V_1 = -0.2 + 1.25 - 0.4 = 0.65 = A_1
    #   0: delta = p_0 + V_1 - V_0 = -0.1 + 0.4 - 0.5 = -0.2; A_0 = -0.2 + 0.5 * 0.65 = 0.125
    #   e_1 = 4: delta = 0 + 0.5 - 0.2 = 0.3 = A_4
    #   3: delta = -0.1 + 0.2 - 0.3 = -0.2; A_3 = -0.2 + 0.5 * 0.3 = -0.05
    torch.testing.assert_close(adv[0], t(0.125, 0.65, 0, -0.05, 0.3))
    torch.testing.assert_close(ret[0], t(0.625, 1.05, 0, 0.25, 0.5))  # A + V
    # without penalties the high level is the same (G_k unchanged) and A_t = the same sums without the p terms
    adv0, _ = check("bilevel_gae", replace(inp, token_penalties=None), gamma=1.0, lam=0.5, high_level_gamma=0.5)
    # A_1 = 0.85, A_0 = -0.1 + 0.5 * 0.85 = 0.325, A_4 = 0.3, A_3 = -0.1 + 0.15 = 0.05
    torch.testing.assert_close(adv0[0], t(0.325, 0.85, 0, 0.05, 0.3))


def test_gae_adds_penalties_to_each_model_tokens_reward():
    adv, ret = check("gae", penalty_example(), gamma=1.0, lam=1.0)
    # per-token reward r + p on model tokens: -0.1, 0.8 | -0.1, 0.5 (the env token is skipped entirely)
    # gamma = lam = 1: return = the sum from t on = 1.1, 1.2 | 0.4, 0.5; A = return - V
    torch.testing.assert_close(ret[0], t(1.1, 1.2, 0, 0.4, 0.5))
    torch.testing.assert_close(adv[0], t(0.6, 0.8, 0, 0.1, 0.3))


def bootstrap_example():
    """Two copies of one row, the first truncated: turn 0 = tokens 0, 1; env 2; turn 1 = token 3; env 4 (a cut
    row ends inside an observation); pad 5. Reward 1 at e_0 = 1; garbage 9 / 7 off the mask; V after the last
    real token (``bootstrap_values``) = 0.8."""
    tid = torch.tensor([[0, 0, -1, 1, -1, -1]] * 2)
    return AdvantageInputs(
        token_rewards=t(0, 1.0, 9.0, 0, 9.0, 9.0)[None].repeat(2, 1), response_mask=(tid >= 0).long(), turn_ids=tid,
        values=t(0.2, 0.3, 7.0, 0.6, 7.0, 7.0)[None].repeat(2, 1), truncated=torch.tensor([True, False]),
        bootstrap_values=t(0.8, 0.8),
    )


def test_truncated_rows_bootstrap_from_bootstrap_values():
    inp = bootstrap_example()
    adv, ret = check("turn_gae", inp, high_level_gamma=0.5, high_level_lam=1.0)
    # V(s_0) = 0.2, V(s_1) = 0.6. Truncated: delta_1 = 0 + 0.5 * 0.8 - 0.6 = -0.2; delta_0 = 1 + 0.5 * 0.6 - 0.2 = 1.1;
    # A^H_0 = 1.1 + 0.5 * (-0.2) = 1.0. Ended: delta_1 = -0.6; A^H_0 = 1.1 + 0.5 * (-0.6) = 0.8.
    torch.testing.assert_close(adv, t([1.0, 1.0, 0, -0.2, 0, 0], [0.8, 0.8, 0, -0.6, 0, 0]))
    torch.testing.assert_close(ret, t([1.2, 1.2, 0, 0.4, 0, 0], [1.0, 1.0, 0, 0.0, 0, 0]))
    adv, ret = check("gae", inp, gamma=0.5, lam=1.0)
    # steps 0, 1, 3 (env skipped). Truncated: delta_3 = 0.5 * 0.8 - 0.6 = -0.2, delta_1 = 1 + 0.5 * 0.6 - 0.3 = 1.0,
    # delta_0 = 0.5 * 0.3 - 0.2 = -0.05; A_3 = -0.2, A_1 = 1.0 + 0.5 * (-0.2) = 0.9, A_0 = -0.05 + 0.5 * 0.9 = 0.4.
    # Ended: delta_3 = -0.6; A_3 = -0.6, A_1 = 1.0 - 0.3 = 0.7, A_0 = -0.05 + 0.35 = 0.3.
    torch.testing.assert_close(adv, t([0.4, 0.9, 0, -0.2, 0, 0], [0.3, 0.7, 0, -0.6, 0, 0]))
    torch.testing.assert_close(ret, t([0.6, 1.2, 0, 0.4, 0, 0], [0.5, 1.0, 0, 0.0, 0, 0]))
    adv, ret = check("bilevel_gae", inp, gamma=1.0, lam=1.0, high_level_gamma=0.5, high_level_lam=1.0)
    # G_k = A^H_k + V(s_k) from turn_gae above: truncated G = (1.2, 0.4), ended G = (1.0, 0.0); A_t = G_k - V_t
    torch.testing.assert_close(adv, t([1.0, 0.9, 0, -0.2, 0, 0], [0.8, 0.7, 0, -0.6, 0, 0]))
    torch.testing.assert_close(ret, t([1.2, 1.2, 0, 0.4, 0, 0], [1.0, 1.0, 0, 0.0, 0, 0]))
    # bootstrap_values is read only on truncated rows
    other = replace(inp, bootstrap_values=t(0.8, -123.0))
    for name in ("gae", "turn_gae", "bilevel_gae", "weighted_gae"):
        a1, r1 = compute_advantage(name, inp, gamma=0.5, high_level_gamma=0.5)
        a2, r2 = compute_advantage(name, other, gamma=0.5, high_level_gamma=0.5)
        assert torch.equal(a1, a2) and torch.equal(r1, r2), name
    torch.testing.assert_close(inp.bootstrap(), t(0.8, 0.0))
    torch.testing.assert_close(replace(inp, truncated=None).bootstrap(), t(0.0, 0.0))


def test_truncated_rows_without_bootstrap_values_are_rejected():
    inp = replace(bootstrap_example(), bootstrap_values=None)
    for name in ("gae", "turn_gae", "bilevel_gae", "weighted_gae"):
        with pytest.raises(ValueError, match="bootstrap_values is None but some rows are truncated"):
            compute_advantage(name, inp)
        compute_advantage(name, replace(inp, truncated=torch.tensor([False, False])))  # nothing to bootstrap: fine
    compute_advantage("reinforce_pp", inp)  # critic-free estimators never bootstrap


def test_gae_skips_env_tokens_unless_told_otherwise():
    # model tokens at 0, 1, 4 (env at 2, 3, pad at 5); gamma = 0.5, lam = 1; the row ended (no bootstrap)
    tid, mask = tokens([0, 0, -1, -1, 1, -1])
    r = t(0.0, 1.0, 9.0, 9.0, 2.0, 9.0)[None]  # 9s off the mask are ignored
    v = t(1.0, 2.0, 7.0, 7.0, 4.0, 8.0)[None]
    inp = AdvantageInputs(r, mask, tid, values=v, truncated=torch.tensor([False]))
    adv, ret = check("gae", inp, gamma=0.5, lam=1.0)
    # deltas: p=4: 2 - 4 = -2; p=1: 1 + 0.5 * 4 - 2 = 1; p=0: 0 + 0.5 * 2 - 1 = 0
    # A_4 = -2, A_1 = 1 + 0.5 * (-2) = 0, A_0 = 0 + 0.5 * 0 = 0
    torch.testing.assert_close(adv[0], t(0.0, 0.0, 0, 0, -2.0, 0))
    torch.testing.assert_close(ret[0], t(1.0, 2.0, 0, 0, 2.0, 0))
    # skip_env_tokens=False: env tokens 2, 3 are steps with reward 0 and their own values (7, 7); the pad is not
    adv_s, _ = check("gae", inp, gamma=0.5, lam=1.0, skip_env_tokens=False)
    # A_4 = -2; A_3 = 0.5 * 4 - 7 + 0.5 * (-2) = -6; A_2 = 0.5 * 7 - 7 + 0.5 * (-6) = -6.5
    # A_1 = 1 + 0.5 * 7 - 2 + 0.5 * (-6.5) = -0.75; A_0 = 0.5 * 2 - 1 + 0.5 * (-0.75) = -0.375
    torch.testing.assert_close(adv_s[0], t(-0.375, -0.75, 0, 0, -2.0, 0))
    # reward-to-go over model tokens, gamma = 0.5: 2; 1 + 0.5 * 2 = 2; 0 + 0.5 * 2 = 1
    _, rtg = check("gae", inp, gamma=0.5, lam=1.0, return_mode="reward_to_go")
    torch.testing.assert_close(rtg[0], t(1.0, 2.0, 0, 0, 2.0, 0))


# ---- critic-free ----------------------------------------------------------------------------------------------


def test_reinforce_pp_hand_example():
    # row 0: model tokens at 0, 1 (rewards 2.5, 1), env at 2, 3; row 1 (left-padded): pad 0, model 1 (reward 2.5),
    # env 2, model 3 (reward 1). Rewards 9 off the mask are ignored. gamma = 0.5, no whitening eps.
    tid = torch.tensor([[0, 0, -1, -1], [-1, 0, -1, 1]])
    r = t([2.5, 1.0, 9.0, 9.0], [9.0, 2.5, 9.0, 1.0])
    inp = AdvantageInputs(r, (tid >= 0).long(), tid)
    adv, ret = check("reinforce_pp", inp, gamma=0.5, eps=0.0)
    # reward-to-go over model tokens only: G = 1 at each row's last model token, 2.5 + 0.5 * 1 = 3 before it
    # (in row 1 the env token 2 is not a discount step; counting it would give 2.5 + 0.25 * 1 = 2.75)
    torch.testing.assert_close(ret, t([3.0, 1.0, 0, 0], [0, 3.0, 0, 1.0]))
    # whitened over the batch's 4 model tokens {3, 1, 3, 1}: mean 2, population std 1 -> +-1
    # (the unbiased std sqrt(4/3) would give +-0.866)
    torch.testing.assert_close(adv, t([1.0, -1.0, 0, 0], [0, 1.0, 0, -1.0]))
    # penalties are part of the per-token reward: -0.5 on row 0's first token gives G = 2.5 there -> mean 1.875
    pen = t([-0.5, 0, 0, 0], [0, 0, 0, 0])
    _, ret_p = check("reinforce_pp", replace(inp, token_penalties=pen), gamma=0.5, eps=0.0)
    torch.testing.assert_close(ret_p, t([2.5, 1.0, 0, 0], [0, 3.0, 0, 1.0]))


def test_grpo_and_rloo_hand_example():
    tid = torch.tensor([[0, -1], [0, -1], [0, 0], [0, -1]])
    r = t([1.0, 0], [0.0, 0], [0.0, 3.0], [5.0, 0])
    inp = AdvantageInputs(r, (tid >= 0).long(), tid, group_ids=torch.tensor([0, 0, 0, 9]))
    adv, ret = check("grpo", inp, eps=0.0)
    # group 0 totals [1, 0, 3]: mean 4/3, unbiased std sqrt(((-1/3)^2 + (4/3)^2 + (5/3)^2) / 2) = sqrt(7/3);
    # group 9 is a singleton -> 0
    s = (7 / 3) ** 0.5
    torch.testing.assert_close(adv[:, 0], t(-1 / 3 / s, -4 / 3 / s, 5 / 3 / s, 0.0))
    assert torch.equal(adv, ret)
    adv, _ = check("grpo", inp, norm_by_std=False)
    torch.testing.assert_close(adv[:, 0], t(-1 / 3, -4 / 3, 5 / 3, 0.0))
    adv, _ = check("rloo", inp)
    # total minus the mean of the others: 1 - (0 + 3) / 2, 0 - (1 + 3) / 2, 3 - (1 + 0) / 2; singleton -> 0
    torch.testing.assert_close(adv[:, 0], t(1 - 1.5, 0 - 2.0, 3 - 0.5, 0.0))
    assert float(adv[2, 1]) == 2.5 and float(adv[0, 1]) == 0.0
    same = AdvantageInputs(torch.ones(3, 2, dtype=D), torch.ones(3, 2, dtype=torch.long),
                           torch.zeros(3, 2, dtype=torch.long), group_ids=torch.zeros(3, dtype=torch.long))
    assert bool((check("grpo", same)[0] == 0).all())  # equal rewards -> exactly 0


def test_failed_rows_leave_the_group_statistics():
    # one group, totals [1, 0, 0]; the third row's env raised
    tid = torch.zeros(3, 1, dtype=torch.long)
    inp = AdvantageInputs(t([1.0], [0.0], [0.0]), torch.ones(3, 1, dtype=torch.long), tid,
                          group_ids=torch.zeros(3, dtype=torch.long), failed=torch.tensor([False, False, True]))
    adv, _ = check("grpo", inp, eps=0.0)
    # valid rows [1, 0]: mean 0.5, unbiased std sqrt(0.5^2 * 2 / 1) = 0.7071 -> +-0.7071; the failed row gets 0
    torch.testing.assert_close(adv[:, 0], t(0.5 ** 0.5, -(0.5 ** 0.5), 0.0))
    # counting the failed row would give [1, 0, 0]: mean 1/3, std sqrt(1/3) -> [1.1547, -0.5774, -0.5774]
    adv_all, _ = check("grpo", replace(inp, failed=None), eps=0.0)
    torch.testing.assert_close(adv_all[:, 0], t(2 / 3, -1 / 3, -1 / 3) / (1 / 3) ** 0.5)
    adv, _ = check("rloo", inp)
    # rloo among the valid rows: 1 - 0 = 1, 0 - 1 = -1 (with the failed row: 1 - 0 = 1, 0 - 0.5 = -0.5)
    torch.testing.assert_close(adv[:, 0], t(1.0, -1.0, 0.0))
    # ms_grpo: outcomes [1, 0, (0)] over the valid rows; step rewards constant -> 0
    ms = replace(inp, step_rewards=t([0.3], [0.3], [5.0]), outcome_rewards=t(1.0, 0.0, 0.0),
                 tool_results=torch.ones(3, 1, dtype=torch.bool))
    adv, _ = check("ms_grpo", ms, eps=0.0)
    torch.testing.assert_close(adv[:, 0], t(0.5 ** 0.5, -(0.5 ** 0.5), 0.0))


def test_ms_grpo_and_ms_po_three_trajectories_by_hand():
    # 3 trajectories of one group, 2 turns each (tokens 0-1 and 3-4, env at 2 and 5), eps = 1e-4 (outside the sqrt)
    mask = torch.tensor([[1, 1, 0, 1, 1, 0]] * 3)
    inp = AdvantageInputs(
        token_rewards=torch.zeros(3, 6, dtype=D), response_mask=mask, turn_ids=torch.tensor([[0, 0, -1, 1, 1, -1]] * 3),
        group_ids=torch.zeros(3, dtype=torch.long),
        step_rewards=t([0.7, 0.0], [0.2, 0.0], [0.0, 0.0]),
        outcome_rewards=t(1.0, 0.2, 0.0),
        tool_results=torch.tensor([[True, False]] * 3),  # every row searched at turn 0 (row 2 found nothing)
    )
    adv, ret = check("ms_grpo", inp, eps=1e-4)
    # Ahat(R^O): R^O = [1.0, 0.2, 0.0], mean 0.4, deviations [0.6, -0.2, -0.4],
    #   unbiased std = sqrt((0.36 + 0.04 + 0.16) / 2) = sqrt(0.28) = 0.529150; / (0.529150 + 1e-4) = 0.529250
    #   -> [1.133679, -0.377893, -0.755786]
    # Ahat_0(R^T): R^T_0 = [0.7, 0.2, 0.0], mean 0.3, deviations [0.4, -0.1, -0.3],
    #   unbiased std = sqrt((0.16 + 0.01 + 0.09) / 2) = sqrt(0.13) = 0.360555; / 0.360655
    #   -> [1.109093, -0.277273, -0.831820]
    # turn 0 = Ahat(R^O) + 1.0 * Ahat_0(R^T) = [2.242772, -0.655166, -1.587606]
    # turn 1: R^T_1 = [0, 0, 0] is constant -> Ahat_1 = 0, so turn 1 = Ahat(R^O) = [1.133679, -0.377893, -0.755786]
    torch.testing.assert_close(adv[:, 0], t(2.2428, -0.6552, -1.5876), atol=1e-4, rtol=0)
    torch.testing.assert_close(adv[:, 3], t(1.1337, -0.3779, -0.7558), atol=1e-4, rtol=0)
    torch.testing.assert_close(adv[:, 1], adv[:, 0], atol=0, rtol=0)  # every token of a turn alike
    assert bool((adv[:, [2, 5]] == 0).all()) and torch.equal(adv, ret)
    # step_advantage_coef scales the step term only: turn 0 = Ahat(R^O) + 0.5 * Ahat_0(R^T) = [1.688226, ...]
    adv_half, _ = check("ms_grpo", inp, eps=1e-4, step_advantage_coef=0.5)
    torch.testing.assert_close(adv_half[:, 0], t(1.6882, -0.5165, -1.1717), atol=1e-4, rtol=0)
    # ms_po, d = 1: turn 0 (up to the tool result) normalises R^T + R^O = [1.7, 0.4, 0.0] (R^T = R^T_0 + R^T_1;
    #   mean 0.7, deviations [1.0, -0.3, -0.7], unbiased std sqrt((1 + 0.09 + 0.49) / 2) = sqrt(0.79) = 0.888819)
    #   -> [1.124961, -0.337488, -0.787473]; turn 1 (after it) gets Ahat(R^O) as above
    adv_po, _ = check("ms_po", inp, eps=1e-4, discount_factor=1.0)
    torch.testing.assert_close(adv_po[:, 0], t(1.1250, -0.3375, -0.7875), atol=1e-4, rtol=0)
    torch.testing.assert_close(adv_po[:, 3], adv[:, 3])


def test_gigpo_hand_example():
    # one group of two trajectories, 2 turns of one token each; both first turns saw "start" (one step group), the
    # second turns saw different observations (singleton step groups -> 0). gamma = 0.5.
    tid = torch.tensor([[0, 1], [0, 1]])
    r = t([0.0, 1.0], [1.0, 0.0])
    inp = AdvantageInputs(r, torch.ones(2, 2, dtype=torch.long), tid, group_ids=torch.tensor([4, 4]),
                          turn_obs_keys=[["start", "a"], ["start", "b"]])
    adv, _ = check("gigpo", inp, gamma=0.5, step_advantage_weight=2.0, eps=0.0)
    # totals equal (1, 1) -> episode term 0. Turn-0 discounted returns: 0 + 0.5 * 1 = 0.5 and 1 + 0.5 * 0 = 1.0:
    # mean 0.75, unbiased std sqrt(2 * 0.25^2 / 1) = 0.3536 -> Ahat = -/+ 1/sqrt(2); times the weight 2
    h = 2 ** -0.5
    torch.testing.assert_close(adv, t([-2 * h, 0.0], [2 * h, 0.0]))
    # a penalty of -1 on row 1's first token: totals (1, 0) -> episode term +-1/sqrt(2) (std of (1, 0) = 1/sqrt(2));
    # turn-0 returns (0.5, 0.0) -> step term +-1/sqrt(2), times 2
    pen = t([0.0, 0.0], [-1.0, 0.0])
    adv, _ = check("gigpo", replace(inp, token_penalties=pen), gamma=0.5, step_advantage_weight=2.0, eps=0.0)
    torch.testing.assert_close(adv, t([h + 2 * h, h], [-h - 2 * h, -h]))
