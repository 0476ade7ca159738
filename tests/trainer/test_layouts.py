"""The layout objects (ragen.agent.layout, ragen.trainer.layout): one per name in both halves, the only code that
depends on which layout is active, each with its own worker batch, padding, row counts and checks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from ragen.agent.batch import RolloutBatch
from ragen.agent.layout import ROW_LAYOUTS
from ragen.trainer.config.schema import ConfigError, build_config
from ragen.trainer.layout import LAYOUTS

ROOT = Path(__file__).resolve().parents[2]
LAYOUT_MODULES = {"ragen/agent/layout.py", "ragen/trainer/layout.py"}
# a comparison with a layout's name, a membership test in a literal of names, or a layout fact read off ``extra``
ASKS = re.compile(r"layout\s*(==|!=)|(==|!=)\s*\S*layout\b|\.layout\s+(not\s+)?in\s*[(\[{]|"
                  r"extra(\[|\.get\()\"(episode_index|turn_index|failed|context_cut)\"")


def test_nothing_outside_the_layouts_asks_which_layout_is_active():
    found = []
    for path in sorted((ROOT / "ragen").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in LAYOUT_MODULES:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if ASKS.search(line):
                found.append(f"{rel}:{n}: {line.strip()}")
    assert found == []


def test_both_halves_name_the_same_layouts():
    assert list(LAYOUTS) == list(ROW_LAYOUTS) == ["trajectory", "turn"]
    for name, layout in LAYOUTS.items():
        assert layout.name == layout.rows.name == ROW_LAYOUTS[name].name == name


def test_an_unknown_layout_is_refused_when_the_config_is_built():
    with pytest.raises(ConfigError) as err:
        build_config({"agent": {"layout": "turns"}})
    assert err.value.problems == ["agent: agent.layout='turns' is unknown; use one of trajectory, turn"]


def test_row_counts():
    traj, turn = ROW_LAYOUTS["trajectory"], ROW_LAYOUTS["turn"]
    assert (traj.max_rows(8, 5), traj.fixed_rows(8)) == (8, 8)
    assert (turn.max_rows(8, 5), turn.fixed_rows(8)) == (40, None)
    assert LAYOUTS["trajectory"].rows_text(8, 5) == "8 rows (trajectory layout: one per episode)"
    assert LAYOUTS["turn"].rows_text(8, 5) == "up to 40 rows (turn layout: one per turn)"
    assert (LAYOUTS["trajectory"].at_most(3), LAYOUTS["turn"].at_most(3)) == ("3", "up to 3")


def _turn_rows(turn_index: list[int]) -> RolloutBatch:
    """Five rows of three episodes (0: two turns, 1: one, 2: two), one model token each where turn_index >= 0."""
    b, t = len(turn_index), 4
    resp = torch.zeros(b, t, dtype=torch.long)
    resp[:, 2] = torch.tensor([k >= 0 for k in turn_index], dtype=torch.long)
    return RolloutBatch(
        input_ids=torch.arange(b * t).reshape(b, t), attention_mask=torch.ones(b, t, dtype=torch.long),
        response_mask=resp, turn_ids=torch.where(resp.bool(), 0, -1), token_rewards=torch.zeros(b, t),
        sample_log_probs=torch.zeros(b, t), group_ids=torch.zeros(b, dtype=torch.long), turn_rewards=torch.zeros(b, 2),
        num_turns=torch.ones(b, dtype=torch.long), truncated=torch.zeros(b, dtype=torch.bool),
        episode_index=torch.tensor([0, 0, 1, 2, 2]), turn_index=torch.tensor(turn_index),
        failed=torch.tensor([False, False, True, False, False]))


def test_worker_batches_and_padding():
    batch = _turn_rows([0, 1, 0, 0, 1])
    traj, turn = LAYOUTS["trajectory"], LAYOUTS["turn"]
    assert traj.train_batch(batch).seq_ids is None  # every row its own sequence
    tb = turn.train_batch(batch)
    assert tb.seq_ids.tolist() == [0, 0, 1, 2, 2]  # a turn row's sequence is its episode
    assert traj.padded(tb, 4, 7) is tb
    padded = turn.padded(tb, 4, 7)
    assert padded.batch_size == 8 and padded.seq_ids.tolist() == [0, 0, 1, 2, 2, 3, 4, 5]
    assert padded.input_ids[5:].eq(7).all() and padded.attention_mask[5:].sum(1).tolist() == [1, 1, 1]
    assert turn.train_batch(_turn_rows([-1] * 5)).seq_ids is None  # placeholders only: nothing trains


def test_select_keeps_the_row_fields_aligned():
    picked = _turn_rows([0, 1, 0, 0, 1]).select([4, 2])
    assert picked.episode_index.tolist() == [2, 1] and picked.turn_index.tolist() == [1, 0]
    assert picked.failed.tolist() == [False, True] and picked.context_cut is None


def test_each_layout_checks_its_own_rows():
    base = {"env": {"name": "frozen_lake", "max_turn": 5}}
    strip = build_config({**base, "agent": {"history_thinking": "strip", "max_context_window": 2}})
    problems = LAYOUTS["trajectory"].checks(strip)
    assert [p.split(" ")[0] for p in problems] == ["agent.max_context_window=2", "agent.history_thinking='strip'"]
    assert LAYOUTS["turn"].checks(strip) == []
    why = "a consumer needs turn rows"
    assert LAYOUTS["trajectory"].turn_rows_problems(why) == [f"agent.layout='trajectory': {why}; set agent.layout=turn"]
    assert LAYOUTS["turn"].turn_rows_problems(why) == []
    assert set(LAYOUTS["turn"].unread_algorithm_keys) == {"skip_env_tokens"}
    assert LAYOUTS["trajectory"].unread_algorithm_keys == {}
