"""The supervised warm start through the trainer (tiny model, in-process): expert batches train the actor before
RL, the records and the step-0 checkpoint say so, a resume does not repeat it, and ``python -m ragen.sft`` writes a
checkpoint that PPO starts from."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from trainer_helpers import assert_all_finite, load_actor_weights, read_metrics, tiny_init_weights, tiny_overrides

from ragen.launch import run, validate
from ragen.trainer.config.compose import load_train_config
from ragen.trainer.config.schema import ConfigError

ROOT = Path(__file__).resolve().parents[2]
WARM = ["trainer.use_ray=false", "env=delayed_choice", "trainer.sft_warmup_steps=2", "sft.lr=1e-2", "sft.noise=0",
        "trainer.save_freq=0", "agent.response_prefix='<answer>'", "agent.think=false"]


@pytest.mark.slow
def test_warm_start_then_rl_and_resume_skips_it(tmp_path):
    run(load_train_config("ppo_bandit", [*tiny_overrides(tmp_path, 1), *WARM]))
    records = read_metrics(tmp_path)
    assert_all_finite(records)
    sft = [r for r in records if "sft/step" in r]
    assert [r["sft/step"] for r in sft] == [1.0, 2.0] and all(r["step"] == 0 for r in sft)
    assert sft[-1]["sft/nll"] < sft[0]["sft/nll"]  # the second batch (new seeds) is already likelier
    assert all(r["sft/env/delayed_choice/success"] == 1.0 for r in sft)  # the experts' own episodes
    vals = [r for r in records if "val/env/delayed_choice/success" in r]
    assert [r["step"] for r in vals] == [0, 0, 1] and vals[1].get("val/after_warm_start") == 1.0
    rollouts = tmp_path / "val_rollouts"  # the untrained and the warm-started step-0 episodes, side by side
    untrained, warmed = ([json.loads(x) for x in (rollouts / name).read_text().splitlines()]
                         for name in ("step_0.jsonl", "step_0_after_warm_start.jsonl"))
    assert len(untrained) == len(warmed) == 2  # rollout.val_n_groups=2 episodes, each once
    for eps, val in ((untrained, vals[0]), (warmed, vals[1])):
        assert sum(ep["success"] for ep in eps) / 2 == val["val/env/delayed_choice/success"]
    ckpt0 = tmp_path / "checkpoints" / "global_step_0"
    assert torch.load(ckpt0 / "trainer_state.pt", weights_only=False)["warm_started"] is True
    warm, init = load_actor_weights(ckpt0), tiny_init_weights()
    assert any(not torch.equal(warm[k], init[k]) for k in init)  # the warm start changed the policy
    assert any("actor/pg_loss" in r for r in records)  # then RL ran
    # resume: the warm start is not repeated; the records of step 0 and 1 are kept
    run(load_train_config("ppo_bandit", [*tiny_overrides(tmp_path, 2), *WARM]))
    again = read_metrics(tmp_path)
    assert [r["sft/step"] for r in again if "sft/step" in r] == [1.0, 2.0]
    assert max(r["step"] for r in again) == 2


def test_warm_start_config_errors(tmp_path):
    base = [*tiny_overrides(tmp_path, 1), "trainer.sft_warmup_steps=2"]
    with pytest.raises(ConfigError, match="response_prefix"):
        validate(load_train_config("ppo_bandit", [*base, "agent.response_prefix='<think>'"]))
    with pytest.raises(ConfigError, match="sft_warmup_steps=-1"):
        validate(load_train_config("ppo_bandit", [*tiny_overrides(tmp_path, 1), "trainer.sft_warmup_steps=-1"]))
    with pytest.raises(ConfigError, match="sft.noise"):
        load_train_config("ppo_bandit", [*base, "sft.noise=2"])
    validate(load_train_config("ppo_bandit", [*base, "trainer.total_steps=0"]))  # a warm start only is valid


@pytest.mark.slow
def test_sft_module_writes_a_checkpoint_ppo_starts_from(tmp_path, subprocess_env):
    out = tmp_path / "sft"
    cmd = [sys.executable, "-m", "ragen.sft", "--config-name", "ppo_bandit", *tiny_overrides(out, 1), *WARM]
    proc = subprocess.run(cmd, cwd=ROOT, env=subprocess_env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "warm start done" in proc.stdout
    actor = out / "checkpoints" / "global_step_0" / "actor"
    assert (actor / "config.json").is_file() and not (out / "checkpoints" / "global_step_1").exists()
    assert not any("actor/pg_loss" in r for r in read_metrics(out))  # no RL in a warm-start-only job
    rl = tmp_path / "rl"
    rl_overrides = [*tiny_overrides(rl, 1), "trainer.use_ray=false", "model.tiny=false", f"model.path={actor}",
                    "env=delayed_choice"]
    run(load_train_config("ppo_bandit", rl_overrides))
    start = load_actor_weights(actor.parent)
    assert any("actor/pg_loss" in r for r in read_metrics(rl))
    first = load_actor_weights(rl / "checkpoints" / "global_step_1")
    assert start.keys() == first.keys() and any(not torch.equal(start[k], first[k]) for k in start)


KL = [*WARM, "algorithm.kl_in_reward=true", "algorithm.kl_kind=k3"]


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("use_ray", [False, True], ids=["in-process", "ray"])
def test_the_kl_reference_is_the_warm_started_policy(tmp_path, lora, use_ray):
    """After a warm start the reference is the policy RL starts from, as when ``ragen sft`` and then
    ``model.path=<actor folder>`` run as two jobs: the first RL batch's KL is 0 (the reference worker reads the
    actor's weights, or a LoRA actor folds its adapters into the base, its adapters-off reference)."""
    overrides = [*tiny_overrides(tmp_path, 1), *KL, f"trainer.use_ray={str(use_ray).lower()}"]
    if lora:
        overrides += ["actor.lora_rank=4", "actor.lr=1e-2"]
    run(load_train_config("ppo_bandit", overrides))
    first = [r for r in read_metrics(tmp_path) if "actor/reward_kl_penalty" in r]
    assert first[0]["step"] == 1 and first[0]["actor/reward_kl_penalty"] == 0.0, first[0]
    if not lora:
        assert (tmp_path / "reference" / "model.safetensors").is_file()
        assert not (tmp_path / "reference" / "optimizer.pt").exists()  # the weights alone


@pytest.mark.slow
def test_a_resumed_run_keeps_the_warm_started_reference(tmp_path):
    """A run resumed after its warm start reads its reference again (``reference_dir``), so its second step's KL is
    the uninterrupted run's (a reference loaded from ``model.path`` would give another)."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    run(load_train_config("ppo_bandit", [*tiny_overrides(straight, 2), *KL]))
    run(load_train_config("ppo_bandit", [*tiny_overrides(resumed, 1), *KL]))
    run(load_train_config("ppo_bandit", [*tiny_overrides(resumed, 2), *KL]))

    def kl_of_step_2(run_dir):
        return [r["actor/reward_kl_penalty"] for r in read_metrics(run_dir) if r.get("step") == 2
                and "actor/reward_kl_penalty" in r]

    assert kl_of_step_2(resumed) == kl_of_step_2(straight) != [0.0]
