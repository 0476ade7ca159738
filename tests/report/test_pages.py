"""Run report pages without a browser: structure (every episode, one coloured span per model token), the colour
scale, escaping of model text, the SVG charts, the timing table, and the token records the trainer saves."""

import json
import re

import torch
from factories import rollout_batch
from report_helpers import block_id, episode_blocks, model_token_count, token_spans

from ragen.agent.batch import EpisodeRecord, TurnRecord
from ragen.report import Credit, build_report, episode_token_records, pending_steps, sample_indices
from ragen.report.build import chart_specs, timing_table
from ragen.report.episodes import advantage_color, section_scale
from ragen.report.svg import Series, line_chart, nice_ticks

EVIL = "<script>alert('x')</script>"


def _rgb(color: str) -> tuple[int, int, int]:
    return tuple(int(color[i : i + 2], 16) for i in (1, 3, 5))


def _row(pieces, mask, turns, adv):
    n = len(pieces)
    return {"token_ids": list(range(n)), "pieces": pieces, "response_mask": mask, "turn_ids": turns,
            "advantages": adv, "returns": [a + 0.5 for a in adv], "values": [0.5] * n,
            "log_probs": [-0.25 * m for m in mask]}


def _episode(seed, success, rows, rewards):
    turns = [{"prompt": "go" if k == 0 else f"obs {k}", "response": "r", "actions": [f"act{k}"], "reward": r,
              "success": False, "format_ok": True} for k, r in enumerate(rewards)]
    return {"env": "frozen_lake", "seed": seed, "group_id": 0, "success": success, "failed": False, "error": "",
            "truncated": False, "turns": turns, "turn_rewards": rewards, "rows": rows}


def _write_run(run_dir):
    """Step 3: two validation episodes (one multi-turn, one whose model text is a script tag) and one training
    sample; metrics of three steps; a config."""
    val = [
        _episode(7, True, [_row(["<|im_start|>", "sys\n", "go", "Left", "</answer>", "obs\n", "Down", "!"],
                                [0, 0, 0, 1, 1, 0, 1, 1], [-1, -1, -1, 0, 0, -1, 1, 1],
                                [0.0, 0.0, 0.0, 0.8, -0.8, 0.0, 0.4, -0.2])], [0.0, 1.0]),
        _episode(8, False, [_row(["p", EVIL, "ok"], [0, 1, 1], [-1, 0, 0], [0.0, -2.0, 2.0])], [-0.1]),
    ]
    train = [_episode(9, False, [_row(["p", "a", "b", "c"], [0, 1, 1, 1], [-1, 0, 0, 0], [0.0, 0.1, 0.2, 0.3])],
                      [0.5])]
    for sub, recs in (("val_rollouts", val), ("train_samples", train)):
        (run_dir / sub).mkdir(parents=True)
        (run_dir / sub / "step_3.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    metrics = [{"step": s, "env/frozen_lake/success": 0.25 * s, "reward/mean": 0.1 * s, "timing/rollout": 1.0 + s,
                "timing/step": 2.0 + s, "actor/pg_loss": -0.01 * s} for s in (1, 2, 3)]
    metrics[-1]["val/env/frozen_lake/success"] = 0.5
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    (run_dir / "config.json").write_text(json.dumps({"algorithm": {"estimator": "gae"},
                                                     "env": {"name": "frozen_lake"},
                                                     "trainer": {"experiment_name": f"exp{EVIL}"}}))
    return val, train


def test_step_page_structure_colours_and_escaping(tmp_path):
    val, train = _write_run(tmp_path)
    index = build_report(tmp_path)
    page = (tmp_path / "report" / "step_3.html").read_text()
    blocks = episode_blocks(page)
    assert [block_id(b) for b in blocks] == ["val-0", "val-1", "train-0"]
    assert [re.search(r'data-success="(\d)"', b).group(1) for b in blocks] == ["1", "0", "0"]
    for block, rec in zip(blocks, val + train, strict=True):
        spans = token_spans(block)
        assert len(spans) == model_token_count(rec)
        advs = [a for row in rec["rows"] for a, m in zip(row["advantages"], row["response_mask"], strict=True) if m]
        scale = 2.0  # validation section: the largest |advantage| of its model tokens
        for (color, title), a in zip(spans, advs, strict=True):
            assert f"advantage {a:+.4f}" in title
            if block in blocks[:2]:
                assert color == advantage_color(a, scale)
    # +0.8 / -0.8 of episode 0 sit on opposite sides: blue above white for +, red for -
    pos, neg = _rgb(advantage_color(0.8, 2.0)), _rgb(advantage_color(-0.8, 2.0))
    assert pos[2] > pos[0] and neg[0] > neg[2]
    # the first prompt is folded up to the turn's observation ("go"), which stays visible
    assert '<summary>prompt · 3 tokens</summary><span class="e">&lt;|im_start|&gt;sys\n</span></details>' \
        '<span class="e">go</span>' in blocks[0]
    # one reward badge per turn, after the turn's last model token
    assert blocks[0].count('class="rw"') == 2 and "turn 1 · r=+1.000" in blocks[0]
    # model text is escaped; the only script element is the page's own filter code
    assert EVIL not in page and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert page.count("<script>") == 1 and "&lt;|im_start|&gt;" in page
    idx = index.read_text()
    assert EVIL not in idx and idx.count("<script>") == 0 and "step_3.html" in idx
    for text in (page, idx):  # self-contained: nothing fetched
        assert not re.search(r"<link|src=|@import|url\(", text)


def test_advantage_color_scale():
    assert advantage_color(0.0, 1.0) == "#ffffff"
    assert advantage_color(1.0, 1.0) == "#2166ac" and advantage_color(5.0, 1.0) == "#2166ac"  # saturates
    assert advantage_color(-1.0, 1.0) == "#b2182b"
    assert advantage_color(0.5, 1.0) == "#90b2d6"  # halfway to (33, 102, 172): 255 - 0.5 * (222, 153, 83)
    for x in (0.1, 0.5, 2.0):
        p, n = _rgb(advantage_color(x, 2.0)), _rgb(advantage_color(-x, 2.0))
        assert p[2] > p[0] and n[0] > n[2]
    assert section_scale([{"rows": [{"advantages": [9.0, -3.0, 1.0], "response_mask": [0, 1, 1]}]}]) == 3.0


def test_nice_ticks_and_chart():
    assert nice_ticks(0.0, 1.0, 5) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert nice_ticks(3.0, 17.0, 4) == [0.0, 5.0, 10.0, 15.0, 20.0]
    svg = line_chart("t", [Series("a", [(0, 0.0), (1, 1.0), (2, 0.5)]), Series("empty", [])], width=400, height=230)
    assert svg.count("<circle") == 3 and svg.count("<polyline") == 1 and ">empty<" not in svg
    pts = [tuple(map(float, p.split(","))) for p in re.search(r'points="([^"]+)"', svg).group(1).split()]
    # plot area x 52..388 (width 400 - 52 - 12) for steps 0..2; y 26..190 (230 - 40: one legend line) for 0..1
    assert pts == [(52.0, 190.0), (220.0, 26.0), (388.0, 108.0)]


def test_chart_specs_and_timing_table():
    recs = [{"step": 1, "env/fl/success": 0.0, "timing/rollout": 1.0, "timing/actor_update": 2.0, "timing/step": 3.0},
            {"step": 2, "env/fl/success": 0.5, "val/env/fl/success": 1.0, "timing/rollout": 3.0,
             "timing/step": 3.5}]
    specs = dict(chart_specs(recs))
    assert [s.points for s in specs["fl: success"]] == [[(1.0, 0.0), (2.0, 0.5)], [(2.0, 1.0)]]
    assert "critic loss" not in specs  # no data, no chart
    assert not any(t.startswith("template collapse") for t in specs)
    with_collapse = dict(chart_specs([*recs, {"step": 3, "collapse/mi": 0.4, "collapse/mi_bound": 2.08,
                                               "collapse/retrieval_acc": 0.5, "collapse/chance_acc": 0.125}]))
    mi = with_collapse["template collapse: prompt-response MI (nats)"]
    assert [s.points for s in mi] == [[(3.0, 0.4)], [(3.0, 2.08)]]
    acc = with_collapse["template collapse: retrieval accuracy"]
    assert [s.points for s in acc] == [[(3.0, 0.5)], [(3.0, 0.125)]]
    table = timing_table(recs)
    row = re.search(r"<td>rollout</td>(.*?)</tr>", table).group(1)
    # rollout: 2 records, mean 2, last 3, total 4, share 4 / (4 + 2) of the phases (timing/step excluded)
    assert re.findall(r"<td class='n'>([^<]*)</td>", row) == ["2", "2.000", "3.000", "4.0", "66.7%"]


def test_sample_indices():
    assert sample_indices(10, 4) == [0, 2, 5, 7]
    assert sample_indices(3, 4) == [0, 1, 2]
    assert sample_indices(5, 0) == []


def _turn_layout_batch():
    """Turn layout: 3 rows, episode 1's turns in rows 2 (turn 0) and 0 (turn 1), episode 0 in row 1; padded to 5."""
    eps = [EpisodeRecord("fl", 11, 1, [TurnRecord("o", "r", ["a"], 0.0, False, True)] * 2, success=True),
           EpisodeRecord("fl", 10, 0, [TurnRecord("o", "r", ["a"], -0.1, False, True)])]
    return rollout_batch(
        [[([70, 71], -1), ([72, 73], 1)], [([80], -1), ([81, 82], 0)], [([90, 91, 92], -1), ([93, 94], 0)]],
        [[0.0, 1.0], [-0.1], [0.0, 1.0]], group_ids=[1, 0, 1], turn_rows=([1, 0, 1], [1, 0, 0]),
        episodes=[eps[0], eps[1], eps[0]], token_rewards=torch.zeros(3, 5))


def test_episode_token_records_turn_layout(char_tokenizer):
    batch = _turn_layout_batch()
    adv = torch.arange(15, dtype=torch.float32).reshape(3, 5) / 8
    recs = episode_token_records(batch, char_tokenizer, Credit(advantages=adv, values=-adv))
    assert [r["seed"] for r in recs] == [11, 10]
    assert [r["turn_rewards"] for r in recs] == [[0.0, 1.0], [pytest_approx(-0.1)]]
    first = recs[0]["rows"]
    assert [r["token_ids"] for r in first] == [[90, 91, 92, 93, 94], [70, 71, 72, 73]]  # turn order, no padding
    assert first[0]["pieces"] == ["Z", "[", "\\", "]", "^"] and first[1]["turn_ids"] == [-1, -1, 1, 1]
    assert first[1]["advantages"] == [0.0, 0.125, 0.25, 0.375] and first[1]["values"] == [-0.0, -0.125, -0.25, -0.375]
    assert first[0]["returns"] is None and first[0]["log_probs"] is None
    picked = episode_token_records(batch, char_tokenizer, episodes=[1])
    assert [r["seed"] for r in picked] == [10] and picked[0]["rows"][0]["response_mask"] == [0, 1, 1]


def pytest_approx(x):
    import pytest

    return pytest.approx(x)


def test_pending_steps_rebuilds_missing_current_and_stale_pages(tmp_path):
    import os

    _write_run(tmp_path)
    for step in (4, 5):
        (tmp_path / "train_samples" / f"step_{step}.jsonl").write_text("")
    assert pending_steps(tmp_path, 5) == [3, 4, 5]  # no page yet
    build_report(tmp_path)
    assert pending_steps(tmp_path, 5) == [5]
    page = (tmp_path / "report" / "step_3.html").stat()
    newer = page.st_mtime_ns + 10**9
    os.utime(tmp_path / "train_samples" / "step_3.jsonl", ns=(newer, newer))  # step 3 redone after a resume
    assert pending_steps(tmp_path, 5) == [3, 5]
