"""A disk fault through the trainer: the checkpoint folder of a real CLI run (``python -m ragen.train``)
becomes read-only after the step-1 checkpoint. The step-2 save fails with ``CheckpointWriteError`` naming the folder,
the run exits non-zero, and checkpoint 1 stays complete and is what ``trainer.resume=auto`` picks.

Read-only for real: as root (where permission bits do not stop writes) the folder is a small tmpfs remounted
read-only; otherwise its permission bits are cleared."""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ragen.utils.checkpoint import is_complete, resolve_resume

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "trainer"))
from trainer_helpers import tiny_overrides  # noqa: E402

pytestmark = pytest.mark.slow  # multi-process or minutes-long: bash scripts/test.sh -m slow


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def _mount(ckpts: Path) -> bool:
    """As root: a 64 MiB tmpfs on ``ckpts`` (False when it cannot be mounted)."""
    if shutil.which("mount") is None:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(ckpts)],
                          capture_output=True).returncode == 0


def test_read_only_checkpoint_folder_mid_run_fails_cleanly(tmp_path):
    out = tmp_path / "run"
    ckpts = out / "checkpoints"
    ckpts.mkdir(parents=True)
    root = os.geteuid() == 0
    if root and not _mount(ckpts):
        pytest.skip("running as root without mount: a read-only folder cannot be made here")
    cmd = [sys.executable, "-m", "ragen.train", "--config-name", "ppo_bandit", *tiny_overrides(out, 3),
           "trainer.use_ray=false", "trainer.val_before_train=false", "trainer.val_freq=0", "trainer.report=false",
           "trainer.save_freq=1", "algorithm.estimator=grpo"]
    try:
        with (tmp_path / "stderr.txt").open("w") as err:
            proc = subprocess.Popen(cmd, cwd=tmp_path, env=_env(), stdout=subprocess.DEVNULL, stderr=err)
            try:
                deadline = time.monotonic() + 240
                while not (ckpts / "global_step_1" / "COMPLETE").exists():
                    assert proc.poll() is None and time.monotonic() < deadline, "no step-1 checkpoint"
                    time.sleep(0.05)
                if root:
                    subprocess.run(["mount", "-o", "remount,ro", str(ckpts)], check=True)
                else:
                    ckpts.chmod(0o555)
                code = proc.wait(timeout=240)
            finally:
                if proc.poll() is None:
                    proc.kill()
        stderr = (tmp_path / "stderr.txt").read_text()
        assert code != 0
        assert "CheckpointWriteError" in stderr and str(ckpts) in stderr, stderr[-3000:]
        assert "Read-only file system" in stderr or "Permission denied" in stderr, stderr[-3000:]
        assert is_complete(ckpts / "global_step_1") and not (ckpts / "global_step_2").exists()
        assert resolve_resume("auto", ckpts).name == "global_step_1"
        assert (ckpts / "global_step_1" / "actor" / "model.safetensors").stat().st_size > 0
    finally:
        if root:
            subprocess.run(["umount", str(ckpts)], check=False)
        else:
            ckpts.chmod(0o755)
