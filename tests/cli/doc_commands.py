"""The commands the documentation shows, extracted for tests/cli/test_documented_commands.py.

Sources: README.md and docs/*.md (fenced code lines, with ``\\`` continuations, and inline ``code`` spans), the
comment lines of the launch and helper scripts (*.sh, scripts/*.sh), the header comments of the configs
(config/*.yaml) and the examples of ``ragen <command> --help``. A command is ``ragen <subcommand> ...``,
``python -m ragen.<module> ...`` or ``bash <script>.sh ...``, with any ``VAR=value`` prefix; ``{a|b}`` in a
command expands into one command per choice, and ``[...]`` optional parts and ``...`` are dropped.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
START = re.compile(r"((?:\b[A-Z][A-Z0-9_]*=\S+\s+)*)(\bbash\s+[\w./-]+\.sh\b|\bpython\s+-m\s+ragen(?:\.\w+)+"
                   r"|(?<![\w./-])ragen\s+(?:train|eval|report|archer|sft)\b)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
SPAN = re.compile(r"`([^`]+)`")


@dataclass(frozen=True)
class DocCommand:
    """One documented command: where it is shown (``source``: file:line), the text as written, the argument list
    after expansion (``argv[0]`` is ``ragen``, ``python`` or ``bash``) and its ``VAR=value`` prefix."""

    source: str
    text: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.source}: {' '.join(self.argv)}"


def documented_commands(root: Path = ROOT) -> list[DocCommand]:
    """Every command of every source, in file order, duplicates (same argv and env) kept once."""
    found: dict[tuple, DocCommand] = {}
    chunks = [*_markdown_chunks(root), *_comment_chunks(root), *_help_chunks()]
    for source, text in chunks:
        for cmd in _commands_in(source, text):
            found.setdefault((cmd.argv, tuple(sorted(cmd.env.items()))), cmd)
    return list(found.values())


def _markdown_chunks(root: Path) -> list[tuple[str, str]]:
    out = []
    for path in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        text = path.read_text()
        for block in FENCE.finditer(text):
            first = text.count("\n", 0, block.start()) + 1
            lines = block.group(0).split("\n")[1:-1]
            out += _code_lines(path.relative_to(root), first + 1, lines)
        prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
        for span in SPAN.finditer(prose):
            line = prose.count("\n", 0, span.start()) + 1
            out.append((f"{path.relative_to(root)}:{line}", " ".join(span.group(1).split())))
    return out


def _code_lines(name: Path, first: int, lines: list[str]) -> list[tuple[str, str]]:
    """Code lines joined at trailing backslashes, comments after `` # `` removed."""
    out, pending, start = [], "", first
    for i, line in enumerate(lines):
        if not pending:
            start = first + i
        line = re.sub(r"(^|\s)#(\s.*)?$", "", line).rstrip()
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        out.append((f"{name}:{start}", pending + line))
        pending = ""
    return out


def _comment_chunks(root: Path) -> list[tuple[str, str]]:
    """Comment lines of the scripts (all) and configs (the header block): code spans, else the line itself."""
    out = []
    files = [*sorted(root.glob("*.sh")), *sorted((root / "scripts").glob("*.sh")),
             *sorted((root / "config").glob("*.yaml"))]
    for path in files:
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if not line.startswith("#"):
                if path.suffix == ".yaml":
                    break  # the header ends at the first line of YAML
                continue
            text = re.sub(r"\s#(\s.*)?$", "", line.lstrip("#")).strip()  # a comment on the commented command
            for piece in SPAN.findall(text) or [_PROSE + text]:
                out.append((f"{path.relative_to(root)}:{i}", piece))
    return out


_PROSE = "\0"  # marks a comment line without code spans: a command written in it ends with its sentence


def _cut_prose(text: str) -> str:
    """A command written bare in a comment ends at the end of its sentence or where a parenthesis opens."""
    return re.split(r"(?<=\S)[.;](?:\s|$)| \(", text)[0]


def _help_chunks() -> list[tuple[str, str]]:
    from ragen.cli import archer, sft, train

    return [(f"ragen {c.COMMAND.name} --help", f"ragen {c.COMMAND.name} {args}") for c in (train, archer, sft)
            for args, _ in c.COMMAND.examples]


def _commands_in(source: str, text: str) -> list[DocCommand]:
    out, prose = [], text.startswith(_PROSE)
    text = text.lstrip(_PROSE)
    for m in START.finditer(text):
        env = dict(tok.split("=", 1) for tok in m.group(1).split())
        rest = text[m.start(2):]
        nxt = START.search(rest, len(m.group(2)))
        rest = rest[: nxt.start()] if nxt else rest
        rest = _balanced(re.split(r"\s(?:&&|\|\||;|\|)\s", rest)[0])
        rest = _cut_prose(rest) if prose else rest
        try:
            tokens = shlex.split(rest)
        except ValueError:  # an unbalanced quote in prose: not a command
            continue
        for argv in _expand(tokens):
            out.append(DocCommand(source, " ".join(text.split()), tuple(argv), env))
    return out


def _balanced(text: str) -> str:
    """``text`` up to a closing parenthesis it did not open (a command named in parentheses)."""
    depth = 0
    for i, ch in enumerate(text):
        depth += (ch == "(") - (ch == ")")
        if depth < 0:
            return text[:i]
    return text


def _expand(tokens: list[str]) -> list[list[str]]:
    """``{a|b}`` -> one argument list per choice; ``[optional ...]`` groups and ``...`` dropped."""
    kept, depth = [], 0
    for tok in tokens:
        if depth or (tok.startswith("[") and "=" not in tok.split("[", 1)[0] and not tok.startswith("[{")):
            depth += tok.count("[") - tok.count("]")
            continue
        if tok.strip(".") == "":
            continue
        kept.append(tok)
    lists = [[]]
    for tok in kept:
        alt = re.fullmatch(r"\{([\w|-]+)\}", tok)
        choices = alt.group(1).split("|") if alt else [tok]
        lists = [[*argv, c] for argv in lists for c in choices]
    return lists
