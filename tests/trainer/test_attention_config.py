"""``model.attn_implementation`` in the trainer: validation refuses what cannot run (naming the key and the fix),
every worker group gets the value (the workers load their models with it: tests/workers/test_attention_packing.py),
and the start-up block (and so the dry run's plan) names the implementation and its packing."""

from __future__ import annotations

import importlib.machinery
import sys
import types

import pytest

from ragen.launch import validate
from ragen.trainer import builders
from ragen.trainer.config.compose import load_train_config
from ragen.trainer.config.schema import ConfigError
from ragen.trainer.config.shared_checks import check_attention


@pytest.fixture
def flash_installed(monkeypatch):
    module = types.ModuleType("flash_attn")
    module.__spec__ = importlib.machinery.ModuleSpec("flash_attn", loader=None)
    monkeypatch.setitem(sys.modules, "flash_attn", module)
    monkeypatch.delenv("RAGEN_NATIVE_BF16", raising=False)


def _cfg(*overrides: str):
    return load_train_config("base", list(overrides))


def test_flash_attention_is_refused_where_it_cannot_run(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn", None)
    with pytest.raises(ConfigError) as err:
        validate(_cfg("model.attn_implementation=flash_attention_2", "trainer.device=cpu"))
    text = str(err.value)
    assert "model.attn_implementation=flash_attention_2 cannot run here" in text
    assert "pip install flash-attn --no-build-isolation" in text and "trainer.device=cuda" in text
    with pytest.raises(ConfigError, match="model.attn_implementation='flex' is unknown; use one of auto, sdpa"):
        validate(_cfg("model.attn_implementation=flex"))
    for value in ("auto", "sdpa", "eager"):
        validate(_cfg(f"model.attn_implementation={value}"))


def test_flash_attention_needs_bf16_compute_for_every_role(flash_installed):
    gpu = ("model.attn_implementation=flash_attention_2", "trainer.device=cuda", "trainer.n_gpus_per_node=1")
    assert check_attention(_cfg(*gpu)) == []  # flash_attn installed, CUDA, auto precision: bf16
    (problem,) = check_attention(_cfg(*gpu, "critic.mixed_precision=fp32"))  # base: gae, a critic worker
    assert "critic.mixed_precision" in problem and "actor.mixed_precision" not in problem
    assert check_attention(_cfg(*gpu, "critic.mixed_precision=fp32", "algorithm=grpo")) == []  # no critic


def test_every_worker_group_gets_the_setting(monkeypatch):
    made = {}

    def record(train_cfg, worker_cls, role, placement_group=None, /, **kwargs):
        made[role] = kwargs["attn_implementation"]

    monkeypatch.setattr(builders, "make_group", record)
    builders.build_workers(_cfg("model.attn_implementation=eager", "ref.enable=true"), "model-dir")
    assert made == {"actor": "eager", "ref": "eager", "critic": "eager"}


def test_startup_block_names_the_implementation_and_packing(flash_installed, monkeypatch):
    line = builders.startup_block(_cfg("trainer.device=cpu"), "m").splitlines()[2]
    assert line == "[ragen] attention sdpa (4D-mask packing); auto: no CUDA device"
    assert "[ragen] attention eager (4D-mask packing)\n" in builders.startup_block(
        _cfg("model.attn_implementation=eager"), "m")
    gpu = ("trainer.device=cuda", "trainer.n_gpus_per_node=1")
    assert builders.attention_summary(_cfg(*gpu)) == \
        "[ragen] attention flash_attention_2 (position-id packing); auto: flash_attn installed, CUDA, bf16 compute"
    mixed = builders.attention_summary(_cfg(*gpu, "critic.mixed_precision=fp32"))
    assert mixed.startswith("[ragen] attention actor=flash_attention_2 (position-id packing), critic=sdpa (4D-mask "
                            "packing); auto: ")
