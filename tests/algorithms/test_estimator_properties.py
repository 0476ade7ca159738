"""Invariances, identities between estimators, edge cases and error messages of ``compute_advantage``."""

import pytest
import torch
from estimator_helpers import GROUP_FAILED_AWARE, D, replace, select_rows

from ragen.algorithms import ADVANTAGE_ESTIMATORS, AdvantageInputs, compute_advantage, register_estimator
from ragen.algorithms.reference import random_inputs

ALL = sorted(ADVANTAGE_ESTIMATORS)
PARAMS = dict(gamma=0.9, lam=0.8, high_level_gamma=0.7, high_level_lam=0.6, turn_level_weight=0.3,
              step_advantage_coef=0.5, discount_factor=0.7, step_advantage_weight=0.4)
NAN = float("nan")


def rich_batch(seed=2, B=12, **kw):
    return random_inputs(B, seed=seed, max_turns=4, dense_reward_frac=0.3, penalties=True, failed_frac=0.25, **kw)


def assert_same(a, b):
    torch.testing.assert_close(a[0], b[0], atol=1e-12, rtol=0)
    torch.testing.assert_close(a[1], b[1], atol=1e-12, rtol=0)


# ---- what is (not) read -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_nothing_off_the_model_tokens_is_read(name):
    # NaN in every value / reward / penalty off the model tokens, in bootstrap_values of rows that ended and in
    # step rewards past a row's last turn: none of it may reach the outputs
    inp = rich_batch()
    off = inp.response_mask == 0
    past_last_turn = torch.arange(inp.step_rewards.shape[1])[None, :] >= inp.num_turns[:, None]
    noisy = replace(
        inp,
        values=inp.values.masked_fill(off, NAN),
        token_rewards=inp.token_rewards.masked_fill(off, NAN),
        token_penalties=inp.token_penalties.masked_fill(off, NAN),
        bootstrap_values=inp.bootstrap_values.masked_fill(~inp.truncated, NAN),
        step_rewards=inp.step_rewards.masked_fill(past_last_turn, NAN),
        tool_results=inp.tool_results | past_last_turn,
    )
    assert bool(past_last_turn.any()) and bool((~inp.truncated).any())
    assert_same(compute_advantage(name, inp, **PARAMS), compute_advantage(name, noisy, **PARAMS))


def test_gae_without_env_skipping_reads_values_between_model_tokens_only():
    inp = rich_batch(seed=3)
    m = inp.response_mask > 0
    inside = (m.cumsum(dim=1) > 0) & (m.flip(1).cumsum(dim=1).flip(1) > 0)  # first..last model token of a row
    between = inside & ~m  # env tokens between a row's model tokens
    assert bool(between.any())
    kw = dict(gamma=0.9, lam=0.8, skip_env_tokens=False)
    base = compute_advantage("gae", inp, **kw)
    # prompt / trailing env / pad values, and rewards and penalties on any env token: never read
    outside = replace(inp, values=inp.values.masked_fill(~inside, NAN), token_rewards=inp.token_rewards.masked_fill(
        ~m, NAN), token_penalties=inp.token_penalties.masked_fill(~m, NAN))
    assert_same(base, compute_advantage("gae", outside, **kw))
    # values between model tokens are steps of the recursion: changing them changes exactly the rows that have any
    shifted = compute_advantage("gae", replace(inp, values=inp.values + between * 0.5), **kw)
    changed = (shifted[0] - base[0]).abs().amax(dim=1) > 1e-6
    assert changed.tolist() == between.any(dim=1).tolist()
    # ... and with env skipping they are not read
    skip = compute_advantage("gae", inp, gamma=0.9, lam=0.8)
    assert_same(skip, compute_advantage("gae", replace(inp, values=inp.values + between * 0.5), gamma=0.9, lam=0.8))


def test_turn_gae_reads_values_only_at_each_turns_first_token():
    inp = rich_batch(seed=4)
    m = inp.response_mask > 0
    prev_tid = torch.nn.functional.pad(inp.turn_ids, (1, 0), value=-1)[:, :-1]
    # a model token is a turn's first one when no earlier model token has its id: ids grow, so compare with the max
    # of the earlier ids
    earlier_max = torch.cummax(prev_tid, dim=1).values
    first = m & (inp.turn_ids > earlier_max)
    assert bool((m & ~first).any())
    kw = dict(high_level_gamma=0.7, high_level_lam=0.6)
    noisy = replace(inp, values=inp.values.masked_fill(~first, NAN))
    assert_same(compute_advantage("turn_gae", inp, **kw), compute_advantage("turn_gae", noisy, **kw))


# ---- symmetries ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_permuting_rows_permutes_outputs(name):
    inp = rich_batch(seed=4)
    perm = torch.randperm(inp.batch_size, generator=torch.Generator().manual_seed(0))
    permuted = select_rows(inp, perm.tolist())
    permuted.group_ids = permuted.group_ids * 7 + 3  # group labels themselves do not matter either
    adv, ret = compute_advantage(name, inp, **PARAMS)
    assert_same((adv[perm], ret[perm]), compute_advantage(name, permuted, **PARAMS))


def roll_rows(x: torch.Tensor, shifts: list[int]) -> torch.Tensor:
    return torch.stack([torch.roll(row, s) for row, s in zip(x, shifts, strict=True)])


@pytest.mark.parametrize("name", ALL)
def test_left_and_right_padding_and_pad_width_give_the_same_outputs(name):
    right = random_inputs(10, seed=6, left_pad_frac=0.0, penalties=True, failed_frac=0.2)
    T = right.token_rewards.shape[1]
    shifts = (T - right.attention_mask.sum(dim=1)).tolist()
    assert max(shifts) > 0
    token_fields = ("token_rewards", "response_mask", "turn_ids", "values", "attention_mask", "token_penalties")
    left = replace(right, **{f: roll_rows(getattr(right, f), shifts) for f in token_fields})

    def widen(inp, extra=7):  # extra pad columns on the left, with garbage values and rewards
        pad = {f: torch.full((inp.batch_size, extra), fill, dtype=getattr(inp, f).dtype)
               for f, fill in (("token_rewards", 5.0), ("response_mask", 0), ("turn_ids", -1), ("values", -3.0),
                               ("attention_mask", 0), ("token_penalties", 2.0))}
        return replace(inp, **{f: torch.cat([pad[f], getattr(inp, f)], dim=1) for f in token_fields})

    for options in ({}, dict(skip_env_tokens=False)) if name in ("gae", "weighted_gae") else ({},):
        adv, ret = compute_advantage(name, right, **PARAMS, **options)
        want = (roll_rows(adv, shifts), roll_rows(ret, shifts))
        assert_same(want, compute_advantage(name, left, **PARAMS, **options))
        adv_w, ret_w = compute_advantage(name, widen(left), **PARAMS, **options)
        assert bool((adv_w[:, :7] == 0).all()) and bool((ret_w[:, :7] == 0).all())
        assert_same(want, (adv_w[:, 7:], ret_w[:, 7:]))


@pytest.mark.parametrize("name", ALL)
def test_batches_without_model_tokens_give_zeros(name):
    for B, T in ((0, 10), (2, 40), (3, 0)):
        inp = AdvantageInputs(
            token_rewards=torch.ones(B, T), response_mask=torch.zeros(B, T, dtype=torch.long),
            turn_ids=torch.full((B, T), -1), values=torch.randn(B, T), group_ids=torch.zeros(B, dtype=torch.long),
            truncated=torch.ones(B, dtype=torch.bool), bootstrap_values=torch.ones(B),
            step_rewards=torch.zeros(B, 0), outcome_rewards=torch.ones(B), turn_obs_keys=[[] for _ in range(B)],
            tool_results=torch.zeros(B, 0, dtype=torch.bool),
            token_penalties=torch.ones(B, T), failed=torch.zeros(B, dtype=torch.bool),
        )
        for options in ({}, dict(lam=0.9, skip_env_tokens=False), dict(return_mode="reward_to_go"), dict(whiten=True)):
            adv, ret = compute_advantage(name, inp, **options)
            assert adv.shape == ret.shape == (B, T)
            assert bool((adv == 0).all()) and bool((ret == 0).all())


# ---- identities between estimators --------------------------------------------------------------------------


@pytest.mark.parametrize("name", GROUP_FAILED_AWARE)
def test_a_failed_row_counts_as_if_it_were_not_in_the_batch(name):
    inp = rich_batch(seed=7, B=15)
    failed = inp.failed.tolist()
    kept = [b for b in range(inp.batch_size) if not failed[b]]
    assert 0 < len(kept) < inp.batch_size
    adv, ret = compute_advantage(name, inp, **PARAMS)
    adv_k, ret_k = compute_advantage(name, replace(select_rows(inp, kept), failed=None), **PARAMS)
    assert_same((adv[kept], ret[kept]), (adv_k, ret_k))
    assert bool((adv[inp.failed] == 0).all()) and bool((ret[inp.failed] == 0).all())


def test_weighted_gae_is_exactly_gae_at_0_and_turn_gae_at_1():
    inp = rich_batch(seed=8)
    for skip in (True, False):
        kw = dict(gamma=0.9, lam=0.8, high_level_gamma=0.7, high_level_lam=0.6, skip_env_tokens=skip)
        for mode in ("adv_plus_value", "reward_to_go"):
            gae = compute_advantage("gae", inp, return_mode=mode, **kw)
            turn = compute_advantage("turn_gae", inp, return_mode=mode, **kw)
            w0 = compute_advantage("weighted_gae", inp, turn_level_weight=0.0, return_mode=mode, **kw)
            w1 = compute_advantage("weighted_gae", inp, turn_level_weight=1.0, return_mode=mode, **kw)
            assert torch.equal(w0[0], gae[0]) and torch.equal(w0[1], gae[1])
            assert torch.equal(w1[0], turn[0]) and torch.equal(w1[1], turn[1])


def test_single_turn_bilevel_equals_gae():
    # one turn: G_0 = r_0 + gamma_H * bootstrap, so with gamma = gamma_H the low level is token GAE (penalties at
    # their tokens in both)
    inp = random_inputs(8, seed=5, max_turns=1, model_len=(3, 12), truncated_frac=0.5, penalties=True)
    kw = dict(gamma=0.9, lam=0.7, high_level_gamma=0.9, high_level_lam=0.3)
    assert_same(compute_advantage("bilevel_gae", inp, **kw), compute_advantage("gae", inp, **kw))


def test_one_token_turns_make_turn_gae_token_gae():
    # each turn one model token: turn k is token p_k and V(s_k) = V(p_k), so turn_gae = gae with (gamma, lam) =
    # (gamma_H, lam_H); without penalties bilevel_gae gives A_t = G_k - V_t = A^H_k as well
    inp = random_inputs(10, seed=9, max_turns=6, model_len=(1, 1), truncated_frac=0.5, penalties=True)
    turn = compute_advantage("turn_gae", inp, high_level_gamma=0.8, high_level_lam=0.6)
    assert_same(turn, compute_advantage("gae", inp, gamma=0.8, lam=0.6))
    plain = replace(inp, token_penalties=None)
    assert_same(compute_advantage("turn_gae", plain, high_level_gamma=0.8, high_level_lam=0.6),
                compute_advantage("bilevel_gae", plain, gamma=0.3, lam=0.2, high_level_gamma=0.8, high_level_lam=0.6))


def test_whiten_uses_population_variance():
    inp = rich_batch(seed=1)
    adv_raw, ret_raw = compute_advantage("gae", inp)
    adv, ret = compute_advantage("gae", inp, whiten=True, eps=0.0)
    m = inp.response_mask.bool()
    x = adv_raw[m]
    pop_std = (x - x.mean()).square().mean().sqrt()
    torch.testing.assert_close(adv[m], (x - x.mean()) / pop_std)
    assert abs(float(adv[m].mean())) < 1e-12
    assert abs(float(adv[m].square().mean()) - 1.0) < 1e-12  # population variance is exactly 1
    assert float(adv[m].var(unbiased=True)) > 1.0  # the unbiased estimate is n / (n - 1)
    assert bool((adv[~m] == 0).all())
    assert torch.equal(ret, ret_raw)  # returns are never whitened


# ---- errors -------------------------------------------------------------------------------------------------


def small():
    tid = torch.tensor([[0, 0, -1, 1, 1]])
    return AdvantageInputs(torch.zeros(1, 5, dtype=D), (tid >= 0).long(), tid, values=torch.zeros(1, 5, dtype=D),
                           group_ids=torch.zeros(1, dtype=torch.long))


def test_unknown_estimator_lists_the_registered_ones():
    with pytest.raises(ValueError, match="unknown advantage estimator 'nope'") as err:
        compute_advantage("nope", small())
    for name in ALL:
        assert repr(name) in str(err.value)


def test_missing_needed_field_is_named():
    fields = dict(step_rewards=torch.zeros(1, 2), outcome_rewards=torch.zeros(1), turn_obs_keys=[["a", "b"]],
                  tool_results=torch.zeros(1, 2, dtype=torch.bool))
    for field, name in [("values", "gae"), ("values", "bilevel_gae"), ("group_ids", "grpo"), ("group_ids", "rloo"),
                        ("step_rewards", "ms_grpo"), ("outcome_rewards", "ms_po"), ("tool_results", "ms_grpo"),
                        ("tool_results", "ms_po"), ("turn_obs_keys", "gigpo")]:
        inp = replace(small(), **{**fields, field: None})
        with pytest.raises(ValueError, match=f"AdvantageInputs.{field} is None but this estimator needs it"):
            compute_advantage(name, inp)
    compute_advantage("reinforce_pp", AdvantageInputs(small().token_rewards, small().response_mask, small().turn_ids))


def test_shape_and_contract_errors_name_the_field_and_position():
    inp = small()
    with pytest.raises(ValueError, match=r"values must have the shape of token_rewards \(1, 5\)"):
        compute_advantage("gae", replace(inp, values=torch.zeros(1, 4)))
    with pytest.raises(ValueError, match=r"group_ids must be a \(1,\) tensor"):
        compute_advantage("grpo", replace(inp, group_ids=torch.zeros(2, dtype=torch.long)))
    with pytest.raises(ValueError, match="turn_ids must be an integer tensor"):
        compute_advantage("gae", replace(inp, turn_ids=inp.turn_ids.double()))
    with pytest.raises(ValueError, match=r"token_rewards must be a \(B, T\) tensor"):
        compute_advantage("grpo", replace(inp, token_rewards=torch.zeros(5)))
    bad = replace(inp, turn_ids=torch.tensor([[0, 0, -1, -1, 1]]))  # position 3 is a model token without a turn
    with pytest.raises(ValueError, match=r"disagree at row 0, position 3 \(turn_ids=-1, response_mask=1\)"):
        compute_advantage("gae", bad)
    bad = replace(inp, turn_ids=torch.tensor([[0, 0, 0, 1, 1]]))  # an env token with a turn id
    with pytest.raises(ValueError, match="disagree at row 0, position 2"):
        compute_advantage("grpo", bad)
    with pytest.raises(ValueError, match="return_mode='mc' is not one of"):
        compute_advantage("gae", inp, return_mode="mc")
    with pytest.raises(ValueError, match="turn_level_weight=2.0 must be in"):
        compute_advantage("weighted_gae", inp, turn_level_weight=2.0)


def test_turn_numbering_errors_reach_every_turn_based_estimator():
    inp = replace(random_inputs(4, seed=1, min_turns=2, max_turns=3), failed=None)
    tid = inp.turn_ids.clone()
    tid[2] = torch.where(tid[2] == 0, 1, torch.where(tid[2] == 1, 0, tid[2]))  # row 2: turns 0 and 1 swapped
    bad = replace(inp, turn_ids=tid)
    expected = r"renumber the turns of row 2 \(model token 0 has turn id 1, expected 0\)"
    for name in ("turn_gae", "bilevel_gae", "weighted_gae", "ms_grpo", "ms_po", "gigpo"):
        with pytest.raises(ValueError, match=expected):
            compute_advantage(name, bad)


def test_per_turn_inputs_are_checked_only_when_needed():
    inp = random_inputs(4, seed=2, min_turns=3, max_turns=3)
    short = replace(inp, step_rewards=inp.step_rewards[:, :1], turn_obs_keys=[keys[:1] for keys in inp.turn_obs_keys])
    compute_advantage("gae", short)  # gae never reads step rewards or observation keys
    with pytest.raises(ValueError, match=r"step_rewards must be a \(4, K\) tensor with K >= the number of turns \(3\)"):
        compute_advantage("ms_grpo", short)
    with pytest.raises(ValueError, match="turn_obs_keys.0. has 1 keys but row 0 has 3 turns"):
        compute_advantage("gigpo", short)
    few_flags = replace(inp, tool_results=inp.tool_results[:, :2])
    compute_advantage("grpo", few_flags)
    with pytest.raises(ValueError, match=r"tool_results must be a \(4, K\) tensor with K >= the number of turns \(3\)"):
        compute_advantage("ms_po", few_flags)
    with pytest.raises(ValueError, match="tool_results must be a bool tensor"):
        compute_advantage("ms_grpo", replace(inp, tool_results=inp.step_rewards))  # step rewards are not flags


def test_register_estimator_checks_and_forwards_only_declared_scalars():
    with pytest.raises(ValueError, match="'gae' is already registered"):
        register_estimator("gae", lambda inp: None)
    try:  # a keyword-only parameter that is not a shared scalar is the estimator's own (algorithm.estimator_args)
        assert register_estimator("test_alpha", lambda inp, *, alpha: None).required_args == ("alpha",)
        with pytest.raises(ValueError, match="algorithm.estimator_args.alpha is required by estimator 'test_alpha'"):
            compute_advantage("test_alpha", small())
    finally:
        ADVANTAGE_ESTIMATORS.pop("test_alpha", None)
    with pytest.raises(ValueError, match=r"needs=\['critic'\] are not AdvantageInputs fields"):
        register_estimator("test_needs", lambda inp: None, needs=("critic",))
    seen = {}

    def ones(inp, *, gamma, eps=0.0):
        seen.update(gamma=gamma, eps=eps)
        x = torch.ones_like(inp.token_rewards)  # nonzero everywhere: compute_advantage zeroes it off the mask
        return x, 2 * x

    try:
        spec = register_estimator("test_ones", ones, needs=("values",))
        assert spec.params == ("gamma", "eps") and spec.needs == ("values",)
        adv, ret = compute_advantage("test_ones", small(), gamma=0.3, lam=0.1, eps=0.25)
        assert seen == dict(gamma=0.3, eps=0.25)
        m = small().response_mask.bool()
        assert torch.equal(adv, m.to(D)) and torch.equal(ret, 2 * m.to(D))
        with pytest.raises(ValueError, match="values is None"):
            compute_advantage("test_ones", replace(small(), values=None))
    finally:
        ADVANTAGE_ESTIMATORS.pop("test_ones", None)
    assert "test_alpha" not in ADVANTAGE_ESTIMATORS and "test_needs" not in ADVANTAGE_ESTIMATORS


@pytest.mark.parametrize(("norm_by_std", "expected"), [(True, -0.3634), (False, 0.2625)])
def test_grpo_std_scaling_favours_the_sure_arm_of_a_noisy_bandit(norm_by_std, expected):
    """The figure docs/estimators.md states for ``grpo``: groups of 8 on train_ppo.sh's bandit at an even split
    between a sure arm (0.1) and a risky one (1.0 with probability 1/4, else 0). Exact expectation over all 45
    compositions of a group (sure, risky won, risky lost), each weighted by its multinomial probability: the risky
    arm's advantage sum per group is negative with the std scaling although its expected reward is higher, and
    positive without it (E = 8 * 0.5 * (0.25 - 0.175) * 7/8 = 0.2625 unscaled)."""
    from itertools import product
    from math import factorial

    from ragen.algorithms.group import grpo

    outcomes = ((0.1, 0.5, False), (1.0, 0.125, True), (0.0, 0.375, True))  # (reward, probability, risky arm)
    comps = [c for c in product(range(9), repeat=3) if sum(c) == 8]
    assert len(comps) == 45
    rewards, risky, weight = [], [], []
    for c in comps:
        prob = factorial(8) / (factorial(c[0]) * factorial(c[1]) * factorial(c[2]))
        for (r, p, is_risky), k in zip(outcomes, c, strict=True):
            prob *= p ** k
            rewards += [r] * k
            risky += [is_risky] * k
        weight.append(prob)
    token_rewards = torch.tensor(rewards, dtype=torch.float64)[:, None]
    groups = torch.arange(45).repeat_interleave(8)
    adv, _ = grpo(token_rewards, torch.ones_like(token_rewards), groups, norm_by_std=norm_by_std)
    per_group = torch.zeros(45, dtype=torch.float64).index_add_(0, groups, adv[:, 0] * torch.tensor(risky))
    assert sum(weight) == pytest.approx(1.0)
    assert float((per_group * torch.tensor(weight, dtype=torch.float64)).sum()) == pytest.approx(expected, abs=1e-4)
