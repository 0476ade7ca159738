"""The README is a short entry point for users: at most 200 lines, with the sections a user looks for first, and the
test command CI runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAX_LINES = 200
REQUIRED_SECTIONS = ("Install", "GPU", "Your environment", "Your estimator")


def headings(text: str) -> list[str]:
    """The titles of the Markdown headings of ``text`` (``#`` lines outside fenced code blocks)."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return [m.group(1).strip() for m in re.finditer(r"^#{1,6}\s+(.+)$", prose, flags=re.M)]


def test_readme_is_at_most_200_lines():
    n = len(README.read_text().splitlines())
    assert n <= MAX_LINES, f"README.md has {n} lines (at most {MAX_LINES}): move details into docs/"


def test_readme_has_the_required_sections():
    found = headings(README.read_text())
    missing = [s for s in REQUIRED_SECTIONS if s not in found]
    assert not missing, f"README.md lacks the section(s) {missing}; its headings are {found}"


def test_headings_ignore_code_blocks():
    text = "# Title\n\n```bash\n# a comment, not a heading\n```\n\n## Install\n"
    assert headings(text) == ["Title", "Install"]


def test_readme_names_the_ci_test_command():
    assert "bash scripts/test.sh" in README.read_text()
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()
