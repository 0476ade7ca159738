"""The expert warm start (``trainer.sft_warmup_steps``, ``ragen.trainer.warm_start``) in the ArCHer trainer, with the
tiny policy and tiny encoder: BC on expert episodes moves the policy, step 0 logs untrained -> after warm start,
and a resumed run does not warm-start again."""

import pytest
import torch
from test_archer_runs import _overrides
from trainer_helpers import assert_all_finite, load_actor_weights, read_metrics, tiny_init_weights

from ragen.archer.main import run, validate_archer
from ragen.trainer.config.compose import load_train_config
from ragen.trainer.config.schema import ConfigError


def _warm(out, steps: int) -> list[str]:
    return [*_overrides(out, steps=steps), "trainer.sft_warmup_steps=2", "sft.lr=1e-2", "sft.epochs=1",
            "sft.noise=0", "trainer.val_before_train=true", "trainer.val_freq=0"]


def test_archer_warm_start_then_resume_without_repeating_it(tmp_path):
    run(load_train_config("archer_twenty_questions", _warm(tmp_path, steps=0)))
    records = read_metrics(tmp_path)
    assert_all_finite(records)
    assert all(r["step"] == 0 for r in records)
    sft = [r for r in records if "sft/nll" in r]
    assert [r["sft/step"] for r in sft] == [1.0, 2.0]
    assert sft[-1]["sft/nll"] < sft[0]["sft/nll"]  # lr 1e-2 on the tiny model: the expert's tokens get likelier
    # free-text questions: no random actions to draw (sft.noise > 0 is refused there), every turn is the expert's
    assert all(r["sft/noise_turns"] == 0 for r in sft)
    vals = [r for r in records if "val/reward/mean" in r]
    assert len(vals) == 2 and "val/after_warm_start" not in vals[0] and vals[1]["val/after_warm_start"] == 1.0
    for name in ("step_0.jsonl", "step_0_after_warm_start.jsonl"):  # untrained, then warm-started: 1 game each
        assert len((tmp_path / "val_rollouts" / name).read_text().splitlines()) == 1
    warm = tmp_path / "checkpoints" / "global_step_0"
    init, after = tiny_init_weights(), load_actor_weights(warm)
    assert any(not torch.equal(init[k].float(), after[k].float()) for k in init)
    assert torch.load(warm / "trainer_state.pt", weights_only=False)["warm_started"] is True

    run(load_train_config("archer_twenty_questions", _warm(tmp_path, steps=1)))  # resumes after the warm start
    records = read_metrics(tmp_path)
    assert sum("sft/nll" in r for r in records) == 2 and "actor/pg_loss" not in records[-1]  # warmup_iter=1
    assert records[-1]["step"] == 1 and "critic/q_loss" in records[-1] and "val/reward/mean" in records[-1]


def test_archer_warm_start_config_is_checked_before_any_worker_starts():
    """The PPO trainer's warm-start checks run for the ArCHer family too: the forced ``<answer>`` prefix of the
    config is not how an expert answer starts once thinking is on."""
    cfg = load_train_config("archer_twenty_questions", ["trainer.sft_warmup_steps=1", "agent.think=true"])
    with pytest.raises(ConfigError, match="agent.response_prefix='<answer>' is not how an expert answer starts"):
        validate_archer(cfg)
    validate_archer(load_train_config("archer_twenty_questions", ["trainer.sft_warmup_steps=1"]))
