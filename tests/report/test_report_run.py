"""The run report end to end with the tiny model (in-process workers): the trainer saves token credit and writes the
pages at each validation, links resolve, the saved advantages are the ones the estimator produced, and
``python -m ragen.report`` rebuilds byte-identical pages."""

import json
import re
import subprocess
import sys

import pytest
import torch
from report_helpers import block_id, episode_blocks, model_token_count, tiny_overrides, token_spans

from ragen.launch import run
from ragen.report.episodes import NEUTRAL
from ragen.trainer import credit
from ragen.trainer.config.compose import load_train_config

pytestmark = pytest.mark.slow  # multi-process or minutes-long: bash scripts/test.sh -m slow

FAST = ["trainer.use_ray=false", "trainer.sft_warmup_steps=0", "env.max_turn=2", "trainer.val_freq=1",
        "trainer.val_before_train=true"]


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _check_page(page: str, val: list[dict], train: list[dict]) -> None:
    blocks = episode_blocks(page)
    assert [block_id(b) for b in blocks] == [f"val-{i}" for i in range(len(val))] + \
        [f"train-{i}" for i in range(len(train))]
    for block, rec in zip(blocks, val + train, strict=True):
        if "rows" not in rec:  # a validation episode beyond trainer.report_val_samples: text only
            assert not token_spans(block) and '<span class="plain">' in block
            continue
        assert len(token_spans(block)) == model_token_count(rec) > 0
        assert f'data-success="{int(rec["success"])}"' in block


def test_trainer_writes_report_and_cli_rebuilds_it(tmp_path, monkeypatch, subprocess_env):
    seen = []
    real = credit.advantages

    def spy(estimator, batch, *args, **kw):
        adv, ret = real(estimator, batch, *args, **kw)
        seen.append((batch, adv, ret))
        return adv, ret

    monkeypatch.setattr(credit, "advantages", spy)
    run(load_train_config("ppo_multi_turn", [*tiny_overrides(tmp_path, 2), *FAST]))
    report = tmp_path / "report"
    assert sorted(p.name for p in report.iterdir()) == ["index.html", "step_0.html", "step_1.html", "step_2.html"]
    index = (report / "index.html").read_text()
    assert sorted(set(re.findall(r"href='(step_\d+\.html)'", index))) == ["step_0.html", "step_1.html", "step_2.html"]
    assert "<svg" in index and "frozen_lake: success" in index and "actor_update" in index

    # calls: validation 0, train 1, validation 1, train 2, validation 2 (trajectory layout: one row per episode)
    assert len(seen) == 5
    for step in (0, 1, 2):
        val = _records(tmp_path / "val_rollouts" / f"step_{step}.jsonl")
        train = _records(tmp_path / "train_samples" / f"step_{step}.jsonl") if step else []
        assert len(val) == 2 and len(train) == (4 if step else 0)  # val_n_groups=2; report_train_samples=4 of 4
        for recs, (batch, adv, ret) in ((val, seen[2 * step]), (train, seen[2 * step - 1] if step else (None,) * 3)):
            for i, rec in enumerate(recs):
                row = rec["rows"][0]
                n = len(row["token_ids"])
                assert row["token_ids"] == batch.input_ids[i, :n].tolist()
                torch.testing.assert_close(torch.tensor(row["advantages"]), adv[i, :n].float(), rtol=1e-5, atol=1e-6)
                torch.testing.assert_close(torch.tensor(row["returns"]), ret[i, :n].float(), rtol=1e-5, atol=1e-6)
                mask = torch.tensor(row["response_mask"]).bool()
                lp = torch.tensor(row["log_probs"])
                assert bool((lp[mask] <= 0).all()) and bool((lp[mask] < 0).any())
                assert row["values"] is not None and len(row["pieces"]) == n
        page = (report / f"step_{step}.html").read_text()
        assert 'href="index.html"' in page
        _check_page(page, val, train)

    before = {p.name: p.read_bytes() for p in report.iterdir()}
    for p in report.iterdir():
        p.unlink()
    out = subprocess.run([sys.executable, "-m", "ragen.report", str(tmp_path)], env=subprocess_env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert {p.name: p.read_bytes() for p in report.iterdir()} == before


def test_turn_layout_and_val_only(tmp_path):
    """Turn layout: one record per episode whose rows are its turns. Then ``val_only`` (no workers): the page is
    written with neutral tokens, since gae has no critic values to assign advantages with."""
    run(load_train_config("ppo_multi_turn", [*tiny_overrides(tmp_path, 1), *FAST, "agent.layout=turn",
                                             "trainer.val_before_train=false"]))
    val = _records(tmp_path / "val_rollouts" / "step_1.jsonl")
    train = _records(tmp_path / "train_samples" / "step_1.jsonl")
    assert len(val) == 2 and len(train) == 4
    for rec in val + train:
        assert len(rec["rows"]) == len(rec["turns"]) >= 1
        assert [r["turn_ids"][r["response_mask"].index(1)] for r in rec["rows"]] == list(range(len(rec["rows"])))
    _check_page((tmp_path / "report" / "step_1.html").read_text(), val, train)

    run(load_train_config("ppo_multi_turn", [*tiny_overrides(tmp_path / "eval", 1), *FAST, "trainer.val_only=true",
                                             "trainer.resume=none"]))
    val = _records(tmp_path / "eval" / "val_rollouts" / "step_0.jsonl")
    assert all(r["rows"][0]["advantages"] is None and r["rows"][0]["log_probs"] is not None for r in val)
    page = (tmp_path / "eval" / "report" / "step_0.html").read_text()
    _check_page(page, val, [])
    assert {color for block in episode_blocks(page) for color, _ in token_spans(block)} == {NEUTRAL}


def test_report_val_samples_runs_only_the_picked_episodes_with_the_same_credit(tmp_path, monkeypatch):
    """``trainer.report_val_samples=2`` of 5 validation episodes: episodes 0 and 2 (spread evenly) are saved with
    token rows whose log-probs, values and advantages equal those of a run that puts every episode through the
    workers (the estimator still sees the whole batch); the others are text only; the workers saw 2 rows. With
    ``algorithm.whiten`` the two are whitened among themselves: same log-probs and values, advantages of mean 0."""
    from ragen.workers.actor import PolicyWorker

    rows_seen = []
    real = PolicyWorker.compute_log_probs

    def spy(self, batch, *a, **kw):
        rows_seen.append(int(batch.response_mask.any(-1).sum()))  # rows with model tokens (not padding rows)
        return real(self, batch, *a, **kw)

    monkeypatch.setattr(PolicyWorker, "compute_log_probs", spy)
    runs = {}
    for name, extra in (("all", ["trainer.report_val_samples=null", "algorithm.whiten=false"]),
                        ("two", ["trainer.report_val_samples=2", "algorithm.whiten=false"]),
                        ("whiten", ["trainer.report_val_samples=2", "algorithm.whiten=true"])):
        rows_seen.clear()
        run(load_train_config("ppo_multi_turn", [*tiny_overrides(tmp_path / name, 1), *FAST, *extra,
                                                 "rollout.val_n_groups=5", "trainer.val_before_train=true"]))
        runs[name] = (_records(tmp_path / name / "val_rollouts" / "step_0.jsonl"), list(rows_seen))
    (full, full_rows), (part, part_rows), (white, white_rows) = runs["all"], runs["two"], runs["whiten"]
    assert full_rows[0] == 5 and part_rows[0] == 2 and white_rows[0] == 2  # the step-0 validation's credit pass
    assert len(full) == len(part) == 5 and all("rows" in r for r in full)
    assert [i for i, r in enumerate(part) if "rows" in r] == [0, 2]
    for i in (0, 2):
        assert part[i]["rows"] == full[i]["rows"]
        for key in ("token_ids", "log_probs", "values", "response_mask"):
            assert white[i]["rows"][0][key] == full[i]["rows"][0][key]
    for i in (1, 3, 4):
        assert part[i]["turns"] == full[i]["turns"] and part[i]["seed"] == full[i]["seed"]
    adv = [a for i in (0, 2) for a, m in zip(white[i]["rows"][0]["advantages"], white[i]["rows"][0]["response_mask"],
                                             strict=True) if m]
    assert abs(sum(adv) / len(adv)) < 1e-4 and max(abs(a) for a in adv) > 0.1
    _check_page((tmp_path / "two" / "report" / "step_0.html").read_text(), part, [])
