"""Resume equals a straight run (actor and critic weights, optimizer moments, lr schedules); a kill while a
checkpoint is written leaves the previous one loadable; ``trainer.val_only`` evaluates the checkpoint's policy."""

import json
from pathlib import Path

import pytest
import torch
from trainer_helpers import assert_all_finite, load_actor_weights, read_metrics, tiny_overrides

from ragen.launch import run
from ragen.ppo.trainer import PPOTrainer
from ragen.trainer.config.compose import load_train_config
from ragen.utils.checkpoint import latest_checkpoint

pytestmark = pytest.mark.slow  # multi-process or minutes-long: bash scripts/test.sh -m slow

DETERMINISTIC = ["trainer.use_ray=false", "trainer.deterministic=true", "trainer.save_freq=1",
                 "trainer.val_before_train=false", "trainer.val_freq=0", "trainer.loggers=[jsonl]"]


# One optimizer step per trainer step (4 sequences, mini-batch 4), so the schedules are easy to follow by hand:
# actor: warmup 1, cosine to 0.1 * lr at step 3 -> multipliers 1, 1, 0.55 (then 0.1);
# critic: warmup 2, cosine to 0 at step 3 -> 0.5, 1, 1 (then 0). A scheduler restarted on resume would use
# 1 (actor) and 0.5 (critic) at step 3.
SCHEDULES = ["actor.lr_schedule=cosine", "actor.warmup_steps=1", "actor.total_steps=3", "actor.min_lr_ratio=0.1",
             "critic.lr_schedule=cosine", "critic.warmup_steps=2", "critic.total_steps=3"]
ACTOR_LRS, CRITIC_LRS = [1e-3, 1e-3, 5.5e-4], [5e-4, 1e-3, 1e-3]
GREEDY_VAL = "rollout.val_temperature=0"


def _cfg(out: Path, steps: int, *extra: str):
    return load_train_config("ppo_bandit", [*tiny_overrides(out, steps), *DETERMINISTIC, *extra])


def _state(ckpt: Path) -> dict:
    return torch.load(ckpt / "trainer_state.pt", weights_only=False)


def _weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update({f"{f.name}:{k}": v for k, v in load_file(f).items()})
    return out


def _assert_same_tree(a, b, path="", atol=1e-6):
    """Nested dicts / sequences / tensors / numbers are equal (tensors within ``atol``; a list equals a tuple:
    a loaded optimizer state has its betas as a list)."""
    seq = (list, tuple)
    assert type(a) is type(b) or (isinstance(a, seq) and isinstance(b, seq)), (path, type(a), type(b))
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _assert_same_tree(a[k], b[k], f"{path}/{k}", atol)
    elif isinstance(a, seq):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same_tree(x, y, f"{path}/{i}", atol)
    elif isinstance(a, torch.Tensor):
        assert a.shape == b.shape and a.dtype == b.dtype, path
        assert torch.allclose(a.float(), b.float(), atol=atol, rtol=0), (path, float((a - b).abs().max()))
    elif isinstance(a, float):
        assert a == pytest.approx(b, abs=1e-12), path
    else:
        assert a == b, path


def test_resume_matches_straight_run(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    run(_cfg(straight, 3, *SCHEDULES))
    run(_cfg(resumed, 2, *SCHEDULES))
    assert latest_checkpoint(resumed / "checkpoints").name == "global_step_2"
    run(_cfg(resumed, 3, *SCHEDULES, "trainer.resume=auto"))
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
    # the lr schedules continue where they stopped (the lr logged is the one each step used)
    for records in (ma, mb):
        assert [r["actor/lr"] for r in records] == pytest.approx(ACTOR_LRS, rel=1e-6)
        assert [r["critic/lr"] for r in records] == pytest.approx(CRITIC_LRS, rel=1e-6)
    for role, last_lr in (("actor", 1e-4), ("critic", 0.0)):
        oa = torch.load(a / role / "optimizer.pt", weights_only=False)
        ob = torch.load(b / role / "optimizer.pt", weights_only=False)
        assert oa["steps"] == ob["steps"] == 3, role
        for opt in (oa, ob):
            assert opt["scheduler"]["last_epoch"] == 3, role
            assert opt["scheduler"]["_last_lr"] == pytest.approx([last_lr], abs=1e-12), role
        _assert_same_tree(oa["scheduler"], ob["scheduler"], f"{role}/scheduler")
        # Adam moments and step counts of every parameter (1e-6: the weights themselves agree to that)
        _assert_same_tree(oa["optimizer"], ob["optimizer"], f"{role}/optimizer", atol=1e-6)
        moments = [v for v in oa["optimizer"]["state"].values() if isinstance(v, dict) and "exp_avg_sq" in v]
        assert moments and any(float(m["exp_avg_sq"].abs().max()) > 0 for m in moments), role
    # actor and critic weights equal a straight run's, and step 3 did change them
    before = a.parent / "global_step_2"
    for role in ("actor", "critic"):
        wa, wb, w2 = _weights(a / role), _weights(b / role), _weights(before / role)
        assert wa and wa.keys() == wb.keys() == w2.keys(), role
        for k in wa:
            assert torch.allclose(wa[k], wb[k], atol=1e-6, rtol=0), (role, k)
        assert any(not torch.equal(wa[k], w2[k]) for k in wa), role
    assert_all_finite(mb)


def test_kill_during_checkpoint_keeps_previous_and_val_only(tmp_path):
    out = tmp_path / "run"
    cfg = _cfg(out, 1, GREEDY_VAL, "actor.lr=1e-2")
    trainer = PPOTrainer(cfg)
    trainer.setup()
    try:
        trainer.fit()
        assert latest_checkpoint(out / "checkpoints").name == "global_step_1"
        trainer.run.step = 2
        critic = trainer.run.workers["critic"]
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
    # resume=auto picks the complete checkpoint; val_only evaluates it and dumps the rollouts. Validation decodes
    # greedily over fixed seeds, so it must reproduce the final validation of the training run, which used the
    # same (updated) policy: same episodes, same responses, same numbers.
    trained = [json.loads(line) for line in (out / "val_rollouts" / "step_1.jsonl").read_text().splitlines()]
    trained_metrics = next(r for r in read_metrics(out) if r["step"] == 1 and "val/reward/mean" in r)
    metrics = run(_cfg(out, 1, GREEDY_VAL, "trainer.val_only=true", "trainer.resume=auto"))
    rows = [json.loads(line) for line in (out / "val_rollouts" / "step_1.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["env"] == "bandit" for r in rows)
    turn = rows[0]["turns"][0]
    assert set(turn) >= {"prompt", "response", "actions", "reward", "success"}
    assert isinstance(turn["response"], str) and isinstance(turn["actions"], list)
    assert [(r["seed"], [t["response"] for t in r["turns"]]) for r in rows] == \
        [(r["seed"], [t["response"] for t in r["turns"]]) for r in trained]
    # same records; the token rows hold the same tokens, but their credit numbers differ: val_only runs no actor
    # or critic (the engine's log-probs stand in, no values or critic advantages)
    assert [{k: v for k, v in r.items() if k != "rows"} for r in rows] == \
        [{k: v for k, v in r.items() if k != "rows"} for r in trained]
    assert [[x["token_ids"] for x in r["rows"]] for r in rows] == [[x["token_ids"] for x in r["rows"]] for r in trained]
    for key in ("val/env/bandit/success", "val/env/bandit/reward", "val/reward/mean"):
        assert metrics[key] == pytest.approx(trained_metrics[key], abs=1e-9), key
    # ... and differs from the untrained policy's greedy responses (the checkpoint's weights were really used)
    fresh = run(_cfg(tmp_path / "fresh", 1, GREEDY_VAL, "trainer.val_only=true", "trainer.resume=none"))
    fresh_rows = [json.loads(line) for line in (tmp_path / "fresh" / "val_rollouts" / "step_0.jsonl").read_text()
                  .splitlines()]
    assert [r["seed"] for r in fresh_rows] == [r["seed"] for r in rows]
    assert [r["turns"][0]["response"] for r in fresh_rows] != [r["turns"][0]["response"] for r in rows]
    assert "val/reward/mean" in fresh
