"""Helpers shared by the estimator tests; import them as a plain module (``from estimator_helpers import ...``),
like ``tests/trainer/trainer_helpers.py``."""

from __future__ import annotations

import dataclasses
import inspect

import torch

from ragen.algorithms import ADVANTAGE_ESTIMATORS, AdvantageInputs, compute_advantage
from ragen.algorithms.reference import REFERENCES

D = torch.float64
GAE_FAMILY = ("gae", "turn_gae", "bilevel_gae", "weighted_gae")
GROUP_FAILED_AWARE = ("grpo", "rloo", "ms_grpo", "ms_po", "gigpo")  # failed rows leave the group statistics


def estimator_params(name: str, params: dict) -> dict:
    """The entries of ``params`` that estimator ``name`` declares (``compute_advantage`` ignores the rest)."""
    return {k: v for k, v in params.items() if k in ADVANTAGE_ESTIMATORS[name].params}


def reference(name: str, inp: AdvantageInputs, **params) -> tuple[torch.Tensor, torch.Tensor]:
    """The plain-loop reference of ``name`` as float64 (B, T) tensors."""
    accepted = inspect.signature(REFERENCES[name]).parameters
    adv, ret = REFERENCES[name](inp, **{k: v for k, v in params.items() if k in accepted})
    shape = tuple(inp.token_rewards.shape)
    return torch.tensor(adv, dtype=D).reshape(shape), torch.tensor(ret, dtype=D).reshape(shape)


def run_both(name: str, inp: AdvantageInputs, **params):
    """(adv, ret) of ``compute_advantage`` and (ref_adv, ref_ret) of the reference, on the same scalars."""
    params = estimator_params(name, params)
    adv, ret = compute_advantage(name, inp, **params)
    return (adv, ret, *reference(name, inp, **params))


def assert_matches_reference(name: str, inp: AdvantageInputs, *, atol: float, rtol: float = 0.0, **params):
    """compute_advantage == reference within ``atol``, outputs exactly 0 off the mask, dtype kept; returns them."""
    adv, ret, ref_adv, ref_ret = run_both(name, inp, **params)
    want_dtype = torch.promote_types(inp.token_rewards.dtype, torch.float32)
    assert adv.dtype == ret.dtype == want_dtype, (adv.dtype, ret.dtype, want_dtype)
    torch.testing.assert_close(adv.double(), ref_adv, atol=atol, rtol=rtol)
    torch.testing.assert_close(ret.double(), ref_ret, atol=atol, rtol=rtol)
    off = ~inp.response_mask.bool()
    assert bool((adv[off] == 0).all()) and bool((ret[off] == 0).all())
    return adv, ret


def check(name: str, inp: AdvantageInputs, **params):
    """For hand-computed examples: the implementation (float64) agrees with the reference; returns (adv, ret)."""
    return assert_matches_reference(name, inp, atol=1e-12, **params)


def replace(inp: AdvantageInputs, **fields) -> AdvantageInputs:
    return dataclasses.replace(inp, **fields)


def select_rows(inp: AdvantageInputs, rows: list[int]) -> AdvantageInputs:
    """A batch of the given rows of ``inp`` (in that order), every per-row field selected alike."""
    idx = torch.tensor(rows, dtype=torch.long)
    fields = {}
    for f in dataclasses.fields(inp):
        x = getattr(inp, f.name)
        if isinstance(x, torch.Tensor):
            x = x[idx]
        elif isinstance(x, list):
            x = [x[i] for i in rows]
        fields[f.name] = x
    return AdvantageInputs(**fields)


def tokens(turns: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """One row from a turn-id list (-1 = env / prompt / pad): (turn_ids (1, T), response_mask (1, T))."""
    tid = torch.tensor([turns], dtype=torch.long)
    return tid, (tid >= 0).long()
