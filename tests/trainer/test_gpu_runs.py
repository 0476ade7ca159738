"""GPU twins of the trainer runs: the multi-turn recipe (``ppo_multi_turn``) with ``trainer=gpu model=tiny`` and the
hf engine, actor, critic and engine colocated on one device (``device`` fixture: ``cpu`` every run, ``cuda`` under the
``gpu`` marker).

* 3 PPO steps with in-process workers (bf16 where the device has it: the ``auto`` precisions), and with Ray workers
  in the shared GPU placement group (CUDA only; skipped when ray is missing).
* A ``python -m ragen.train`` killed (SIGKILL) after its step-2 checkpoint and resumed equals an unbroken run at step
  3: fp32, ``trainer.deterministic=true`` (and ``CUBLAS_WORKSPACE_CONFIG``); the same rollouts and rewards, weights and
  Adam moments within ``RESUME_ATOL`` (a resume that lost the optimizer state, the lr schedule or the RNG would miss
  by about one step, lr 1e-3, or sample other episodes).
* A run logs to wandb offline (skipped when wandb is missing).

Every run reads its tokenizer from a folder (``model.tokenizer_path``), as on the GPU machine, which has no packaged
default model; the in-process runs check that no step reaches for that package.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from trainer_helpers import assert_all_finite, gpu_overrides, read_metrics

from ragen.ppo.trainer import PPOTrainer
from ragen.trainer.config.compose import load_train_config
from ragen.trainer.hosted import HostedEngines
from ragen.utils.checkpoint import latest_checkpoint

pytestmark = pytest.mark.slow  # multi-process or minutes-long: bash scripts/test.sh -m slow

ROOT = Path(__file__).resolve().parents[2]
NEEDS_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
AUTO_PRECISION = ("actor.mixed_precision=auto", "critic.mixed_precision=auto", "rollout.dtype=auto")


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update({f"{f.name}:{k}": v for k, v in load_file(f).items()})
    return out


def _check_run(out: Path, model_path: str, steps: int = 3) -> None:
    """Steps 1..steps logged with finite metrics, a complete last checkpoint whose actor moved off the initial
    weights."""
    records = read_metrics(out)
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    assert_all_finite(records)
    assert any(r["actor/grad_norm"] > 0 for r in records)
    ckpt = latest_checkpoint(out / "checkpoints")
    assert ckpt is not None and ckpt.name == f"global_step_{steps}"
    initial = {k.split(":", 1)[1]: v for k, v in _weights(Path(model_path)).items()}
    trained = {k.split(":", 1)[1]: v for k, v in _weights(ckpt / "actor").items()}
    assert max(float((trained[k].float() - initial[k].float()).abs().max()) for k in initial) > 0


def test_multi_turn_run_colocated_on_one_device(device, tmp_path, tokenizer_dir, no_packaged_model):
    out = tmp_path / "run"
    cfg = load_train_config("ppo_multi_turn", gpu_overrides(out, device, tokenizer_dir, 3, *AUTO_PRECISION))
    trainer = PPOTrainer(cfg)
    try:
        trainer.setup()
        actor, critic = trainer.run.workers["actor"].worker, trainer.run.workers["critic"].worker
        engine = actor.engine_host.engine  # the actor's rank hosts the engine, beside its model
        assert {actor.device.type, critic.device.type, engine.device.type} == {device}
        assert engine.prefix_store is not None  # multi-turn: KV caches kept across turns
        if device == "cuda":
            assert actor.device.index == critic.device.index == torch.cuda.current_device()
            assert engine.dtype == torch.bfloat16  # rollout.dtype=auto on a bf16 GPU
            torch.cuda.reset_peak_memory_stats()
        trainer.fit()
        if device == "cuda":
            assert torch.cuda.max_memory_allocated() > 0
    finally:
        trainer.shutdown()
    _check_run(out, trainer.run.model_path)
    last = read_metrics(out)[-1]
    kind = "allocated" if torch.cuda.is_available() and torch.cuda.is_initialized() else "rss"  # CUDA peaks or RSS
    peaks = [last[f"memory/{phase}/{kind}"] for phase in ("rollout", "actor_update")]
    assert all(p > 0 for p in peaks) or (device == "cpu" and kind == "allocated")  # (a CPU twin in a CUDA process)
    assert ("timing/offload" in last) == (device == "cuda")  # trainer.offload=auto: phase on CUDA only


@pytest.mark.gpu
@NEEDS_CUDA
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="missing ray")
def test_multi_turn_run_with_ray_workers_on_one_gpu(tmp_path, tokenizer_dir):
    import ray

    out = tmp_path / "run"
    cfg = load_train_config("ppo_multi_turn", gpu_overrides(out, "cuda", tokenizer_dir, 3, "trainer.use_ray=true",
                                                            "trainer.placement_timeout_s=60", *AUTO_PRECISION))
    trainer = PPOTrainer(cfg)
    try:
        trainer.setup()
        assert trainer.placement_group is not None  # the shared GPU placement group: one bundle, the one GPU
        bundles = ray.util.placement_group_table(trainer.placement_group)["bundles"]
        assert [b.get("GPU") for b in bundles.values()] == [1.0]
        assert isinstance(trainer.run.engine, HostedEngines) and trainer.run.engine.ranks == 1  # in the actor's rank
        trainer.fit()
    finally:
        trainer.shutdown()
        ray.shutdown()
    placed = json.loads((out / "placement.json").read_text())
    assert {role: len(ranks) for role, ranks in placed.items()} == {"actor": 1, "critic": 1}
    _check_run(out, trainer.run.model_path)


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="missing wandb")
def test_run_logs_to_wandb_offline(device, tmp_path, tokenizer_dir, monkeypatch):
    from ragen.launch import run

    monkeypatch.setenv("WANDB_MODE", "offline")
    out = tmp_path / "run"
    run(load_train_config("ppo_multi_turn", gpu_overrides(out, device, tokenizer_dir, 1,
                                                          "trainer.loggers=[console,jsonl,wandb]")))
    assert [r["step"] for r in read_metrics(out)] == [1]
    assert list((out / "wandb").glob("offline-run-*/run-*.wandb"))


# ---------------------------------------------------------------------------------------------- kill and resume
# CPU: bitwise reproducible. CUDA: ``trainer.deterministic`` warns rather than fails on kernels without a
# deterministic variant, and the memory-efficient attention backward is one (split-key accumulation): ~1e-7 relative
# noise per step, kept 100x below one lr-1e-3 step.
RESUME_ATOL = {"cpu": 1e-6, "cuda": 1e-5}
DETERMINISTIC = ("trainer.deterministic=true", "trainer.save_freq=1", "trainer.loggers=[jsonl]",
                 "trainer.report=false", "trainer.progress_bar=false")


def _launch(out: Path, device: str, tokenizer_dir: str, env: dict, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "ragen.train", "--config-name", "ppo_multi_turn",
           *gpu_overrides(out, device, tokenizer_dir, 3, *DETERMINISTIC, *extra)]
    with (out.parent / f"{out.name}.log").open("a") as log:  # the child keeps its own descriptor
        return subprocess.Popen(cmd, cwd=out.parent, env=env, stdout=log, stderr=subprocess.STDOUT)


def _kill_after_checkpoint(proc: subprocess.Popen, root: Path, step: int, timeout_s: float = 240) -> None:
    """SIGKILL ``proc`` as soon as its checkpoint of ``step`` is complete (polled every 5 ms)."""
    deadline = time.monotonic() + timeout_s
    while not (root / f"global_step_{step}").exists() or latest_checkpoint(root).name != f"global_step_{step}":
        assert proc.poll() is None, f"the run exited ({proc.returncode}) before its step-{step} checkpoint"
        assert time.monotonic() < deadline, f"no step-{step} checkpoint within {timeout_s} s"
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL


def test_resume_after_a_kill_equals_an_unbroken_run(device, tmp_path, tokenizer_dir, subprocess_env):
    env = {**subprocess_env, "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "WANDB_MODE": "offline",
           "PYTHONPATH": os.pathsep.join([str(ROOT), subprocess_env.get("PYTHONPATH", "")])}
    unbroken, broken = tmp_path / "unbroken", tmp_path / "broken"
    first = _launch(unbroken, device, tokenizer_dir, env)
    assert first.wait(timeout=600) == 0, (unbroken.parent / "unbroken.log").read_text()[-3000:]
    killed = _launch(broken, device, tokenizer_dir, env)
    try:
        _kill_after_checkpoint(killed, broken / "checkpoints", 2)
    finally:
        if killed.poll() is None:
            killed.kill()
    assert latest_checkpoint(broken / "checkpoints").name == "global_step_2", "the kill came after step 3's save"
    resumed = _launch(broken, device, tokenizer_dir, env, "trainer.resume=auto")
    assert resumed.wait(timeout=600) == 0, (broken.parent / "broken.log").read_text()[-3000:]
    a, b = latest_checkpoint(unbroken / "checkpoints"), latest_checkpoint(broken / "checkpoints")
    assert a.name == b.name == "global_step_3"
    ma, mb = read_metrics(unbroken), read_metrics(broken)
    assert [r["step"] for r in ma] == [r["step"] for r in mb] == [1, 2, 3]
    for key in ("rollout/seed_min", "rollout/seed_max", "reward/mean"):
        assert [r[key] for r in ma] == [r[key] for r in mb], key
    atol = RESUME_ATOL[device]
    for key in ("actor/pg_loss", "critic/vf_loss"):
        assert [r[key] for r in ma] == pytest.approx([r[key] for r in mb], abs=atol), key
    for role in ("actor", "critic"):
        wa, wb = _weights(a / role), _weights(b / role)
        assert wa and wa.keys() == wb.keys(), role
        worst = max(float((wa[k] - wb[k]).abs().max()) for k in wa)
        assert worst <= atol, f"{role} weights of the resumed run differ by {worst:.3g} on {device}"
        oa = torch.load(a / role / "optimizer.pt", weights_only=False)["optimizer"]["state"]
        ob = torch.load(b / role / "optimizer.pt", weights_only=False)["optimizer"]["state"]
        assert oa.keys() == ob.keys()
        for k in oa:
            for moment in ("exp_avg", "exp_avg_sq"):
                torch.testing.assert_close(oa[k][moment], ob[k][moment], atol=atol, rtol=0, msg=f"{role} {k}")
