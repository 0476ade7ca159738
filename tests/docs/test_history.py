"""No development-log references in the tracked files: history belongs in git and CHANGELOG.md.

Every tracked text file (README, docs, code, configs, scripts, bench, tests, external) is searched for references
that only make sense to someone who followed the development: numbered sessions and issues, the design note the
project started from (``DESIGN.md``; its current version is docs/design.md), "tried and not adopted" lists and the
development log itself. CHANGELOG.md and this file are exempt.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXEMPT = {"CHANGELOG.md", str(Path(__file__).resolve().relative_to(ROOT))}
PATTERNS = {
    "a numbered session": re.compile(r"\bsessions?[ -]\d+", re.I),
    "a numbered issue": re.compile(r"\bissues?\s*#?\d+", re.I),
    "the start-up design note": re.compile(r"\bDESIGN\.md\b"),  # case-sensitive: docs/design.md is the current one
    "a tried-and-not-adopted list": re.compile(r"\btried and not adopted\b", re.I),
    "the development log": re.compile(r"\bdevelopment[ -]log\b", re.I),
}


def tracked_files() -> list[str]:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout (the history grep reads git ls-files)")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [p for p in out.decode().split("\0") if p and p not in EXEMPT]


def history_hits(name: str, text: str) -> list[str]:
    """``file:line: what`` for every development-log reference in ``text``."""
    hits = []
    for lineno, line in enumerate(text.splitlines(), 1):
        for what, pattern in PATTERNS.items():
            if pattern.search(line):
                hits.append(f"{name}:{lineno}: {what}: {line.strip()[:100]}")
    return hits


@pytest.mark.parametrize("line, expected", [
    ("measured in session 16 on the EPYC", ["a numbered session"]),
    ("the session-13 recipe", ["a numbered session"]),
    ("see issue 10 and issue #14", ["a numbered issue"]),
    ("as DESIGN.md says", ["the start-up design note"]),
    ("Tried and not adopted: 4x4 maps", ["a tried-and-not-adopted list"]),
    ("see the development log", ["the development log"]),
    ("docs/design.md, a requests.Session(), an issue with 2 GPUs is fine", []),
])
def test_patterns(line, expected):
    assert [h.split(": ")[1] for h in history_hits("f", line)] == expected


def test_no_development_log_references_in_tracked_files():
    hits = []
    for name in tracked_files():
        path = ROOT / name
        if not path.is_file():
            continue  # deleted in the work tree, not yet committed
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary (images)
        hits += history_hits(name, text)
    assert not hits, f"{len(hits)} development-log reference(s); move history to CHANGELOG.md:\n" + "\n".join(hits)
