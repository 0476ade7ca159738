"""An estimator's own hyperparameters (``algorithm.estimator_args``): its keyword-only parameters that are not shared
scalars, bound to its signature (``bind_estimator_args``) and passed to it by ``compute_advantage``."""

import pytest
import torch

from ragen.algorithms import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInputs,
    bind_estimator_args,
    compute_advantage,
    register_estimator,
)
from ragen.algorithms.registry import SHARED_SCALARS, estimator_args_problems
from ragen.trainer.config.schema import AlgorithmSection

MASK = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 0, 0], [1, 0, 0]])
# group 0: returns 1 and 0 (mean 0.5), group 1: 3 and 1 (mean 2): GRPO without the std, +-0.5 and +-1
INPUTS = AdvantageInputs(token_rewards=torch.tensor([[0, 1.0, 0], [0, 0, 0], [3.0, 0, 0], [1.0, 0, 0]]),
                         response_mask=MASK, turn_ids=torch.where(MASK.bool(), 0, -1),
                         group_ids=torch.tensor([0, 0, 1, 1]))
GRPO = torch.tensor([[0.5, 0.5, 0], [-0.5, -0.5, 0], [1.0, 0, 0], [-1.0, 0, 0]])


@pytest.fixture
def scaled():
    """``scaled_grpo``: GRPO's advantages times ``beta`` (required) plus ``shift`` (default 0), both its own."""
    seen = []

    def scaled_grpo(inputs, *, eps, norm_by_std, beta, shift=0.0):
        seen.append(dict(eps=eps, norm_by_std=norm_by_std, beta=beta, shift=shift))
        adv, ret = ADVANTAGE_ESTIMATORS["grpo"].fn(inputs, eps=eps, norm_by_std=norm_by_std)
        return beta * adv + shift, ret

    spec = register_estimator("test_scaled_grpo", scaled_grpo, needs=("group_ids",))
    try:
        yield spec, seen
    finally:
        ADVANTAGE_ESTIMATORS.pop("test_scaled_grpo", None)


def test_own_parameters_reach_the_estimator(scaled):
    spec, seen = scaled
    assert spec.params == ("eps", "norm_by_std")  # shared scalars, forwarded from algorithm.*
    assert [p.name for p in spec.args] == ["beta", "shift"] and spec.required_args == ("beta",)
    adv, _ = compute_advantage("test_scaled_grpo", INPUTS, norm_by_std=False, estimator_args={"beta": 0.3})
    torch.testing.assert_close(adv, 0.3 * GRPO)
    assert seen[-1] == dict(eps=1e-6, norm_by_std=False, beta=0.3, shift=0.0)
    adv, _ = compute_advantage("test_scaled_grpo", INPUTS, norm_by_std=False, estimator_args={"beta": 2, "shift": 1})
    torch.testing.assert_close(adv, torch.where(MASK.bool(), 2 * GRPO + 1, 0.0))  # still 0 off the mask


def test_binding_refuses_unknown_and_missing_names(scaled):
    assert bind_estimator_args("test_scaled_grpo", {"beta": 0.3}) == {"beta": 0.3}
    problems = estimator_args_problems("test_scaled_grpo", {"betta": 0.3})
    assert problems == [
        "algorithm.estimator_args.betta=0.3: estimator 'test_scaled_grpo' takes no parameter 'betta'; did you mean "
        "algorithm.estimator_args.beta? (its own parameters: beta (required), shift=0.0; remove the key or pick the "
        "estimator that takes it)",
        "algorithm.estimator_args.beta is required by estimator 'test_scaled_grpo' (its own parameters: beta "
        "(required), shift=0.0); set algorithm.estimator_args.beta=<value>",
    ]
    with pytest.raises(ValueError, match="takes no parameter 'betta'; did you mean algorithm.estimator_args.beta"):
        bind_estimator_args("test_scaled_grpo", {"beta": 1.0, "betta": 0.3})
    with pytest.raises(ValueError, match="algorithm.estimator_args.beta is required by estimator 'test_scaled_grpo'"):
        compute_advantage("test_scaled_grpo", INPUTS)
    with pytest.raises(ValueError, match="algorithm.estimator_args.gamma: gamma is a shared scalar, not an argument "
                                         "of estimator 'test_scaled_grpo'; set algorithm.gamma instead"):
        bind_estimator_args("test_scaled_grpo", {"beta": 1.0, "gamma": 0.5})
    with pytest.raises(ValueError, match="unknown advantage estimator 'nope'"):
        bind_estimator_args("nope", {})


@pytest.mark.parametrize("name", ["gae", "grpo", "gigpo"])
def test_a_builtin_estimator_takes_no_own_parameter(name):
    assert ADVANTAGE_ESTIMATORS[name].args == ()
    assert bind_estimator_args(name, {}) == {} and bind_estimator_args(name, None) == {}
    with pytest.raises(ValueError, match=rf"estimator '{name}' takes no parameter 'beta'; \(its own parameters: "
                                         "none;"):
        bind_estimator_args(name, {"beta": 0.3})


def test_compute_advantage_refuses_a_scalar_it_does_not_know():
    with pytest.raises(TypeError, match=r"unknown scalar\(s\) \['beta'\]"):
        compute_advantage("grpo", INPUTS, beta=0.3)


def test_the_algorithm_section_forwards_every_shared_scalar_with_the_same_default():
    """``AlgorithmSection.advantage_kwargs`` is compute_advantage's keywords: the shared scalars (same defaults as
    the registry's), whiten and estimator_args."""
    kwargs = AlgorithmSection(estimator_args={"beta": 0.3}).advantage_kwargs()
    assert kwargs == {**SHARED_SCALARS, "whiten": True, "estimator_args": {"beta": 0.3}}
