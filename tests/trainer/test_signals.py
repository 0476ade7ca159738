"""Stopping a run by signal (``ragen.utils.interrupts``): Ctrl-C (SIGINT) and a scheduler's preemption (SIGTERM)
end a ``ragen train`` run with one line on the console, a checkpoint of the steps done, and exit status 130 / 143;
running the same command again resumes from that checkpoint."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pytest
from trainer_helpers import read_metrics, tiny_overrides

from ragen.utils.checkpoint import is_complete

# A plugin env whose reset, once the test has created the file SLOW, sleeps and says so in the file MARKER: the
# signal then lands in a rollout, between two complete steps, whatever the machine's speed.
SLOW_ENV = '''
import os
import time

from ragen.env import register
from ragen.env.bandit import BanditEnv


@register("slow_bandit")
class SlowBandit(BanditEnv):
    def reset(self, seed):
        if os.path.exists(os.environ["SLOW"]):
            open(os.environ["MARKER"], "a").close()
            time.sleep(2.0)
        return super().reset(seed)
'''


def _command(run_dir, steps: int) -> list[str]:
    return [sys.executable, "-m", "ragen.train", "--config-name", "ppo_bandit", *tiny_overrides(run_dir, steps),
            "trainer.use_ray=false", "trainer.val_before_train=false", "trainer.val_freq=0", "trainer.save_freq=0",
            "trainer.report=false", "trainer.loggers=[jsonl]", "imports=[slow_env]", "env.name=slow_bandit"]


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_the_run_with_one_line_a_checkpoint_and_its_own_status(tmp_path, subprocess_env, sig, status):
    (tmp_path / "slow_env.py").write_text(textwrap.dedent(SLOW_ENV))
    slow, marker = tmp_path / "slow", tmp_path / "marker"
    env = {**subprocess_env, "PYTHONPATH": f"{tmp_path}:{subprocess_env.get('PYTHONPATH', '')}", "SLOW": str(slow),
           "MARKER": str(marker)}
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(_command(run_dir, 20), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600
    while not ((run_dir / "metrics.jsonl").is_file() and read_metrics(run_dir)):  # a step done: slow down
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    slow.touch()
    while not marker.exists():  # inside a rollout now
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == status, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("[ragen] interrupted")]
    assert len(lines) == 1 and "Traceback" not in err and "the run failed" not in err, err[-3000:]
    done = int(lines[0].split(" complete step")[0].rsplit(" ", 1)[1])
    assert f"interrupted by {sig.name} in phase 'rollout' of step {done + 1} after {done} complete" in lines[0]
    assert done >= 1 and f"saved checkpoint {run_dir / 'checkpoints' / f'global_step_{done}'}" in lines[0]
    assert [r["step"] for r in read_metrics(run_dir)] == list(range(1, done + 1))
    assert is_complete(run_dir / "checkpoints" / f"global_step_{done}")
    slow.unlink()  # the same command again resumes from it
    again = subprocess.run(_command(run_dir, done + 1), env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert [r["step"] for r in read_metrics(run_dir)] == list(range(1, done + 2))
