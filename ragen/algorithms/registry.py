"""One registry and one entry point for every advantage estimator (the math of each: docs/estimators.md).

An estimator is registered as an *adapter*: ``fn(inputs: AdvantageInputs, *, <keyword-only params>) -> (adv, ret)``.
Its keyword-only parameters are of two kinds: those named in :data:`SHARED_SCALARS` are the shared scalars
(``algorithm.gamma``, ``algorithm.lam``...) that :func:`compute_advantage` forwards to every estimator declaring
them; any other is the estimator's own hyperparameter, set with ``algorithm.estimator_args.<name>`` and checked
against the signature by :func:`bind_estimator_args` before any worker starts (a parameter without a default is
required). ``needs`` lists the optional :class:`AdvantageInputs` fields it requires. The adapters below only unpack
the inputs and call the pure tensor functions of :mod:`gae`, :mod:`group` and :mod:`turn_credit`.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ragen.algorithms import gae as _gae
from ragen.algorithms import group as _group
from ragen.algorithms import turn_credit as _tc
from ragen.algorithms.inputs import AdvantageInputs
from ragen.algorithms.masked import masked_whiten

Estimator = Callable[..., tuple[Tensor, Tensor]]

# The scalars every estimator may read, with compute_advantage's defaults (the same as the ``algorithm`` section's).
SHARED_SCALARS: dict[str, Any] = {
    "gamma": 1.0, "lam": 1.0, "high_level_gamma": 0.95, "high_level_lam": 1.0, "turn_level_weight": 0.5,
    "skip_env_tokens": True, "return_mode": "adv_plus_value", "norm_by_std": True, "step_advantage_coef": 1.0,
    "discount_factor": 1.0, "step_advantage_weight": 1.0, "eps": 1e-6,
}


@dataclass(frozen=True)
class EstimatorSpec:
    """A registered estimator: its adapter, the shared scalars it takes (``params``), the input fields it needs,
    and its own hyperparameters (``args``: its other keyword-only parameters; those without a default are
    required)."""

    name: str
    fn: Estimator
    params: tuple[str, ...]
    needs: tuple[str, ...]
    args: tuple[inspect.Parameter, ...] = ()

    @property
    def required_args(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.args if p.default is inspect.Parameter.empty)


ADVANTAGE_ESTIMATORS: dict[str, EstimatorSpec] = {}


def register_estimator(name: str, fn: Estimator, *, needs: tuple[str, ...] = ()) -> EstimatorSpec:
    """Register ``fn(inputs, *, params...)`` under ``name``: keyword-only params named in :data:`SHARED_SCALARS` are
    forwarded from the shared scalars, the others are the estimator's own (``algorithm.estimator_args``)."""
    if name in ADVANTAGE_ESTIMATORS:
        raise ValueError(f"advantage estimator {name!r} is already registered; pick another name")
    kw_only = [p for p in inspect.signature(fn).parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    unknown = [field for field in needs if field not in AdvantageInputs.__dataclass_fields__]
    if unknown:
        fields = list(AdvantageInputs.__dataclass_fields__)
        raise ValueError(f"needs={unknown} are not AdvantageInputs fields ({fields})")
    spec = EstimatorSpec(name=name, fn=fn, params=tuple(p.name for p in kw_only if p.name in SHARED_SCALARS),
                         needs=tuple(needs), args=tuple(p for p in kw_only if p.name not in SHARED_SCALARS))
    ADVANTAGE_ESTIMATORS[name] = spec
    return spec


def _spec(name: str) -> EstimatorSpec:
    spec = ADVANTAGE_ESTIMATORS.get(name)
    if spec is None:
        raise ValueError(f"unknown advantage estimator {name!r}; registered: {sorted(ADVANTAGE_ESTIMATORS)}")
    return spec


def _accepted(spec: EstimatorSpec) -> str:
    """The estimator's own parameters as a message lists them: ``beta (required), tau=0.5`` or ``none``."""
    shown = [p.name + (" (required)" if p.default is inspect.Parameter.empty else f"={p.default!r}")
             for p in spec.args]
    return ", ".join(shown) if shown else "none"


def estimator_args_problems(name: str, args: Mapping[str, Any]) -> list[str]:
    """One line per problem of ``args`` (``algorithm.estimator_args``) for estimator ``name``; [] when they bind.

    A name the estimator does not take (with the closest of its parameters, and for a shared scalar the
    ``algorithm.<name>`` key to use instead), and each required parameter ``args`` lacks. An unregistered ``name``
    gives [] (the estimator check reports it)."""
    spec = ADVANTAGE_ESTIMATORS.get(name)
    if spec is None:
        return []
    key, own = "algorithm.estimator_args", [p.name for p in spec.args]
    out = []
    for arg in args:
        if arg in own:
            continue
        if arg in SHARED_SCALARS:
            out.append(f"{key}.{arg}: {arg} is a shared scalar, not an argument of estimator {name!r}; set "
                       f"algorithm.{arg} instead")
            continue
        near = difflib.get_close_matches(str(arg), own, n=1, cutoff=0.6)
        hint = f"did you mean {key}.{near[0]}? " if near else ""
        out.append(f"{key}.{arg}={args[arg]!r}: estimator {name!r} takes no parameter {arg!r}; {hint}(its own "
                   f"parameters: {_accepted(spec)}; remove the key or pick the estimator that takes it)")
    out += [f"{key}.{arg} is required by estimator {name!r} (its own parameters: {_accepted(spec)}); set "
            f"{key}.{arg}=<value>" for arg in spec.required_args if arg not in args]
    return out


def bind_estimator_args(name: str, args: Mapping[str, Any] | None) -> dict[str, Any]:
    """``args`` as the keyword arguments estimator ``name`` receives besides the shared scalars.

    Raises ``ValueError`` listing every problem of :func:`estimator_args_problems` (or naming an unregistered
    estimator); the trainer's validation reports the same problems before any worker starts."""
    _spec(name)
    args = dict(args or {})
    problems = estimator_args_problems(name, args)
    if problems:
        raise ValueError("; ".join(problems))
    return args


def compute_advantage(
    name: str,
    inputs: AdvantageInputs,
    *,
    whiten: bool = False,
    estimator_args: Mapping[str, Any] | None = None,
    **scalars: Any,
) -> tuple[Tensor, Tensor]:
    """Run estimator ``name`` on ``inputs``; returns (advantages, returns), both (B, T), exactly 0 off model tokens.

    ``scalars``: any of :data:`SHARED_SCALARS` (``gamma``, ``lam``, ``high_level_gamma``, ``high_level_lam``,
    ``turn_level_weight``, ``skip_env_tokens``, ``return_mode``, ``norm_by_std``, ``step_advantage_coef``,
    ``discount_factor``, ``step_advantage_weight``, ``eps``; defaults there); only those the estimator declares
    are forwarded (see each function's docstring for their meaning). ``estimator_args``: the estimator's own
    hyperparameters (:func:`bind_estimator_args`). ``whiten=True`` then whitens the advantages over all model
    tokens of the batch with :func:`masked_whiten` (population variance, ``(x - mean) / (std + eps)``); returns are
    never whitened.
    """
    spec = _spec(name)
    unknown = sorted(set(scalars) - set(SHARED_SCALARS))
    if unknown:
        raise TypeError(f"compute_advantage got unknown scalar(s) {unknown}; the shared scalars are "
                        f"{list(SHARED_SCALARS)} (an estimator's own hyperparameters go in estimator_args)")
    if isinstance(inputs.response_mask, Tensor) and inputs.response_mask.dtype != torch.bool:
        inputs = dataclasses.replace(inputs, response_mask=inputs.response_mask > 0)  # one bool mask for all uses
    inputs.validate(spec.needs)
    values = {**SHARED_SCALARS, **scalars}
    own = bind_estimator_args(name, estimator_args)
    adv, ret = spec.fn(inputs, **{k: values[k] for k in spec.params}, **own)
    model = inputs.response_mask
    zero = torch.zeros((), dtype=adv.dtype, device=adv.device)
    adv = masked_whiten(adv, model, eps=values["eps"]) if whiten else torch.where(model, adv, zero)  # 0 off the mask
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
