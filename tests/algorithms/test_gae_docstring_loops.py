"""The plain loops shown in the docstrings of ``gae``, ``turn_gae`` and ``bilevel_gae`` (ragen/algorithms/gae.py)
are what the vectorised functions compute: each loop, run as written on every row of random batches (env gaps,
padding, truncated rows with a bootstrap value, per-token penalties, garbage off model tokens), gives the
function's outputs to float64 rounding."""

from __future__ import annotations

import inspect
import textwrap

import pytest
import torch

from ragen.algorithms import gae as G
from ragen.algorithms.reference import random_inputs

SCALARS = {
    "gae": dict(gamma=0.9, lam=0.8),
    "turn_gae": dict(high_level_gamma=0.7, high_level_lam=0.6),
    "bilevel_gae": dict(gamma=0.9, lam=0.8, high_level_gamma=0.7, high_level_lam=0.6),
}


def docstring_loop(fn) -> str:
    """The code block after ``::`` in ``fn``'s docstring."""
    doc = inspect.getdoc(fn)
    assert doc is not None and "::\n" in doc, f"{fn.__name__}'s docstring shows no loop"
    return textwrap.dedent(doc.split("::\n", 1)[1])


def run_loop(code: str, inp, b: int, scalars: dict) -> tuple[list[float], list[float]]:
    """Run the loop on row ``b`` with the names its docstring defines; returns its (adv, ret)."""
    T = inp.token_rewards.shape[1]
    penalties = inp.token_penalties[b].tolist() if inp.token_penalties is not None else [0.0] * T
    names = dict(T=T, rewards=inp.token_rewards[b].tolist(), penalties=penalties, values=inp.values[b].tolist(),
                 mask=[bool(m) for m in inp.response_mask[b].tolist()], turn_ids=inp.turn_ids[b].tolist(),
                 boot=float(inp.bootstrap()[b]), **scalars)
    exec(code, names)
    return names["adv"], names["ret"]


@pytest.mark.parametrize(("name", "skip_env_tokens"),
                         [("gae", True), ("gae", False), ("turn_gae", None), ("bilevel_gae", None)])
@pytest.mark.parametrize("return_mode", ["adv_plus_value", "reward_to_go"])
@pytest.mark.parametrize("penalties", [False, True])
def test_the_docstring_loop_is_what_the_function_computes(name, skip_env_tokens, return_mode, penalties):
    fn = getattr(G, name)
    inp = random_inputs(12, seed=3, penalties=penalties, dense_reward_frac=0.3)
    scalars = dict(SCALARS[name], return_mode=return_mode)
    if name == "gae":
        scalars["skip_env_tokens"] = skip_env_tokens
        adv, ret = fn(inp.token_rewards, inp.values, inp.response_mask, bootstrap=inp.bootstrap(),
                      token_penalties=inp.token_penalties, **scalars)
    else:
        adv, ret = fn(inp.token_rewards, inp.values, inp.response_mask, inp.turn_ids, bootstrap=inp.bootstrap(),
                      token_penalties=inp.token_penalties, **scalars)
    code = docstring_loop(fn)
    rows = [run_loop(code, inp, b, scalars) for b in range(inp.token_rewards.shape[0])]
    assert inp.truncated.any() and (adv != 0).any()  # the batch exercises bootstraps and real advantages
    torch.testing.assert_close(adv, torch.tensor([a for a, _ in rows], dtype=adv.dtype), rtol=0, atol=1e-10)
    torch.testing.assert_close(ret, torch.tensor([r for _, r in rows], dtype=ret.dtype), rtol=0, atol=1e-10)
