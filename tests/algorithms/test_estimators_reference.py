"""Vectorised estimators vs the plain per-token Python-loop references (ragen.algorithms.reference) on random
batches: 1-4 turns per row, env gaps, left and right padding, truncated rows (with ``bootstrap_values``),
rows with and without tool results (``tool_results``), zero-reward turns, dense rewards, per-token penalties,
failed rows, and garbage values / rewards / penalties on env and pad tokens.

Option grids list only combinations that change what is computed: each estimator gets the scalars it declares.
"""

import inspect

import pytest
import torch
from estimator_helpers import GAE_FAMILY, GROUP_FAILED_AWARE, assert_matches_reference, replace

from ragen.algorithms import ADVANTAGE_ESTIMATORS
from ragen.algorithms.reference import REFERENCES, random_inputs

ALL = sorted(ADVANTAGE_ESTIMATORS)
DEFAULTS = dict(gamma=0.9, lam=0.8, high_level_gamma=0.7, high_level_lam=0.6, turn_level_weight=0.3,
                step_advantage_coef=0.5, discount_factor=0.7, step_advantage_weight=0.4, eps=1e-6)
ATOL = {torch.float32: 2e-5, torch.float64: 1e-10}


def test_every_registered_estimator_has_a_reference_with_the_same_scalars():
    assert sorted(REFERENCES) == ALL == sorted(
        ["gae", "turn_gae", "bilevel_gae", "weighted_gae", "grpo", "rloo", "reinforce_pp", "ms_grpo", "ms_po",
         "gigpo"])
    for name, spec in ADVANTAGE_ESTIMATORS.items():
        ref_params = set(inspect.signature(REFERENCES[name]).parameters) - {"inp", "rows"}
        assert set(spec.params) == ref_params, name


def batch(seed, dtype, extras):
    """A random batch; ``extras`` adds per-token penalties and failed rows (else both fields are None)."""
    inp = random_inputs(12, seed=seed, dense_reward_frac=0.3, penalties=extras, failed_frac=0.25 if extras else 0.0,
                        dtype=dtype)
    turns, flagged = inp.num_turns, inp.tool_results.any(dim=1)
    # mixed lengths within a group, rows without any tool result, and unflagged turns with a nonzero step reward
    assert any(len(set(turns[inp.group_ids == g].tolist())) > 1 for g in inp.group_ids.unique())
    assert bool((~flagged & (turns > 0)).any()) and bool(flagged.any())
    assert bool(((inp.step_rewards != 0) & ~inp.tool_results).any())
    if extras:
        assert bool(inp.failed.any()) and bool(inp.truncated.any())
        return inp
    return replace(inp, failed=None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", ALL)
def test_matches_reference(name, dtype):
    for seed in range(4):  # odd seeds add penalties and failed rows, even ones leave both fields None
        inp = batch(seed, dtype, extras=bool(seed % 2))
        adv, _ = assert_matches_reference(name, inp, atol=ATOL[dtype], **DEFAULTS)
        assert bool(adv.abs().sum() > 0)  # not trivially zero


def grid(name, *cases):
    return [pytest.param(name, case, id=f"{name}-" + ",".join(f"{k}={v}" for k, v in case.items())) for case in cases]


RTG = "reward_to_go"
OPTION_GRID = [
    # token GAE: skip_env_tokens x return_mode x discount (lam = 0 is one-step TD)
    *grid("gae", *[dict(gamma=g, lam=lam, skip_env_tokens=s, return_mode=m)
                   for g, lam in ((1.0, 1.0), (0.9, 0.8), (0.5, 0.0))
                   for s in (True, False) for m in ("adv_plus_value", RTG)]),
    # turn GAE reads only the high-level discount
    *grid("turn_gae", *[dict(high_level_gamma=gh, high_level_lam=lh, return_mode=m)
                        for gh, lh in ((1.0, 1.0), (0.7, 0.6), (0.9, 0.0)) for m in ("adv_plus_value", RTG)]),
    *grid("bilevel_gae", *[dict(gamma=g, lam=lam, high_level_gamma=gh, high_level_lam=lh, return_mode=m)
                           for g, lam, gh, lh in ((1.0, 1.0, 1.0, 1.0), (0.9, 0.8, 0.7, 0.6), (1.0, 0.5, 0.95, 0.5),
                                                  (0.5, 0.0, 0.9, 0.0))
                           for m in ("adv_plus_value", RTG)]),
    *grid("weighted_gae", *[dict(turn_level_weight=w, skip_env_tokens=s)
                            for w in (0.0, 0.3, 1.0) for s in (True, False)],
          dict(turn_level_weight=0.3, return_mode=RTG, gamma=1.0, lam=1.0, high_level_gamma=1.0, high_level_lam=1.0)),
    *grid("reinforce_pp", dict(gamma=1.0), dict(gamma=0.9), dict(gamma=0.0)),
    *grid("grpo", dict(norm_by_std=False), dict(eps=0.5)),
    *grid("ms_grpo", dict(norm_by_std=False), dict(step_advantage_coef=0.0)),
    *grid("ms_po", dict(norm_by_std=False), dict(discount_factor=0.0)),
    *grid("gigpo", dict(norm_by_std=False), dict(gamma=1.0, step_advantage_weight=2.0), dict(gamma=0.0)),
]


@pytest.mark.parametrize("name,options", OPTION_GRID)
def test_options_match_reference_float64(name, options):
    for seed in (3, 4):
        inp = random_inputs(12, seed=seed, max_turns=5, group_size=4, dense_reward_frac=0.5, penalties=True,
                            failed_frac=0.2)
        assert_matches_reference(name, inp, atol=1e-10, **{**DEFAULTS, **options})


@pytest.mark.parametrize("name", GAE_FAMILY)
def test_gae_family_with_every_row_truncated_and_one_token_turns(name):
    # every row bootstraps; one-token turns make s_k = e_k and touching turns (no env gap) stress the turn cuts
    for kw in (dict(model_len=(1, 1), env_len=(0, 0)), dict(model_len=(1, 3), env_len=(0, 1))):
        inp = random_inputs(10, seed=21, truncated_frac=1.0, penalties=True, **kw)
        assert_matches_reference(name, inp, atol=1e-10, **DEFAULTS)


@pytest.mark.parametrize("name", GROUP_FAILED_AWARE)
def test_group_estimators_with_many_failed_rows(name):
    # half the rows failed: some groups keep a single valid row (-> 0), some none
    inp = random_inputs(15, seed=5, group_size=3, failed_frac=0.5, penalties=True)
    adv, ret = assert_matches_reference(name, inp, atol=1e-10, **DEFAULTS)
    assert bool((adv[inp.failed] == 0).all()) and bool((ret[inp.failed] == 0).all())
