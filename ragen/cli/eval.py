"""``ragen eval`` = ``python -m ragen.eval`` (``ragen.evaluation.cli``)."""

from __future__ import annotations


def main(argv: list[str] | None = None, prog: str = "ragen eval") -> int:
    from ragen.evaluation.cli import main as evaluate

    return evaluate(argv, prog)
