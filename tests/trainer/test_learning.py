"""Learning check: a few GRPO steps of the default model on a bandit raise validation success over fixed seeds."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from trainer_helpers import assert_all_finite, read_metrics

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bandit_success_rises_after_training(tmp_path):
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "RAY_ADDRESS"))}
    cmd = [sys.executable, "-m", "ragen.train", "--config-name", "bandit_learning_check",
           f"trainer.output_dir={run_dir}", "trainer.resume=none"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    records = read_metrics(run_dir)
    assert_all_finite(records)
    val = [(r["step"], r["val/env/bandit/success"]) for r in records if "val/env/bandit/success" in r]
    assert [s for s, _ in val] == [0, 4], val
    before, after = val[0][1], val[-1][1]
    # 32 fixed validation seeds; the untrained model almost never answers with a legal arm.
    assert before <= 0.2, val
    assert after >= before + 0.3, val
