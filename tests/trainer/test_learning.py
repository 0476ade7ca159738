"""Learning checks: short runs of the default model whose validation success must rise (and, for the negative
controls, must not). Validation is on fixed seeds: greedy for delayed_choice, sampled for the bandit (a two-arm
policy's greedy score is 0 or 1 on the smallest preference; see config/bandit_gae_learning_check.yaml).

All are marked ``learning``: they run in ``scripts/learning_check.sh``, not in the default run (each takes 10-20
minutes of 2 CPU cores with fp32). The CI-sized checks of the same machinery are
tests/workers/test_critic_alignment.py (a trained critic gives the decisive token its advantage) and
tests/workers/test_update_direction.py (an update moves log-probs with the advantages' signs).
- PPO with token GAE and a critic on the bandit (train_ppo.sh's setting) and GRPO on the bandit, each after a
  format-only warm start and for both arm assignments (the warm-started model prefers one arm), and credit assignment
  across turns on ``delayed_choice`` (the door chosen at turn 1 decides a reward paid after turn 2) for
  bilevel_gae, turn_gae, gigpo and ms_grpo, each with a negative control that cannot carry the final reward back
  to turn 1 and must stay under the same threshold on the same seeds.
- ``train_ppo_multi_turn.sh`` and ``train_ppo_bilevel.sh`` as they run with no arguments: greedy validation success
  after RL at least 0.1 above the one after the warm start.
- An agent program (``agent_program_learning_check``, also marked ``slow``): the calculator example trained through
  the gateway after a warm start on its expert's demonstrations must reach 0.8 greedy validation success, and the
  same program with its calculator disabled must not.
Each run appends its figures to ``$RAGEN_LEARNING_RESULTS`` (if set) for the table that script prints.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from trainer_helpers import assert_all_finite, read_metrics

ROOT = Path(__file__).resolve().parents[2]


def learning_run(tmp_path: Path, config: str, overrides: list[str], label: str) -> tuple[float, float, list[dict]]:
    """Run ``python -m ragen.train --config-name config *overrides`` to completion; returns (validation success
    before, after, metrics records) and records the figures for the learning table."""
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "RAY_ADDRESS"))}
    cmd = [sys.executable, "-m", "ragen.train", "--config-name", config, f"trainer.output_dir={run_dir}",
           "trainer.resume=none", *overrides]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=2400)
    minutes = (time.perf_counter() - start) / 60
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    records = read_metrics(run_dir)
    assert_all_finite(records)
    # the first validation record (a warm start's own records come before it when validation waits for it)
    key = next(k for r in records for k in r if k.startswith("val/env/") and k.endswith("/success"))
    val = [(r["step"], r[key]) for r in records if key in r]
    assert len(val) >= 2 and val[0][0] == 0, val
    before, after = val[0][1], val[-1][1]
    warm = next((r[key] for r in records if key in r and r.get("val/after_warm_start")), None)
    out = os.environ.get("RAGEN_LEARNING_RESULTS")
    if out:
        with open(out, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"run": label, "config": config, "overrides": overrides, "before": before,
                                 "after_warm_start": warm, "after": after, "steps": val[-1][0],
                                 "minutes": round(minutes, 1)}) + "\n")
    return before, after, records


# Both arm assignments: the format-only warm start leaves the model preferring "dragon" (~78%), so only a policy
# that learns from the rewards which arm pays ends >= 0.8 in both.
BANDIT_ARMS = [
    ("dragon pays", []),
    ("phoenix pays", ["env.config.low_arm=dragon", "env.config.high_arm=phoenix"]),
]


@pytest.mark.learning
@pytest.mark.timeout(2700)
@pytest.mark.parametrize(("label", "overrides"), BANDIT_ARMS, ids=[a[0] for a in BANDIT_ARMS])
def test_bandit_gae_with_critic_learns(tmp_path, label, overrides):
    """train_ppo.sh's estimator (token GAE, critic) after a format-only warm start (random legal arms): sampled
    validation success on 64 fixed seeds ends >= 0.8 whichever arm pays. Against the warm-start prior (phoenix
    pays) the batches mix both arms for several steps, and there the critic must explain a positive share of the
    returns' variance; with the prior (dragon pays) every episode succeeds from step 2 on, the returns are constant
    and explained variance is undefined (not logged)."""
    before, after, records = learning_run(tmp_path, "bandit_gae_learning_check", overrides,
                                          f"bandit / gae + critic, {label}")
    warm = next(r["val/env/bandit/success"] for r in records if r.get("val/after_warm_start"))
    assert after >= 0.8, (label, before, warm, after)
    ev = [r["critic/vf_explained_var"] for r in records if "critic/vf_explained_var" in r]
    if label == "phoenix pays":
        assert ev and max(ev) > 0.0, ev


@pytest.mark.learning
@pytest.mark.timeout(2700)
@pytest.mark.parametrize(("label", "overrides"), BANDIT_ARMS, ids=[a[0] for a in BANDIT_ARMS])
def test_bandit_grpo_learns(tmp_path, label, overrides):
    before, after, records = learning_run(tmp_path, "bandit_learning_check", overrides, f"bandit / grpo, {label}")
    warm = next(r["val/env/bandit/success"] for r in records if r.get("val/after_warm_start"))
    assert after >= 0.8, (label, before, warm, after)


# (label, overrides, learns): the threshold is the same for a method and its control, on the same seeds.
CREDIT_RUNS = [
    ("bilevel_gae", ["algorithm=bilevel_gae"], True),
    ("bilevel_gae, gamma_H = 0 (control)", ["algorithm=bilevel_gae", "algorithm.high_level_gamma=0"], False),
    ("turn_gae", ["algorithm=turn_gae"], True),
    ("turn_gae, gamma_H = 0 (control)", ["algorithm=turn_gae", "algorithm.high_level_gamma=0"], False),
    ("gigpo", ["algorithm=gigpo"], True),
    ("ms_grpo", ["algorithm=ms_grpo"], True),
    ("ms_po, step rewards only (control)", ["algorithm=ms_po", "algorithm.discount_factor=0"], False),
]
# Greedy validation success on 16 seeds; the untrained model opens the bad door on all. The door order is shuffled
# per seed, so a policy that only learnt a position ("the first door listed") scores about 0.5: the threshold sits
# well above that, where only knowing which door pays gets.
CREDIT_THRESHOLD = 0.8


@pytest.mark.learning
@pytest.mark.timeout(2700)
@pytest.mark.parametrize(("label", "overrides", "learns"), CREDIT_RUNS, ids=[r[0] for r in CREDIT_RUNS])
def test_credit_assignment_across_turns(tmp_path, label, overrides, learns):
    before, after, _ = learning_run(tmp_path, "credit_learning_check", overrides, f"delayed_choice / {label}")
    assert before < CREDIT_THRESHOLD, (before, after)
    assert (after >= CREDIT_THRESHOLD) is learns, (label, before, after)


# The multi-turn launch scripts' default runs (FrozenLake 3x3, format-only warm start, 8 RL steps; no untrained
# validation, so the first validation is the one after the warm start): greedy validation success on 32 fixed maps
# must end at least RL_GAIN above it. The warm-started greedy policy wins on none of them; the best fixed 4-move
# plan wins on 69% (config/ppo_multi_turn.yaml).
RL_GAIN = 0.1


@pytest.mark.learning
@pytest.mark.timeout(2700)
@pytest.mark.parametrize("config", ["ppo_multi_turn", "ppo_bilevel"])
def test_multi_turn_launch_default_gains_over_its_warm_start(tmp_path, config):
    warm, after, records = learning_run(tmp_path, config, [], f"frozen_lake 3x3 / {config} default")
    assert any(r.get("val/after_warm_start") for r in records if r["step"] == 0)
    assert after >= warm + RL_GAIN, (config, warm, after)


# An agent program (config/agent_program_learning_check.yaml): the calculator example through the gateway, warm-started
# on its expert's demonstrations recorded through the same endpoint, then GRPO; greedy validation on 16 fixed
# questions whose answers all differ (a fixed answer wins at most 1 of 16). The control is the same program, expert
# and warm start with the calculator disabled: the answer is never in a prompt, so only arithmetic the 135M model
# cannot do would score.
PROGRAM_RUNS = [
    ("calculator", [], True),
    ("calculator disabled (control)", ["env.config.entry=ragen.gateway.examples.calculator:run_without_tool"], False),
]
PROGRAM_THRESHOLD = 0.8


@pytest.mark.learning
@pytest.mark.timeout(2700)
@pytest.mark.parametrize(("label", "overrides", "learns"), PROGRAM_RUNS, ids=[r[0] for r in PROGRAM_RUNS])
def test_an_agent_program_learns_to_use_its_tool(tmp_path, label, overrides, learns):
    before, after, records = learning_run(tmp_path, "agent_program_learning_check", overrides,
                                          f"agent_program / {label}")
    sft = [r for r in records if "sft/step" in r]
    assert sft and all(r["sft/env/agent_program/success"] == 1.0 for r in sft)  # the expert solves every question
    assert before < PROGRAM_THRESHOLD
    assert (after >= PROGRAM_THRESHOLD) is learns, (label, before, after)
    calls = [r["val/env/agent_program/turns"] for r in records if "val/env/agent_program/turns" in r]
    assert calls[0] == 1.0 and calls[-1] == 2.0  # untrained: one call, no tool; trained: a tool call, then the answer
