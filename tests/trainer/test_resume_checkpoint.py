"""Resume equals a straight run; a kill while a checkpoint is written leaves the previous one loadable;
``trainer.val_only`` evaluates a checkpoint."""

import json
from pathlib import Path

import pytest
import torch
from trainer_helpers import assert_all_finite, load_actor_weights, read_metrics, tiny_overrides

from ragen.trainer.compose import load_train_config
from ragen.trainer.main import run
from ragen.trainer.ppo_trainer import PPOTrainer
from ragen.utils.checkpoint import latest_checkpoint

DETERMINISTIC = ["trainer.use_ray=false", "trainer.deterministic=true", "trainer.save_freq=1",
                 "trainer.val_before_train=false", "trainer.val_freq=0", "trainer.loggers=[jsonl]"]


def _cfg(out: Path, steps: int, *extra: str):
    return load_train_config("ppo_bandit", [*tiny_overrides(out, steps), *DETERMINISTIC, *extra])


def _state(ckpt: Path) -> dict:
    return torch.load(ckpt / "trainer_state.pt", weights_only=False)


def test_resume_matches_straight_run(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    run(_cfg(straight, 3))
    run(_cfg(resumed, 2))
    assert latest_checkpoint(resumed / "checkpoints").name == "global_step_2"
    run(_cfg(resumed, 3, "trainer.resume=auto"))
    a, b = latest_checkpoint(straight / "checkpoints"), latest_checkpoint(resumed / "checkpoints")
    assert a.name == b.name == "global_step_3"
    sa, sb = _state(a), _state(b)
    assert sa["step"] == sb["step"] == 3
    assert sa["proxy"] == sb["proxy"] and sa["proxy"]["train_calls"] == 3
    ma, mb = read_metrics(straight), read_metrics(resumed)
    assert [r["step"] for r in ma] == [r["step"] for r in mb] == [1, 2, 3]
    for key in ("rollout/seed_min", "rollout/seed_max", "reward/mean"):
        assert [r[key] for r in ma] == [r[key] for r in mb], key
    assert ma[0]["rollout/seed_min"] != ma[2]["rollout/seed_min"]  # seeds advance per step
    wa, wb = load_actor_weights(a), load_actor_weights(b)
    init = load_actor_weights(latest_checkpoint(straight / "checkpoints").parent / "global_step_2")
    for k in wa:
        assert torch.allclose(wa[k], wb[k], atol=1e-6, rtol=0), k
    assert any(not torch.equal(wa[k], init[k]) for k in wa)  # step 3 did change the weights
    cb = latest_checkpoint(resumed / "checkpoints")
    critic_a = sorted(p.name for p in (a / "critic").iterdir())
    assert critic_a == sorted(p.name for p in (cb / "critic").iterdir())
    assert_all_finite(mb)


def test_kill_during_checkpoint_keeps_previous_and_val_only(tmp_path):
    out = tmp_path / "run"
    cfg = _cfg(out, 1)
    trainer = PPOTrainer(cfg)
    trainer.setup()
    try:
        trainer.fit()
        assert latest_checkpoint(out / "checkpoints").name == "global_step_1"
        trainer.step = 2
        critic = trainer.workers["critic"]
        real_call = critic.call

        def dying_call(method, *args, **kw):
            if method == "save":  # the actor is already saved; the critic dies half-way through its files
                Path(kw["dir"]).mkdir(parents=True)
                (Path(kw["dir"]) / "model.safetensors").write_bytes(b"\0" * 100)
                raise KeyboardInterrupt("killed while writing the checkpoint")
            return real_call(method, *args, **kw)

        critic.call = dying_call
        with pytest.raises(KeyboardInterrupt):
            trainer.save_checkpoint()
    finally:
        trainer.shutdown()
    latest = latest_checkpoint(out / "checkpoints")
    assert latest.name == "global_step_1"
    assert (out / "checkpoints" / ".tmp_global_step_2").is_dir()  # the partial write, ignored
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(latest / "actor")
    assert torch.equal(model.state_dict()["model.norm.weight"], load_actor_weights(latest)["model.norm.weight"])
    # resume=auto picks the complete checkpoint; val_only evaluates it and dumps the rollouts
    metrics = run(_cfg(out, 1, "trainer.val_only=true", "trainer.resume=auto"))
    assert "val/env/bandit/success" in metrics and 0.0 <= metrics["val/env/bandit/success"] <= 1.0
    rows = [json.loads(line) for line in (out / "val_rollouts" / "step_1.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["env"] == "bandit" for r in rows)
    turn = rows[0]["turns"][0]
    assert set(turn) >= {"prompt", "response", "actions", "reward", "success"}
    assert isinstance(turn["response"], str) and isinstance(turn["actions"], list)
