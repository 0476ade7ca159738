"""``python -m ragen.eval MODEL [MODEL_2] --env NAME [--env ...] --n 200 [key=value ...]`` = ``ragen eval``.

Evaluates one model, or compares two, on fixed env seeds; ``--help`` lists the options. The evaluation itself
lives in the ``ragen.evaluation`` package (its command line: ``ragen.evaluation.cli``); this module only forwards
``python -m ragen.eval`` to it through ``ragen.cli.eval``, as ``ragen.train`` and ``ragen.sft`` do.
"""

from __future__ import annotations

from ragen.allocator import tune_process
from ragen.cli.eval import main

__all__ = ["main"]

if __name__ == "__main__":
    tune_process()  # before anything loads torch
    raise SystemExit(main(prog="python -m ragen.eval"))
