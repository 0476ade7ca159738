"""``python -m ragen.archer [--config-name archer_twenty_questions] [--check] [key=value ...]`` = ``ragen archer``
(``ragen.cli.archer``): same config tree as ``ragen train``; ``algorithm.name=archer|chai|filtered_bc`` selects
the algorithm, the ``archer`` section its loop. A config error exits with status 2 and one line per problem.
"""

from __future__ import annotations

from ragen.allocator import tune_process
from ragen.cli.archer import main

__all__ = ["main"]

if __name__ == "__main__":
    tune_process()  # before anything loads torch
    raise SystemExit(main(prog="python -m ragen.archer"))
