"""Parsing helpers of the report tests (no browser): episode blocks and coloured token spans of a step page."""

import re
import sys
from pathlib import Path

# the trainer tests' tiny-run settings (tests/trainer/trainer_helpers.py), reused rather than copied
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trainer"))
from trainer_helpers import tiny_overrides  # noqa: E402

__all__ = ["block_id", "episode_blocks", "model_token_count", "tiny_overrides", "token_spans"]

SPAN = re.compile(r'<span class="m" style="background:(#[0-9a-f]{6})[^"]*" title="([^"]*)"')


def episode_blocks(page: str) -> list[str]:
    """The HTML of each episode of a step page, in page order."""
    return re.split(r'(?=<div class="ep" )', page)[1:]


def block_id(block: str) -> str:
    return re.search(r'id="([a-z]+-\d+)"', block).group(1)


def token_spans(block: str) -> list[tuple[str, str]]:
    """(background colour, title) of every model-token span of one episode."""
    return SPAN.findall(block)


def model_token_count(record: dict) -> int:
    return sum(m for row in record["rows"] for m in row["response_mask"])
