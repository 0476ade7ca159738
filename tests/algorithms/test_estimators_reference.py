"""Vectorised estimators vs the plain per-token Python-loop references on random batches.

Batches have 1-4 turns per row, env gaps, left and right padding, truncated rows, zero-reward turns, dense
(KL-like) rewards, and garbage values/rewards on env and pad tokens.
"""

import inspect

import pytest
import torch

from ragen.algorithms import ADVANTAGE_ESTIMATORS, compute_advantage
from ragen.algorithms.reference import REFERENCES, random_inputs

pytestmark = pytest.mark.usefixtures("gae_path")  # fused kernel and tensor code (conftest.py)

PARAMS = dict(gamma=0.9, lam=0.8, high_level_gamma=0.7, high_level_lam=0.6, turn_level_weight=0.3,
              step_advantage_coef=0.5, discount_factor=0.7, step_advantage_weight=0.4, eps=1e-6)


def run_both(name, inp, **overrides):
    params = dict(PARAMS, **overrides)
    adv, ret = compute_advantage(name, inp, **params)
    accepted = inspect.signature(REFERENCES[name]).parameters
    ref_adv, ref_ret = REFERENCES[name](inp, **{k: v for k, v in params.items() if k in accepted})
    return adv, ret, torch.tensor(ref_adv, dtype=torch.float64), torch.tensor(ref_ret, dtype=torch.float64)


def test_every_registered_estimator_has_a_reference():
    assert sorted(REFERENCES) == sorted(ADVANTAGE_ESTIMATORS) == sorted(
        ["gae", "turn_gae", "bilevel_gae", "weighted_gae", "grpo", "rloo", "reinforce_pp", "ms_grpo", "ms_po",
         "gigpo"])


@pytest.mark.parametrize("name", sorted(REFERENCES))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_reference_float32(name, seed):
    inp = random_inputs(10, seed=seed, dense_reward_frac=0.3, dtype=torch.float32)
    adv, ret, ref_adv, ref_ret = run_both(name, inp)
    assert adv.dtype == torch.float32
    torch.testing.assert_close(adv.double(), ref_adv, atol=1e-5, rtol=0)
    torch.testing.assert_close(ret.double(), ref_ret, atol=1e-5, rtol=0)
    off = inp.response_mask == 0
    assert bool((adv[off] == 0).all()) and bool((ret[off] == 0).all())
    assert bool(adv[~off].abs().sum() > 0)  # not trivially zero


@pytest.mark.parametrize("name", ["gae", "turn_gae", "bilevel_gae", "weighted_gae", "reinforce_pp"])
@pytest.mark.parametrize("skip_env_tokens", [True, False])
@pytest.mark.parametrize("return_mode", ["adv_plus_value", "reward_to_go"])
@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.9, 0.8), (0.5, 0.0), (0.99, 0.97)])
def test_gae_family_options_float64(name, skip_env_tokens, return_mode, gamma, lam):
    inp = random_inputs(8, seed=7, max_turns=5, dense_reward_frac=0.5)
    adv, ret, ref_adv, ref_ret = run_both(name, inp, gamma=gamma, lam=lam, skip_env_tokens=skip_env_tokens,
                                          return_mode=return_mode)
    torch.testing.assert_close(adv, ref_adv, atol=1e-9, rtol=0)
    torch.testing.assert_close(ret, ref_ret, atol=1e-9, rtol=0)


@pytest.mark.parametrize("name", ["gae", "bilevel_gae", "reinforce_pp"])
def test_long_rows_with_tiny_discount_use_the_doubling_fallback(name):
    # 0.05 ** 400 underflows float64, so the suffix scan takes the recursive-doubling path.
    inp = random_inputs(4, seed=3, max_turns=3, min_turns=3, model_len=(150, 200), env_len=(5, 20))
    adv, ret, ref_adv, ref_ret = run_both(name, inp, gamma=0.25, lam=0.2)
    torch.testing.assert_close(adv, ref_adv, atol=1e-9, rtol=0)
    torch.testing.assert_close(ret, ref_ret, atol=1e-9, rtol=0)


@pytest.mark.parametrize("norm_by_std", [True, False])
@pytest.mark.parametrize("name", ["grpo", "ms_grpo", "ms_po", "gigpo"])
def test_group_estimators_without_std(name, norm_by_std):
    inp = random_inputs(12, seed=11, group_size=4)
    adv, ret, ref_adv, ref_ret = run_both(name, inp, norm_by_std=norm_by_std)
    torch.testing.assert_close(adv, ref_adv, atol=1e-9, rtol=0)
    torch.testing.assert_close(ret, ref_ret, atol=1e-9, rtol=0)
