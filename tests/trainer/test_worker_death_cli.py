"""A worker dies in a real CLI run: ``python -m ragen.train`` on Ray with ``trainer.max_restarts=0``, its
actor worker's process SIGKILLed after the step-1 checkpoint. The run exits non-zero naming the worker and the
phase, and ``trainer.resume=auto`` finishes it from that checkpoint. ~55 s on 2 cores (a Ray run, then an
in-process resume), so it runs with the long tests (``-m learning``)."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from trainer_helpers import read_metrics, tiny_overrides

ROOT = Path(__file__).resolve().parents[2]
RUN = ["--config-name", "ppo_bandit", "trainer.val_before_train=false", "trainer.val_freq=0", "trainer.report=false",
       "trainer.save_freq=1", "algorithm.estimator=grpo", "critic.enable=false", "trainer.max_restarts=0"]


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def _wait_for(path: Path, proc: subprocess.Popen, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert proc.poll() is None, f"the run ended before {path} appeared"
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout_s} s"
        time.sleep(0.2)


@pytest.mark.learning
def test_killed_actor_worker_stops_the_run_named_then_resume_finishes(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "ragen.train", *RUN, *tiny_overrides(out, 3)]
    with (tmp_path / "stderr.txt").open("w") as err:
        proc = subprocess.Popen([*cmd, "trainer.use_ray=true"], cwd=tmp_path, env=_env(),
                                stdout=subprocess.DEVNULL, stderr=err)
        try:
            _wait_for(out / "checkpoints" / "global_step_1" / "COMPLETE", proc)
            (actor,) = json.loads((out / "placement.json").read_text())["actor"]
            assert actor["pid"] != proc.pid  # a separate Ray worker process
            os.kill(actor["pid"], signal.SIGKILL)
            code = proc.wait(timeout=240)
        finally:
            if proc.poll() is None:
                proc.kill()
    stderr = (tmp_path / "stderr.txt").read_text()
    assert code != 0
    # named: which worker, doing what, in which phase of which step, and where to resume from
    match = re.search(r"WorkerFailure: actor worker rank 0 died during (\w+)\(\) .*; in phase '(\w+)' of step (\d)\. "
                      r"Last complete checkpoint: (\S+); rerun with trainer.resume=auto", stderr)
    assert match, stderr[-3000:]
    method, phase, step, ckpt = match.groups()
    # the actor's rank also hosts the engine (CPU), so the kill may land in the next step's rollout
    assert phase in ("rollout", "old_log_probs", "actor_update", "weight_sync", "memory_stats", "checkpoint"), phase
    assert int(step) >= 2 and Path(ckpt).name.startswith("global_step_")
    done = max(r["step"] for r in read_metrics(out))
    # resume=auto (in-process: the same checkpoint format) finishes steps done+1..3
    resumed = subprocess.run([*cmd, "trainer.use_ray=false", "trainer.resume=auto"], cwd=tmp_path, env=_env(),
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    steps = [r["step"] for r in read_metrics(out)]
    assert steps == [1, 2, 3] and done in (1, 2), steps
    assert (out / "checkpoints" / "global_step_3" / "COMPLETE").exists()
