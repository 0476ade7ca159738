"""One registry and one entry point for every advantage estimator (the math of each: docs/estimators.md).

An estimator is registered as an *adapter*: ``fn(inputs: AdvantageInputs, *, <scalars>) -> (adv, ret)``.
Its keyword-only parameters are exactly the scalars :func:`compute_advantage` forwards to it, and ``needs``
lists the optional :class:`AdvantageInputs` fields it requires. The adapters below only unpack the inputs and
call the pure tensor functions of :mod:`gae`, :mod:`group` and :mod:`turn_credit`.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ragen.algorithms import gae as _gae
from ragen.algorithms import group as _group
from ragen.algorithms import turn_credit as _tc
from ragen.algorithms.inputs import AdvantageInputs
from ragen.algorithms.masked import masked_whiten

Estimator = Callable[..., tuple[Tensor, Tensor]]


@dataclass(frozen=True)
class EstimatorSpec:
    """A registered estimator: its adapter, the scalars it takes and the input fields it needs."""

    name: str
    fn: Estimator
    params: tuple[str, ...]
    needs: tuple[str, ...]


ADVANTAGE_ESTIMATORS: dict[str, EstimatorSpec] = {}
SCALAR_NAMES = (
    "gamma", "lam", "high_level_gamma", "high_level_lam", "turn_level_weight", "skip_env_tokens", "return_mode",
    "norm_by_std", "step_advantage_coef", "discount_factor", "step_advantage_weight", "eps",
)


def register_estimator(name: str, fn: Estimator, *, needs: tuple[str, ...] = ()) -> EstimatorSpec:
    """Register ``fn(inputs, *, scalars...)`` under ``name``; the keyword-only params are the forwarded scalars."""
    if name in ADVANTAGE_ESTIMATORS:
        raise ValueError(f"advantage estimator {name!r} is already registered; pick another name")
    sig = inspect.signature(fn)
    kw_only = [p for p in sig.parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    missing = [p.name for p in kw_only if p.name not in SCALAR_NAMES and p.default is inspect.Parameter.empty]
    if missing:
        raise ValueError(
            f"estimator {name!r} has keyword-only params {missing} that compute_advantage cannot supply "
            f"(it forwards {list(SCALAR_NAMES)}); give them defaults"
        )
    params = tuple(p.name for p in kw_only if p.name in SCALAR_NAMES)
    unknown = [field for field in needs if field not in AdvantageInputs.__dataclass_fields__]
    if unknown:
        fields = list(AdvantageInputs.__dataclass_fields__)
        raise ValueError(f"needs={unknown} are not AdvantageInputs fields ({fields})")
    spec = EstimatorSpec(name=name, fn=fn, params=params, needs=tuple(needs))
    ADVANTAGE_ESTIMATORS[name] = spec
    return spec


def compute_advantage(
    name: str,
    inputs: AdvantageInputs,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
    high_level_gamma: float = 0.95,
    high_level_lam: float = 1.0,
    turn_level_weight: float = 0.5,
    skip_env_tokens: bool = True,
    return_mode: str = "adv_plus_value",
    whiten: bool = False,
    norm_by_std: bool = True,
    step_advantage_coef: float = 1.0,
    discount_factor: float = 1.0,
    step_advantage_weight: float = 1.0,
    eps: float = 1e-6,
) -> tuple[Tensor, Tensor]:
    """Run estimator ``name`` on ``inputs``; returns (advantages, returns), both (B, T), exactly 0 off model tokens.

    Only the scalars the estimator declares are forwarded (see each function's docstring for their meaning).
    ``whiten=True`` then whitens the advantages over all model tokens of the batch with
    :func:`masked_whiten` (population variance, ``(x - mean) / (std + eps)``); returns are never whitened.
    """
    spec = ADVANTAGE_ESTIMATORS.get(name)
    if spec is None:
        raise ValueError(f"unknown advantage estimator {name!r}; registered: {sorted(ADVANTAGE_ESTIMATORS)}")
    if isinstance(inputs.response_mask, Tensor) and inputs.response_mask.dtype != torch.bool:
        inputs = dataclasses.replace(inputs, response_mask=inputs.response_mask > 0)  # one bool mask for all uses
    inputs.validate(spec.needs)
    scalars = dict(
        gamma=gamma, lam=lam, high_level_gamma=high_level_gamma, high_level_lam=high_level_lam,
        turn_level_weight=turn_level_weight, skip_env_tokens=skip_env_tokens, return_mode=return_mode,
        norm_by_std=norm_by_std, step_advantage_coef=step_advantage_coef, discount_factor=discount_factor,
        step_advantage_weight=step_advantage_weight, eps=eps,
    )
    adv, ret = spec.fn(inputs, **{k: scalars[k] for k in spec.params})
    model = inputs.response_mask
    zero = torch.zeros((), dtype=adv.dtype, device=adv.device)
    adv = masked_whiten(adv, model, eps=eps) if whiten else torch.where(model, adv, zero)  # 0 off the mask
    return adv, torch.where(model, ret, zero.to(ret.dtype))


# ---- adapters: AdvantageInputs -> pure tensor functions -------------------------------------------------------


def _gae_adapter(inp: AdvantageInputs, *, gamma, lam, skip_env_tokens, return_mode):
    return _gae.gae(
        inp.token_rewards, inp.values, inp.response_mask, gamma=gamma, lam=lam, skip_env_tokens=skip_env_tokens,
        bootstrap=inp.bootstrap(), return_mode=return_mode, token_penalties=inp.token_penalties,
    )


def _turn_gae_adapter(inp: AdvantageInputs, *, high_level_gamma, high_level_lam, return_mode):
    return _gae.turn_gae(
        inp.token_rewards, inp.values, inp.response_mask, inp.turn_ids, high_level_gamma=high_level_gamma,
        high_level_lam=high_level_lam, bootstrap=inp.bootstrap(), return_mode=return_mode,
        token_penalties=inp.token_penalties,
    )


def _bilevel_gae_adapter(inp: AdvantageInputs, *, gamma, lam, high_level_gamma, high_level_lam, return_mode):
    return _gae.bilevel_gae(
        inp.token_rewards, inp.values, inp.response_mask, inp.turn_ids, gamma=gamma, lam=lam,
        high_level_gamma=high_level_gamma, high_level_lam=high_level_lam, bootstrap=inp.bootstrap(),
        return_mode=return_mode, token_penalties=inp.token_penalties,
    )


def _weighted_gae_adapter(
    inp: AdvantageInputs, *, turn_level_weight, gamma, lam, high_level_gamma, high_level_lam, skip_env_tokens,
    return_mode,
):
    return _gae.weighted_gae(
        inp.token_rewards, inp.values, inp.response_mask, inp.turn_ids, turn_level_weight=turn_level_weight,
        gamma=gamma, lam=lam, high_level_gamma=high_level_gamma, high_level_lam=high_level_lam,
        skip_env_tokens=skip_env_tokens, bootstrap=inp.bootstrap(), return_mode=return_mode,
        token_penalties=inp.token_penalties,
    )


def _grpo_adapter(inp: AdvantageInputs, *, eps, norm_by_std):
    return _group.grpo(inp.rewards_with_penalties(), inp.response_mask, inp.group_ids, eps=eps,
                       norm_by_std=norm_by_std, failed=inp.failed)


def _rloo_adapter(inp: AdvantageInputs):
    return _group.rloo(inp.rewards_with_penalties(), inp.response_mask, inp.group_ids, failed=inp.failed)


def _reinforce_pp_adapter(inp: AdvantageInputs, *, gamma, eps):
    return _group.reinforce_pp(inp.rewards_with_penalties(), inp.response_mask, gamma=gamma, eps=eps)


def _ms_grpo_adapter(inp: AdvantageInputs, *, step_advantage_coef, eps, norm_by_std):
    return _tc.ms_grpo(
        inp.step_rewards, inp.outcome_rewards, inp.tool_results, inp.response_mask, inp.turn_ids, inp.group_ids,
        step_advantage_coef=step_advantage_coef, eps=eps, norm_by_std=norm_by_std, failed=inp.failed,
    )


def _ms_po_adapter(inp: AdvantageInputs, *, discount_factor, eps, norm_by_std):
    return _tc.ms_po(
        inp.step_rewards, inp.outcome_rewards, inp.tool_results, inp.response_mask, inp.turn_ids, inp.group_ids,
        discount_factor=discount_factor, eps=eps, norm_by_std=norm_by_std, failed=inp.failed,
    )


def _gigpo_adapter(inp: AdvantageInputs, *, gamma, step_advantage_weight, eps, norm_by_std):
    return _tc.gigpo(
        inp.rewards_with_penalties(), inp.response_mask, inp.turn_ids, inp.group_ids, inp.turn_obs_keys,
        gamma=gamma, step_advantage_weight=step_advantage_weight, eps=eps, norm_by_std=norm_by_std,
        failed=inp.failed,
    )


_STEP_SPLIT = ("step_rewards", "outcome_rewards", "tool_results", "group_ids")
register_estimator("gae", _gae_adapter, needs=("values",))
register_estimator("turn_gae", _turn_gae_adapter, needs=("values",))
register_estimator("bilevel_gae", _bilevel_gae_adapter, needs=("values",))
register_estimator("weighted_gae", _weighted_gae_adapter, needs=("values",))
register_estimator("grpo", _grpo_adapter, needs=("group_ids",))
register_estimator("rloo", _rloo_adapter, needs=("group_ids",))
register_estimator("reinforce_pp", _reinforce_pp_adapter)
register_estimator("ms_grpo", _ms_grpo_adapter, needs=_STEP_SPLIT)
register_estimator("ms_po", _ms_po_adapter, needs=_STEP_SPLIT)
register_estimator("gigpo", _gigpo_adapter, needs=("group_ids", "turn_obs_keys"))
