"""docs/collapse.md's worked example is what the code computes: its probability table, fed to
ragen.algorithms.collapse, gives the pointwise MIs, the MI and the retrieval accuracy the page states."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from ragen.algorithms.collapse import collapse_metrics, pointwise_mi

PAGE = Path(__file__).resolve().parents[2] / "docs" / "collapse.md"


def example_table() -> torch.Tensor:
    """The 3 x 3 table under the worked-example heading: rows ``| $x_i$ | p | p | p |`` (bold marks the diagonal)."""
    text = PAGE.read_text().split("## A worked example", 1)[1]
    rows = [re.findall(r"\d+\.\d+", line) for line in text.splitlines() if line.startswith("| $x_")]
    assert len(rows) == 3 and all(len(r) == 3 for r in rows), rows
    return torch.tensor([[float(v) for v in r] for r in rows], dtype=torch.float64)


def test_worked_example_numbers():
    cross = example_table().log()
    text = PAGE.read_text()
    m = collapse_metrics(cross)
    stated_mi = float(re.search(r"`mi` \$= \([^)]*\) / 3 = (\d+\.\d+)\$", text).group(1))
    assert m.mi == pytest.approx(stated_mi, abs=5e-4)
    assert "`retrieval_acc` $= 2/3$" in text and m.retrieval_acc == pytest.approx(2 / 3)
    stated = [float(v) for v in re.findall(r"\| \$-?\\log [\d.]+ = (-?\d+\.\d+)\$ \|", text)]
    torch.testing.assert_close(pointwise_mi(cross), torch.tensor(stated, dtype=torch.float64), atol=5e-4, rtol=0)
