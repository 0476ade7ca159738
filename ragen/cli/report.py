"""``ragen report`` = ``python -m ragen.report`` (``ragen.report.__main__``)."""

from __future__ import annotations


def main(argv: list[str] | None = None, prog: str = "ragen report") -> int:
    from ragen.report.__main__ import main as report

    return report(argv, prog)
