"""``trainer.offload``: ``auto`` resolves to ``phase`` exactly where a rollout engine shares the training GPUs in the
PPO trainer; an explicit ``phase`` where it would move nothing, and unknown values, fail before anything starts."""

from __future__ import annotations

import pytest

from ragen.trainer.config.compose import compose, load_train_config, to_train_config
from ragen.trainer.config.run_shape import offload_mode
from ragen.trainer.config.schema import ConfigError
from ragen.trainer.config.shared_checks import check_offload


def _cfg(*overrides):
    return to_train_config(compose("base", list(overrides)))


def test_auto_offloads_where_an_engine_shares_the_training_gpus():
    gpu = ("trainer=gpu", "trainer.device=cuda")
    assert offload_mode(_cfg("trainer.device=cpu")) == "none"
    assert offload_mode(_cfg(*gpu)) == "phase"  # vLLM colocated
    assert offload_mode(_cfg(*gpu, "rollout.engine=hf")) == "phase"
    assert offload_mode(_cfg(*gpu, "rollout.vllm.placement=separate", "rollout.vllm.rollout_gpus=1")) == "none"
    assert offload_mode(_cfg(*gpu, "rollout.vllm.enable_sleep_mode=false")) == "none"
    assert offload_mode(_cfg(*gpu, "trainer.offload=none")) == "none"
    assert check_offload(_cfg(*gpu, "trainer.offload=phase")) == []


def test_phase_is_refused_where_it_would_move_nothing():
    from ragen.launch import validate

    with pytest.raises(ConfigError, match=r"trainer.offload='phase' has no effect: the workers run on CPU"):
        validate(load_train_config("ppo_bandit", ["trainer.device=cpu", "trainer.offload=phase"]))
    separate = _cfg("trainer=gpu", "trainer.device=cuda", "rollout.vllm.placement=separate",
                    "rollout.vllm.rollout_gpus=1", "trainer.offload=phase")
    assert "GPUs of its own" in check_offload(separate)[0]
    awake = _cfg("trainer=gpu", "trainer.device=cuda", "rollout.vllm.enable_sleep_mode=false", "trainer.offload=phase")
    assert "rollout.vllm.enable_sleep_mode=false" in check_offload(awake)[0]
    archer = _cfg("trainer=gpu", "trainer.device=cuda", "algorithm.name=archer", "trainer.offload=phase")
    assert "algorithm.name=archer" in check_offload(archer)[0]
    with pytest.raises(ValueError, match="trainer.offload='always' is unknown; use one of auto, none, phase"):
        _cfg("trainer.offload=always")
