"""The worked examples of docs/estimators.md are what the code computes: both tables are parsed from the page (the
page stays an independent statement of the numbers) and every entry is compared with ``compute_advantage`` on the
example's inputs, to the precision the page prints."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from ragen.algorithms import AdvantageInputs, compute_advantage

PAGE = Path(__file__).resolve().parents[2] / "docs" / "estimators.md"
D = torch.float64


def tables() -> list[list[list[str]]]:
    """The body rows (cells) of each markdown table that follows a '### Worked example' heading."""
    out, rows, in_example = [], None, False
    for line in PAGE.read_text().splitlines() + [""]:
        if line.startswith("#"):
            in_example = line.strip() == "### Worked example"
        if in_example and line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if rows is None:
                rows = []  # the header
            elif not set("".join(cells)) <= set("-: "):
                rows.append(cells)
        elif rows is not None:
            out.append(rows)
            rows = None
    return out


def numbers(cell: str) -> list[tuple[float, float]]:
    """(value, tolerance) per entry of ``1.9, 1.8`` / ``2.0 x 5, 1.0 x 5``: half a unit of the last printed digit."""
    out = []
    for part in cell.split(","):
        m = re.fullmatch(r"\s*(-?\d+(?:\.(\d+))?)(?:\s*x\s*(\d+))?\s*", part)
        assert m, f"cannot read {part!r} in {cell!r}"
        tol = 0.5 * 10 ** -len(m.group(2) or "") + 1e-9
        out += [(float(m.group(1)), tol)] * int(m.group(3) or 1)
    return out


def estimator(cell: str) -> tuple[str, dict[str, float]]:
    """The estimator named in a row's first cell and the scalars it states (``w = 0.5``)."""
    name = re.search(r"`(\w+)`", cell).group(1)
    kwargs = {"turn_level_weight": float(m.group(1))} if (m := re.search(r"w = ([\d.]+)", cell)) else {}
    return name, kwargs


def gae_example() -> AdvantageInputs:
    """10 model tokens, turns 0-4 and 5-9, reward 1 at the end of each turn, V = 0.1 ... 1.0."""
    r = torch.zeros(1, 10, dtype=D)
    r[0, 4] = r[0, 9] = 1.0
    return AdvantageInputs(token_rewards=r, response_mask=torch.ones(1, 10, dtype=torch.long),
                           turn_ids=torch.tensor([[0] * 5 + [1] * 5]), values=torch.arange(1, 11, dtype=D)[None] / 10)


def search_group() -> AdvantageInputs:
    """Episodes 0, 1 search (turn 0 on tokens 0-1, step reward 0.5, a tool result), then answer (turn 1 on 3-4);
    episodes 2, 3 answer at once (turn 0 on 0-1). Outcomes 1, 0, 1, 0. Turn 0's observation is the same text for
    all four, the answer turns' observations (the search results) differ."""
    tool, direct = [0, 0, -1, 1, 1], [0, 0, -1, -1, -1]
    tid = torch.tensor([tool, tool, direct, direct])
    rewards = torch.zeros(4, 5, dtype=D)
    rewards[0, 1] = rewards[1, 1] = 0.5  # each turn's reward on its last model token
    rewards[0, 4], rewards[2, 1] = 1.0, 1.0
    return AdvantageInputs(
        token_rewards=rewards, response_mask=(tid >= 0).long(), turn_ids=tid,
        group_ids=torch.zeros(4, dtype=torch.long),
        step_rewards=torch.tensor([[0.5, 0.0], [0.5, 0.0], [0.0, 0.0], [0.0, 0.0]], dtype=D),
        outcome_rewards=torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=D),
        tool_results=torch.tensor([[True, False], [True, False], [False, False], [False, False]]),
        turn_obs_keys=[["question", "results a"], ["question", "results b"], ["question"], ["question"]])


GAE_SCALARS = {"gamma": 1.0, "lam": 1.0, "high_level_gamma": 0.95, "high_level_lam": 1.0}


def test_the_page_has_both_worked_examples():
    found = tables()
    assert [len(t) for t in found] == [4, 5], "docs/estimators.md's worked-example tables changed shape"


@pytest.mark.parametrize("row", tables()[0], ids=lambda r: r[0])
def test_gae_family_table(row):
    name, kwargs = estimator(row[0])
    adv, ret = compute_advantage(name, gae_example(), **GAE_SCALARS, **kwargs)
    for cell, got in ((row[1], adv[0]), (row[2], ret[0])):
        want = numbers(cell)
        assert len(want) == 10
        code = [round(v, 4) for v in got.tolist()]
        for (value, tol), x in zip(want, got.tolist(), strict=True):
            assert abs(x - value) <= tol, f"{name}: the page says {cell}, the code gives {code}"


@pytest.mark.parametrize("row", tables()[1], ids=lambda r: r[0])
def test_turn_credit_table(row):
    name, kwargs = estimator(row[0])
    adv, _ = compute_advantage(name, search_group(), **kwargs)
    first_tokens = {0: 0, 1: 3}  # each turn's first model token
    for episode, cell in enumerate(row[1:]):
        per_turn = [numbers(part)[0] for part in cell.split(";")]
        for turn, (value, tol) in enumerate(per_turn):
            got = float(adv[episode, first_tokens[turn]])
            assert abs(got - value) <= tol, f"{name}, episode {episode}, turn {turn}: the page says {value}, " \
                                            f"the code gives {got:.4f}"
