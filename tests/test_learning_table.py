"""bench/learning_table.py's runs are real commands: every claim's every method composes and validates with the
overrides the bench passes, its run folder included (a Hydra override value)."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from ragen.launch import validate
from ragen.trainer.config.compose import load_train_config

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("learning_table", ROOT / "bench" / "learning_table.py")
table = importlib.util.module_from_spec(_spec)
sys.modules["learning_table"] = table  # dataclasses look their module up there
_spec.loader.exec_module(table)

RUNS = [(c, m) for c in table.CLAIMS for m in c.methods]


@pytest.mark.parametrize(("claim", "method"), RUNS, ids=[f"{c.name}/{m.name}" for c, m in RUNS])
def test_every_run_composes_and_validates(claim, method, tmp_path):
    folder = table.run_folder(tmp_path / "out dir", claim, method, 1)
    cmd = table.command(method, claim.panel, 1, folder)
    assert cmd[1:5] == ["-m", "ragen.train", "--config-name", method.config]
    cfg = load_train_config(method.config, cmd[5:])
    validate(cfg)
    assert (cfg.trainer.output_dir, cfg.trainer.seed) == (str(folder), 1)
    assert set(folder.relative_to(tmp_path / "out dir").as_posix()) <= set(
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-/")


def test_run_folders_are_distinct():
    folders = {table.run_folder(Path("out"), c, m, 0) for c, m in RUNS}
    assert len(folders) == len(RUNS)


def _rows(method: str, finals, starts=None):
    starts = starts or [0.0] * len(finals)
    return {method: [{"final": f, "start": s} for f, s in zip(finals, starts, strict=True)]}


def test_a_reading_claim_needs_mean_minus_sd_at_the_bar_and_its_control_under_it():
    claim = next(c for c in table.CLAIMS if c.name == "frozen_lake_3x3")
    method, control = (m.name for m in claim.methods)
    # bound 0.6875 -> bar 0.8375; method 0.9, 0.9, 0.96: mean 0.92, sd 0.0346 -> mean - sd 0.885 >= bar
    v = table.verdicts(claim, 0.6875, {**_rows(method, [0.9, 0.9, 0.96]), **_rows(control, [0.69, 0.62, 0.66])})
    assert v.bar == pytest.approx(0.8375) and v.holds is True, v.line
    # the same mean with a wide spread: 0.76, 1.0, 1.0 -> mean 0.92, sd 0.139 -> 0.781 < bar
    v = table.verdicts(claim, 0.6875, {**_rows(method, [0.76, 1.0, 1.0]), **_rows(control, [0.69, 0.62, 0.66])})
    assert v.holds is False and "mean - sd 0.78" in v.line
    # a control that reaches the bar (mean 0.85) sinks the claim
    v = table.verdicts(claim, 0.6875, {**_rows(method, [0.9, 0.9, 0.96]), **_rows(control, [0.85, 0.85, 0.85])})
    assert v.holds is False and "REACHES" in v.line
    # two seeds decide nothing
    v = table.verdicts(claim, 0.6875, {**_rows(method, [1.0, 1.0]), **_rows(control, [0.0, 0.0, 0.0])})
    assert v.holds is None and "2 of 3+ seeds run" in v.line


def test_a_credit_claims_bar_is_its_control_plus_the_margin():
    claim = next(c for c in table.CLAIMS if c.name == "delayed_choice")
    method, control = (m.name for m in claim.methods)
    v = table.verdicts(claim, 1.0, {**_rows(method, [1.0, 1.0, 0.9375]), **_rows(control, [0.0, 0.0, 0.0625])})
    assert v.bar == pytest.approx(0.0625 / 3 + 0.15) and v.holds is True, v.line


def test_an_expert_warm_start_claim_also_needs_the_rl_gain():
    claim = next(c for c in table.CLAIMS if c.name == "frozen_lake_3x3_expert")
    method, control = (m.name for m in claim.methods)
    blind = _rows(control, [0.69, 0.69, 0.62])
    # above the bar, but the warm start was already there: gains 0, 0, 0 -> not met
    v = table.verdicts(claim, 0.6875, {**_rows(method, [0.9, 0.9, 0.94], [0.9, 0.9, 0.94]), **blind})
    assert v.holds is False and "RL gain over the warm start +0.00" in v.line
    # gains 0.15, 0.1, 0.2: mean 0.15, sd 0.05 -> holds
    v = table.verdicts(claim, 0.6875, {**_rows(method, [0.9, 0.9, 0.94], [0.75, 0.8, 0.74]), **blind})
    assert v.holds is True, v.line


def test_a_threshold_claims_bar_is_its_learning_checks():
    """``bandit_async``: the bar is the bandit check's 0.8 whatever the open-loop bound (1.0 here: one arm always
    pays); every method needs mean - sd >= 0.8."""
    claim = next(c for c in table.CLAIMS if c.name == "bandit_async")
    names = [m.name for m in claim.methods]
    # 0.84, 0.88, 0.92: mean 0.88, sd 0.04 -> 0.84 >= 0.8
    good = {n: rows for name in names for n, rows in _rows(name, [0.84, 0.88, 0.92], [0.2, 0.3, 0.25]).items()}
    v = table.verdicts(claim, 1.0, good)
    assert v.bar == 0.8 and v.holds is True, v.line
    # the last method: 0.78, 0.88, 0.92 -> mean 0.86, sd 0.072 -> 0.788 < 0.8
    v = table.verdicts(claim, 1.0, {**good, **_rows(names[-1], [0.78, 0.88, 0.92], [0.2, 0.3, 0.25])})
    assert v.holds is False and "mean - sd 0.79" in v.line


# the claims the table showed holding (docs/benchmarks.md, "Learning table" and "Asynchronous training")
MET_CLAIMS = ["delayed_choice", "delayed_choice_async", "bandit_async"]


@pytest.mark.learning
@pytest.mark.timeout(4 * 3600)
@pytest.mark.parametrize("name", MET_CLAIMS)
def test_a_met_claim_holds_on_three_seeds_with_its_controls(name, tmp_path):
    """The bench's own protocol: every method and control of the claim on seeds 0, 1, 2, one run at a time."""
    claim = next(c for c in table.CLAIMS if c.name == name)
    rows: dict[str, list[dict]] = {}
    for seed in (0, 1, 2):
        for method in claim.methods:
            result = table.run_one(claim, method, seed, tmp_path)
            assert result["exit_code"] == 0, (tmp_path / "runs.log").read_text()[-3000:]
            rows.setdefault(method.name, []).append(result)
    bound, _ = table.open_loop_bound(table._compose(claim.methods[0], claim.panel), claim.bound_depth)
    verdict = table.verdicts(claim, bound, rows)
    assert verdict.holds is True, verdict.line


def test_the_balanced_twenty_questions_panel_bounds_fixed_guesses_at_one_half():
    """16 validation games over 8 objects with ``secret_order=cycle``: each object twice, so 4 fixed guesses win 8."""
    claim = next(c for c in table.CLAIMS if c.name == "twenty_questions_balanced")
    bound, how = table.open_loop_bound(table._compose(claim.methods[0], claim.panel))
    assert bound == 0.5 and "8 distinct secrets in 16 games" in how


def test_a_crashed_run_is_not_a_result(tmp_path):
    """A run that exited non-zero after its warm-start validation (here: a full disk at its first checkpoint) must
    not count that validation as its final score; a later finished run of the same seed does."""
    rec = {"claim": "c", "method": "m", "seed": 0, "start": 0.94, "final": 0.94, "minutes": 10.4}
    lines = [{**rec, "exit_code": 1}, {**rec, "seed": 1, "exit_code": 0, "final": 1.0}]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert [(r["seed"], r["final"]) for r in table.load_results(tmp_path)] == [(1, 1.0)]
    with open(tmp_path / "results.jsonl", "a") as f:
        f.write(json.dumps({**rec, "exit_code": 0, "final": 0.97}) + "\n")
    assert sorted((r["seed"], r["final"]) for r in table.load_results(tmp_path)) == [(0, 0.97), (1, 1.0)]


def test_the_per_seed_column_is_in_seed_order(tmp_path):
    """Runs finish in any order (two streams, re-runs); the report's per-seed values read seed 0, 1, 2."""
    claim = table.CLAIMS[0]
    recs = [{"claim": claim.name, "method": claim.methods[0].name, "seed": seed, "exit_code": 0, "start": 0.0,
             "final": final, "minutes": 1.0} for seed, final in [(2, 0.25), (0, 0.5), (1, 0.75)]]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert [r["seed"] for r in table.load_results(tmp_path)] == [0, 1, 2]
    text = table.report(tmp_path, (claim,), {claim.name: (0.5, "a fixed plan")})
    row = next(line for line in text.splitlines() if line.startswith(f"| {claim.name} | {claim.methods[0].name} |"))
    assert "| 0.50, 0.75, 0.25 |" in row
