"""The documentation site: every page under docs/ is in the mkdocs navigation (no orphan pages) and every page the
navigation names exists; images the pages show exist; the GPU section of docs/benchmarks.md keeps the markers
scripts/gpu_check.sh's figures are written between; the stylesheets and scripts the site loads exist; formulas are
TeX that the site typesets, with every delimiter closed. The strict build itself runs in CI (scripts/docs.sh)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def nav_pages(node) -> list[str]:
    """The page paths of an mkdocs ``nav`` (nested lists of ``{title: page or list}``)."""
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [p for item in node for p in nav_pages(item)]
    if isinstance(node, dict):
        return [p for value in node.values() for p in nav_pages(value)]
    return []


def site_config() -> dict:
    return yaml.safe_load((ROOT / "mkdocs.yml").read_text())


def test_nav_pages_flattened():
    assert nav_pages([{"Home": "index.md"}, {"A": [{"B": "b.md"}, "c.md"]}]) == ["index.md", "b.md", "c.md"]


def test_every_page_is_in_the_nav_and_every_nav_entry_exists():
    nav = nav_pages(site_config()["nav"])
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert sorted(set(nav)) == sorted(nav), f"pages listed twice in the nav: {nav}"
    assert not set(pages) - set(nav), f"pages missing from mkdocs.yml's nav: {sorted(set(pages) - set(nav))}"
    assert not set(nav) - set(pages), f"nav entries without a page: {sorted(set(nav) - set(pages))}"


def test_pages_stay_flat_for_the_documented_command_test():
    """tests/cli/doc_commands.py collects docs/*.md only: a page in a subfolder would escape the dry-run test."""
    assert [p for p in DOCS.rglob("*.md") if p.parent != DOCS] == []


def test_images_shown_exist_and_are_small():
    for page in DOCS.glob("*.md"):
        for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", page.read_text()):
            image = (page.parent / target).resolve()
            assert image.is_file(), f"{page.name} shows {target}, which does not exist"
            assert image.stat().st_size < 200_000, f"{target} is {image.stat().st_size} bytes: keep images small"


def test_gpu_section_markers_intact():
    text = (DOCS / "benchmarks.md").read_text()
    begin, end = "<!-- GPU section: begin", "<!-- GPU section: end -->"
    assert text.count(begin) == 1 and text.count(end) == 1 and text.index(begin) < text.index(end)
    assert "## GPU" in text[text.index(begin):text.index(end)]


def test_local_assets_exist():
    """Every stylesheet and script the site loads from docs/ exists (a URL is loaded by the reader's browser)."""
    config = site_config()
    for entry in config.get("extra_css", []) + config.get("extra_javascript", []):
        path = entry["path"] if isinstance(entry, dict) else entry
        if not path.startswith(("http://", "https://")):
            assert (DOCS / path).is_file(), f"mkdocs.yml loads {path}, which is not under docs/"


def prose(text: str) -> str:
    """``text`` without fenced code blocks and inline code spans (where a dollar sign is not math)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]+`", "", text)


def test_prose_drops_code():
    assert prose("a `$x` b\n```bash\necho $HOME $PATH\n```\n$y$") == "a  b\n\n$y$"


def test_math_is_typeset_and_delimited():
    """The estimator formulas are TeX for pymdownx.arithmatex (generic mode, typeset by MathJax): the extension and
    MathJax are configured, the estimators page states GAE as display math, and in every page's prose each $$ opens
    and closes a display block and each paragraph has an even number of inline $ (a shell variable such as $HOME,
    two or more capitals after a $, is not math)."""
    config = site_config()
    extensions = {next(iter(e)) if isinstance(e, dict) else e: e for e in config["markdown_extensions"]}
    assert extensions["pymdownx.arithmatex"]["pymdownx.arithmatex"] == {"generic": True}
    scripts = [e["path"] if isinstance(e, dict) else e for e in config["extra_javascript"]]
    assert any("mathjax" in s and s.startswith("https://") for s in scripts), scripts
    estimators = prose((DOCS / "estimators.md").read_text())
    blocks = re.findall(r"^\s*\$\$\n(.*?)^\s*\$\$", estimators, flags=re.S | re.M)
    assert any(r"\delta_i = r(p_i) + \gamma V(p_{i+1}) - V(p_i)" in b and r"(\gamma\lambda)^l" in b for b in blocks)
    for page in sorted(DOCS.glob("*.md")):
        text = prose(page.read_text())
        displays = [line for line in text.splitlines() if line.strip() == "$$"]
        assert len(displays) % 2 == 0, f"{page.name}: a $$ block is not closed"
        text = re.sub(r"^\s*\$\$\n.*?^\s*\$\$", "", text, flags=re.S | re.M)
        for paragraph in text.split("\n\n"):
            dollars = re.sub(r"\$\{?[A-Z]{2}[A-Z0-9_]*\b", "", paragraph).count("$")
            assert dollars % 2 == 0, f"{page.name}: an inline $ is not closed in: {paragraph[:200]}"
