"""``model.attn_implementation`` resolution (ragen.models.attention) with a stand-in flash_attn package and CUDA device
name (the selection logic only; flash-attn's numbers are the GPU twin's, tests/workers/test_gpu_attention.py), and the
packing each resolved implementation takes."""

from __future__ import annotations

import importlib.machinery
import sys
import types

import pytest
import torch

from ragen.models import tiny_model
from ragen.models.attention import flash_attn_installed, flash_problems, resolve_attn_implementation
from ragen.models.packing import plan_packing


@pytest.fixture
def flash_installed(monkeypatch):
    """An importable (located) ``flash_attn`` module; nothing calls into it."""
    module = types.ModuleType("flash_attn")
    module.__spec__ = importlib.machinery.ModuleSpec("flash_attn", loader=None)
    monkeypatch.setitem(sys.modules, "flash_attn", module)
    monkeypatch.delenv("RAGEN_NATIVE_BF16", raising=False)


def test_auto_without_flash_attn_or_cuda_is_sdpa(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # import flash_attn fails
    assert not flash_attn_installed()
    assert resolve_attn_implementation("auto", "cpu") == ("sdpa", "no CUDA device")
    assert resolve_attn_implementation("auto", "cuda") == ("sdpa", "flash_attn is not installed")


def test_auto_with_flash_attn_on_cuda_in_bf16_is_flash_and_packs_by_position(flash_installed):
    assert flash_attn_installed()
    impl, why = resolve_attn_implementation("auto", torch.device("cuda"), "bf16")
    assert impl == "flash_attention_2" and "bf16" in why
    assert resolve_attn_implementation("auto", "cuda", "auto")[0] == "flash_attention_2"  # auto precision: bf16
    assert resolve_attn_implementation("auto", "cuda", "fp32")[0] == "sdpa"  # no fp32 flash kernels
    assert resolve_attn_implementation("auto", "cpu", "bf16")[0] == "sdpa"
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, 1000, (30,), generator=g)
    ids = torch.stack([prompt, prompt]).repeat(1, 2)
    mask = torch.ones_like(ids)
    mask[1, 50:] = 0
    plan = plan_packing(ids, mask, impl)
    assert plan.mask is None  # no dense mask for flash-attn
    assert plan.positions.tolist() == [list(range(60)) + list(range(50))]
    assert plan.cu_seqlens.tolist() == [0, 60, 110]
    # the 4D-mask packing instead: the 49 tokens the rows share once, then 11 and 1 of their own
    assert plan_packing(ids, mask, "sdpa").mask.shape == (1, 1, 61, 61)


def test_explicit_values_pass_through_and_unknown_ones_fail():
    for value in ("sdpa", "eager", "flash_attention_2"):
        assert resolve_attn_implementation(value, "cpu") == (value, "set explicitly")
    with pytest.raises(ValueError, match="model.attn_implementation='flex' is unknown"):
        resolve_attn_implementation("flex", "cpu")


def test_flash_problems_name_the_fix(monkeypatch, flash_installed):
    assert flash_problems("cuda", {"actor": "bf16", "critic": "auto"}) == []
    (fp32,) = flash_problems("cuda", {"actor": "bf16", "critic": "fp32"})
    assert "critic.mixed_precision" in fp32 and "actor.mixed_precision" not in fp32
    (cpu,) = flash_problems("cpu", {"actor": "bf16"})
    assert "CUDA device" in cpu and "trainer.device=cuda" in cpu
    monkeypatch.setitem(sys.modules, "flash_attn", None)
    (missing,) = flash_problems("cuda", {"actor": "bf16"})
    assert "pip install flash-attn --no-build-isolation" in missing


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_models_load_with_the_implementation(default_tokenizer, tmp_path, impl):
    from ragen.models import load_model
    from ragen.models.value_head import ValueModel

    tiny = tiny_model(tokenizer=default_tokenizer, attn_implementation=impl)
    assert tiny.config._attn_implementation == impl
    tiny.save_pretrained(tmp_path / "lm")
    default_tokenizer.save_pretrained(tmp_path / "lm")
    assert load_model(str(tmp_path / "lm"), attn_implementation=impl).config._attn_implementation == impl
    ValueModel.from_causal_lm(tiny).save(tmp_path / "critic")
    critic = ValueModel.load(tmp_path / "critic", attn_implementation=impl)
    assert critic.backbone.config._attn_implementation == impl
