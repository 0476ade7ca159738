"""Each launch script end to end with the tiny model for 2 steps, through the real entry point; and the direction
of the PPO step they run (a sign error in the update would still train, change weights and log finite metrics)."""

import json
import subprocess
from pathlib import Path

import pytest
import torch
from trainer_helpers import assert_all_finite, load_actor_weights, read_metrics, tiny_init_weights, tiny_overrides

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = [
    # script, extra overrides, env name, estimator
    ("train_ppo.sh", ["trainer.loggers=[console,jsonl,wandb]"], "bandit", "gae"),
    ("train_ppo_multi_turn.sh", ["env.max_turn=2"], "frozen_lake", "gae"),
    ("train_ppo_bilevel.sh", ["env.max_turn=2"], "frozen_lake", "bilevel_gae"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("script", "extra", "env_name", "estimator"), SCRIPTS, ids=[s[0] for s in SCRIPTS])
def test_launch_script_trains(tmp_path, subprocess_env, script, extra, env_name, estimator):
    run_dir = tmp_path / "run"
    cmd = ["bash", str(ROOT / script), *tiny_overrides(run_dir, warm_start=True), "trainer.save_freq=1", *extra]
    proc = subprocess.run(cmd, cwd=tmp_path, env=subprocess_env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    config = json.loads((run_dir / "config.json").read_text())
    assert (config["env"]["name"], config["algorithm"]["estimator"]) == (env_name, estimator)
    records = read_metrics(run_dir)
    warm = [r for r in records if "sft/step" in r]  # every launch script warm-starts by default (2 format-only steps)
    assert len(warm) == 2
    records = [r for r in records if r not in warm and not r.get("val/after_warm_start")]
    untrained = [0] if config["trainer"]["val_before_train"] else []  # the multi-turn scripts skip it (see config)
    assert [r["step"] for r in records] == [*untrained, 1, 2]
    assert any(r.get("val/after_warm_start") for r in read_metrics(run_dir))
    assert_all_finite(records)
    for key in (f"env/{env_name}/success", "actor/pg_loss", "critic/vf_loss", "timing/rollout",
                "timing/actor_update", "perf/tokens_per_s", f"val/env/{env_name}/success"):
        assert key in records[-1], key
    # the quiet console: start-up block, the key metrics per step, the final summary; the rest in train.log
    assert "actor/pg_loss" in proc.stdout and "actor/grad_norm" not in proc.stdout
    for line in ("[ragen] model", "[ragen] precision", "[ragen] estimator", "[ragen] run dir", "[ragen] done:",
                 "[ragen] checkpoint", "[ragen] log"):
        assert line in proc.stdout, line
    log = (run_dir / "train.log").read_text()
    assert "actor/grad_norm" in log and "saved checkpoint" in log
    for noise in ("Loading weights", "Token authentication", "FutureWarning", "(PolicyWorker"):
        assert noise not in proc.stdout + proc.stderr, noise
    # policy parameters changed and the final checkpoint loads with from_pretrained
    ckpt = run_dir / "checkpoints" / "global_step_2"
    final = load_actor_weights(ckpt)
    init = tiny_init_weights()
    common = sorted(set(final) & set(init))
    assert len(common) >= len(init) - 1
    changed = [k for k in common if not torch.equal(final[k], init[k])]
    assert len(changed) >= len(common) // 2, f"only {len(changed)}/{len(common)} tensors changed"
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(ckpt / "actor")
    assert torch.equal(model.state_dict()["model.norm.weight"], final["model.norm.weight"])
    assert (run_dir / "learning_curve.png").read_bytes()[:4] == b"\x89PNG"
    val = [json.loads(line) for line in (run_dir / "val_rollouts" / "step_2.jsonl").read_text().splitlines()]
    assert len(val) == 2 and {"prompt", "response", "actions", "reward", "success"} <= set(val[0]["turns"][0])
    if "wandb" in " ".join(extra):
        assert list((run_dir / "wandb").glob("offline-run-*")), "wandb should log offline without a key"


def test_ppo_step_moves_log_probs_along_the_advantages(tmp_path, monkeypatch):
    """One in-process step of train_ppo.sh's config: after the actor update, the log-probs of the batch's tokens
    rose where the advantages are positive and fell where they are negative. The tiny model's rewards are all
    equal (it never answers in format), so the estimator's output is replaced by +1 / -1 on alternate rows: what is
    tested is the trainer's path from the advantages to the update (tests/workers/test_update_direction.py checks a
    single worker; tests/algorithms the estimators' signs)."""
    from ragen.launch import run
    from ragen.trainer import credit
    from ragen.trainer.config.compose import load_train_config
    from ragen.workers import PolicyWorker

    seen, signs = [], []
    real_update, real_advantage = PolicyWorker.update, credit.compute_advantage

    def fixed_advantages(name, inputs, **kw):
        adv, ret = real_advantage(name, inputs, **kw)
        sign = torch.tensor([1.0 if r % 2 == 0 else -1.0 for r in range(adv.shape[0])])
        signs.append(sign)
        return sign[:, None] * inputs.response_mask.to(adv.dtype), ret

    def spy(self, batch, **kwargs):
        before = self.compute_log_probs(batch)
        out = real_update(self, batch, **kwargs)
        seen.append((batch, before, self.compute_log_probs(batch)))
        return out

    monkeypatch.setattr(credit, "compute_advantage", fixed_advantages)
    monkeypatch.setattr(PolicyWorker, "update", spy)
    run(load_train_config("ppo_bandit", [*tiny_overrides(tmp_path, 1), "trainer.use_ray=false",
                                         "trainer.val_before_train=false", "trainer.report=false"]))  # the report's
    # validation credit would call the estimator again
    (batch, before, after), = seen
    (sign,) = signs
    m = batch.response_mask.bool()
    # one epoch over one mini-batch, no correction, no report samples: exactly on-policy, so the step skipped its
    # old-log-prob pass and the update took its own detached log-probs as the old ones (ratio exactly 1)
    assert batch.old_log_probs is None
    torch.testing.assert_close(batch.advantages, sign[:, None] * batch.response_mask)  # rows kept in order
    adv, delta = batch.advantages, after - before
    assert float((delta * adv)[m].sum()) > 0
    assert float(delta[m & (adv > 0)].mean()) > 0 > float(delta[m & (adv < 0)].mean())
