"""The fused CPU kernel of the GAE family (ragen.algorithms.fused, _gae_kernel.cpp).

Its numbers are checked against the loop references by every estimator test (conftest.py runs them on both
paths); here: that it is built and taken, that it agrees with the tensor path on long rows in both dtypes and on
unusual input dtypes/layouts, and that contract violations name the row and position.
"""

import contextlib
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from ragen.algorithms import AdvantageInputs, compute_advantage, fused
from ragen.algorithms.gae import bilevel_gae, gae
from ragen.algorithms.reference import random_inputs

NAMES = ["gae", "turn_gae", "bilevel_gae", "weighted_gae"]


def test_kernel_is_built_and_taken_on_cpu():
    assert fused.available(), "ragen.algorithms._gae_kernel is missing: run `pip install -e .` with a C++ compiler"
    x = torch.zeros(2, 3)
    assert fused.usable(x, x, None)
    with fused.disabled():
        assert not fused.usable(x, x)
    assert fused.usable(x, x)
    assert not fused.usable(x.view(6))  # (B, T) tensors only


def test_a_build_older_than_its_source_is_not_used(tmp_path):
    source = Path(fused.__file__).with_name("_gae_kernel.cpp")
    copy = tmp_path / "_gae_kernel.cpp"
    copy.write_bytes(source.read_bytes())
    assert fused._load_kernel(copy) is not None  # same source: the build is current
    copy.write_bytes(source.read_bytes() + b"// edited\n")
    with pytest.warns(RuntimeWarning, match="older _gae_kernel.cpp.*pip install -e"):
        assert fused._load_kernel(copy) is None


def test_a_missing_kernel_warns_once_and_falls_back(monkeypatch):
    inp = random_inputs(3, seed=2, dtype=torch.float64)
    want = compute_advantage("bilevel_gae", inp, lam=0.9)
    monkeypatch.setattr(fused, "_gae_kernel", None)
    monkeypatch.setitem(fused._state, "warned", False)
    with pytest.warns(RuntimeWarning, match="not built.*pip install -e"):
        got = compute_advantage("bilevel_gae", inp, lam=0.9)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once only
        compute_advantage("bilevel_gae", inp, lam=0.9)


def test_environment_switch_forces_the_tensor_path():
    code = "from ragen.algorithms import fused; import torch; print(fused.usable(torch.zeros(1, 1)))"
    env = dict(os.environ, RAGEN_FUSED_GAE="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _both_paths(name, inp, **params):
    fast = compute_advantage(name, inp, **params)
    with fused.disabled():
        slow = compute_advantage(name, inp, **params)
    return fast, slow


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype,atol", [(torch.float32, 2e-5), (torch.float64, 1e-9)])
@pytest.mark.parametrize("params", [
    dict(gamma=1.0, lam=1.0), dict(gamma=0.99, lam=0.95, high_level_gamma=0.9, high_level_lam=0.8),
    dict(gamma=0.9, lam=0.7, skip_env_tokens=False, return_mode="reward_to_go"),
])
def test_agrees_with_tensor_path_on_long_rows(name, dtype, atol, params):
    inp = random_inputs(6, seed=5, min_turns=8, max_turns=12, model_len=(30, 120), env_len=(0, 40),
                        dense_reward_frac=0.2, dtype=dtype)
    (adv, ret), (adv_t, ret_t) = _both_paths(name, inp, **params)
    assert adv.dtype == ret.dtype == dtype
    torch.testing.assert_close(adv, adv_t, atol=atol, rtol=0)
    torch.testing.assert_close(ret, ret_t, atol=atol, rtol=0)
    assert bool(adv[inp.response_mask > 0].abs().sum() > 0)


@pytest.mark.parametrize("name", NAMES)
def test_input_dtypes_and_layouts_are_converted(name):
    inp = random_inputs(5, seed=9, max_turns=4, dtype=torch.float64)
    base, _ = _both_paths(name, inp, gamma=0.9, lam=0.8)
    wide = lambda x: torch.cat([x, x], dim=1)[:, : x.shape[1]]  # noqa: E731 - non-contiguous view of x
    odd = AdvantageInputs(
        token_rewards=wide(inp.token_rewards), response_mask=wide(inp.response_mask.float()),
        turn_ids=wide(inp.turn_ids.int()), values=wide(inp.values), truncated=inp.truncated,
        attention_mask=inp.attention_mask,
    )
    assert not odd.values.is_contiguous()
    adv, ret = compute_advantage(name, odd, gamma=0.9, lam=0.8)
    torch.testing.assert_close(adv, base[0], atol=1e-12, rtol=0)
    torch.testing.assert_close(ret, base[1], atol=1e-12, rtol=0)
    half = AdvantageInputs(**{**inp.__dict__, "token_rewards": inp.token_rewards.bfloat16(),
                              "values": inp.values.bfloat16()})
    (adv16, _), (adv16_t, _) = _both_paths(name, half, gamma=0.9, lam=0.8)
    assert adv16.dtype == torch.float32  # promoted to at least float32, as on the tensor path
    torch.testing.assert_close(adv16, adv16_t, atol=2e-5, rtol=0)


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.uint8, torch.int32, torch.int64, torch.float32])
def test_every_mask_dtype_gives_the_same_result(mask_dtype):
    inp = random_inputs(6, seed=4, max_turns=4, env_len=(0, 3), dtype=torch.float64)
    want = compute_advantage("bilevel_gae", inp, gamma=0.9, lam=0.8)
    masked = AdvantageInputs(**{**inp.__dict__, "response_mask": inp.response_mask.to(mask_dtype)})
    for got, ref in zip(compute_advantage("bilevel_gae", masked, gamma=0.9, lam=0.8), want, strict=True):
        torch.testing.assert_close(got, ref, atol=0, rtol=0)


@pytest.mark.parametrize("name", NAMES)
def test_negative_mask_entries_are_off_the_mask_as_on_the_tensor_path(name):
    inp = random_inputs(5, seed=8, max_turns=4, dtype=torch.float64)
    want = compute_advantage(name, inp, gamma=0.9, lam=0.8)
    neg = inp.response_mask.where(inp.response_mask > 0, -1)  # -1 instead of 0 off the model tokens
    signed = AdvantageInputs(**{**inp.__dict__, "response_mask": neg})
    for path in (fused.disabled(), contextlib.nullcontext()):
        with path:
            got = compute_advantage(name, signed, gamma=0.9, lam=0.8)
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


def test_mismatched_shapes_raise_instead_of_reading_out_of_bounds():
    r, v, ids = torch.zeros(2, 8), torch.zeros(2, 8), torch.full((2, 8), -1)
    with pytest.raises(ValueError, match=r"turn_ids must have the shape of token_rewards \(2, 8\), got \(2, 4\)"):
        bilevel_gae(r, v, ids >= 0, ids[:, :4])
    with pytest.raises(ValueError, match="bootstrap must be a \\(2,\\) tensor"):
        bilevel_gae(r, v, ids >= 0, ids, bootstrap=torch.zeros(3))


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.int64])
def test_gae_without_turn_ids_uses_the_runs_of_the_mask(mask_dtype):
    inp = random_inputs(6, seed=6, max_turns=5, env_len=(0, 3), dense_reward_frac=0.5, dtype=torch.float64)
    want = compute_advantage("gae", inp, gamma=0.9, lam=0.8)  # passes turn_ids: units are the turns
    got = gae(inp.token_rewards, inp.values, inp.response_mask.to(mask_dtype), gamma=0.9, lam=0.8,
              bootstrap=inp.bootstrap_values())
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


def _layout(tids):
    """(1, T) inputs whose mask is turn_ids >= 0 (before any corruption)."""
    tid = torch.tensor([tids])
    return AdvantageInputs(torch.ones(tid.shape), (tid >= 0).long(), tid, values=torch.zeros(tid.shape))


@pytest.mark.parametrize("name", NAMES)
def test_contract_errors_name_row_and_position(name):
    inp = random_inputs(3, seed=1, max_turns=3, env_len=(1, 3))
    mask = inp.response_mask.clone()
    pos = int((mask[1] == 0).nonzero()[-1])  # an env/pad position of row 1 becomes a "model token"
    mask[1, pos] = 1
    bad = AdvantageInputs(**{**inp.__dict__, "response_mask": mask})
    with pytest.raises(ValueError, match=f"disagree at row 1, position {pos} "):
        compute_advantage(name, bad)
    for mask, tid in (([1, 1, 0], [0, 0, 1]), ([1, 1, 1], [0, 0, -1])):  # turn id off / -1 on a model token
        inp = AdvantageInputs(torch.ones(1, 3), torch.tensor([mask]), torch.tensor([tid]), values=torch.zeros(1, 3))
        with pytest.raises(ValueError, match="disagree at row 0, position 2"):
            compute_advantage(name, inp)
    with pytest.raises(ValueError, match=r"must number each row.s turns.*row 0, position 3"):
        compute_advantage(name, _layout([0, 0, -1, 2, 2]))  # turn 1 missing
    with pytest.raises(ValueError, match=r"must number each row.s turns.*row 0, position 3"):
        compute_advantage(name, _layout([0, 0, -1, 0, 0]))  # turn 0 split in two runs
    with pytest.raises(ValueError, match=r"must number each row.s turns.*row 0, position 2"):
        compute_advantage(name, _layout([0, 1, 0]))  # turns out of order, touching


def test_adjacent_turns_without_env_gap_are_separate_turns():
    # Turns 0 and 1 touch: the turn-level values must treat them as two steps (DESIGN.md bi-level example).
    r = torch.zeros(1, 10, dtype=torch.float64)
    r[0, 4] = r[0, 9] = 1.0
    inp = AdvantageInputs(r, torch.ones(1, 10, dtype=torch.long), torch.tensor([[0] * 5 + [1] * 5]),
                          values=torch.arange(1, 11, dtype=torch.float64)[None] / 10)
    adv, ret = compute_advantage("bilevel_gae", inp, gamma=1.0, lam=1.0, high_level_gamma=0.95, high_level_lam=1.0)
    want = torch.tensor([[1.85, 1.75, 1.65, 1.55, 1.45, 0.4, 0.3, 0.2, 0.1, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(adv, want, atol=1e-12, rtol=0)
    torch.testing.assert_close(ret, torch.tensor([[1.95] * 5 + [1.0] * 5], dtype=torch.float64), atol=1e-12, rtol=0)
