"""kill -9 the REAL trainer during its checkpoint saves: ``python bench/faults.py --trainer``.

Each trial launches ``python -m ragen.train`` (the tiny random model, in-process workers, a checkpoint after every
step, ``trainer.resume=auto`` into the same run folder, so every trial after the first is a resume), waits until the
save of its first new step starts (its ``.tmp_global_step_N`` folder appears), sleeps a stratified random fraction
of 1.2 x a save's duration (measured first on uninterrupted launches) and sends SIGKILL. Then it checks what
``resume=auto`` picks: a complete checkpoint (marker written last), every file of it loadable, its trainer state's
step equal to the folder's, and at most the step being saved lost. A kill counts as resumed cleanly when that
holds and the next launch (a resume) reaches its own next save; after the last kill, a final resume must finish
the run with exit status 0.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from ragen.utils.checkpoint import checkpoint_step, is_complete, list_checkpoints, resolve_resume

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/fault_campaign.py, also when loaded by path
from fault_campaign import KEEP_LAST, KillReport, kill_phase, resumed_step  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TINY_RUN = [
    "--config-name", "ppo_bandit", "model=tiny", "trainer.sft_warmup_steps=0", "trainer.use_ray=false",
    "trainer.val_before_train=false", "trainer.val_freq=0", "trainer.report=false", "trainer.loggers=[jsonl]",
    "trainer.progress_bar=false", "trainer.save_freq=1", f"trainer.keep_last_ckpt={KEEP_LAST}",
    "algorithm.estimator=grpo", "critic.enable=false", "agent.max_new_tokens=12", "rollout.n_groups=2",
    "rollout.group_size=2", "rollout.val_n_groups=2", "actor.mini_batch_size=4", "actor.micro_batch_size=2",
    "actor.lr=1e-3", "trainer.num_threads=1", "actor.mixed_precision=fp32", "rollout.dtype=float32",
    "rollout.val_temperature=0.0", "trainer.resume=auto",
]


def latest_step(root: Path) -> int:
    """Step of the checkpoint ``trainer.resume=auto`` picks (0: none)."""
    path = resolve_resume("auto", root) if root.exists() else None
    return 0 if path is None else checkpoint_step(path)


def launch(out: Path, total_steps: int) -> subprocess.Popen:
    """The trainer on run folder ``out`` (resume=auto) until ``total_steps``; output to ``out/../trainer.log``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "ragen.train", *TINY_RUN, f"trainer.output_dir={out}",
           f"trainer.total_steps={total_steps}"]
    with (out.parent / "trainer.log").open("a") as log:
        return subprocess.Popen(cmd, cwd=out.parent, env=env, stdout=log, stderr=subprocess.STDOUT)


def _created_since(path: Path, since_ns: int) -> bool:
    try:
        return path.stat().st_ctime_ns >= since_ns
    except FileNotFoundError:
        return False


def wait_for_save(root: Path, step: int, proc: subprocess.Popen, timeout_s: float = 300.0,
                  poll_s: float = 0.001) -> float:
    """``time.perf_counter()`` when the save of ``step`` started: its temporary folder appeared, made by this
    launch (a killed earlier save leaves its own behind, which the new save replaces)."""
    since = time.time_ns() - 10_000_000  # proc was started just before; 10 ms of clock slack
    tmp, final = root / f".tmp_global_step_{step}", root / f"global_step_{step}"
    deadline = time.monotonic() + timeout_s
    while not _created_since(tmp, since) and not _created_since(final, since):
        if proc.poll() is not None:
            raise RuntimeError(f"the trainer exited ({proc.returncode}) before saving step {step}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no save of step {step} within {timeout_s} s")
        time.sleep(poll_s)
    return time.perf_counter()


def save_seconds(out: Path, launches: int = 3) -> float:
    """Median seconds of the first save of a fresh trainer process (temporary folder appears -> checkpoint
    installed), the save the kills hit: ``launches`` uninterrupted resumes of one step each (their checkpoints are
    kept: the kill trials resume from them). The first save of a process is slower than later ones (first use of
    the serialisation code), so a later save's duration would crowd the kills into the write."""
    root = out / "checkpoints"
    times = []
    for _ in range(launches):
        step = latest_step(root) + 1
        proc = launch(out, step)
        start = wait_for_save(root, step, proc)
        while not is_complete(root / f"global_step_{step}") and proc.poll() is None:
            time.sleep(0.001)
        times.append(time.perf_counter() - start)
        if proc.wait(timeout=300) != 0:
            raise RuntimeError(f"the calibration run failed; see {out.parent / 'trainer.log'}")
    return sorted(times)[len(times) // 2]


def verify(path: Path) -> int:
    """Load every file of a checkpoint like a resume would; returns its step (== its trainer state's)."""
    from safetensors.torch import load_file

    if not is_complete(path):
        raise AssertionError(f"{path} has no COMPLETE marker")
    step = checkpoint_step(path)
    tensors = list(path.rglob("*.safetensors"))
    if not tensors:
        raise AssertionError(f"{path}: no weights")
    for f in tensors:
        load_file(f)
    for f in path.rglob("*.pt"):
        torch.load(f, weights_only=False)
    state = torch.load(path / "trainer_state.pt", weights_only=False)
    if state["step"] != step:
        raise AssertionError(f"{path}: trainer state says step {state['step']}")
    return step


def run_trainer_kills(workdir: Path, kills: int, seed: int = 0) -> KillReport:
    """``kills`` SIGKILLs of ``python -m ragen.train`` spread over its checkpoint saves (see module docstring)."""
    rng = random.Random(seed)
    out = workdir / "run"
    out.mkdir(parents=True, exist_ok=True)
    root = out / "checkpoints"
    rep = KillReport(save_seconds=save_seconds(out))
    fracs = [(i + rng.random()) / kills * 1.2 for i in range(kills)]
    rng.shuffle(fracs)
    pending: tuple[str, int] | None = None  # the last kill, confirmed by the next launch reaching a save
    for frac in fracs:
        before = latest_step(root)
        proc = launch(out, before + 2)
        try:
            start = wait_for_save(root, before + 1, proc)
        except (RuntimeError, TimeoutError) as exc:
            proc.kill()
            proc.wait()
            if pending is not None:
                rep.failures.append(f"{pending[0]}: the resume after it failed: {exc}")
                rep.resumed -= 1
            pending = None
            continue
        pending = None
        time.sleep(max(0.0, start + frac * rep.save_seconds - time.perf_counter()))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        rep.tried += 1
        writing = before + 1
        rep.phases[kill_phase(root, writing)] += 1
        label = f"kill at {frac:.2f} x save of step {writing}"
        try:
            step = resumed_step(root, verify, before)
            if not before <= step <= writing:
                raise AssertionError(f"resumed step {step}, expected {before}..{writing}")
            for _, other in list_checkpoints(root):
                verify(other)
            rep.resumed += 1
            rep.lost_steps[writing - step] += 1
            pending = (label, step)
        except Exception as exc:  # noqa: BLE001 - a failed resume is the figure being measured
            rep.failures.append(f"{label}: {exc}")
    final = launch(out, latest_step(root) + 1)
    if final.wait(timeout=600) != 0 and pending is not None:
        rep.failures.append(f"{pending[0]}: the final resume exited {final.returncode}")
        rep.resumed -= 1
    return rep


def report(rep: KillReport, seconds: float) -> str:
    lines = [f"trainer kills: tried {rep.tried}, resumed cleanly {rep.resumed} (python -m ragen.train, tiny model; "
             f"one save ~{rep.save_seconds * 1000:.0f} ms; {seconds:.0f} s)",
             f"  kills by phase: {dict(rep.phases)}; steps lost -> kills: {dict(sorted(rep.lost_steps.items()))}"]
    lines += [f"  FAILED {line}" for line in rep.failures]
    return "\n".join(lines)
