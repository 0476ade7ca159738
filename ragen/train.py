"""``python -m ragen.train [--config-name NAME] [--check] [key=value ...]`` = ``ragen train`` (``ragen.cli.train``).

Configs come from ``ragen.trainer.config.compose.config_dir()`` (``$RAGEN_CONFIG_DIR``, the checkout's ``config/`` or
the installed copy); ``--help`` lists them, ``--check`` prints the plan without starting anything, ``--cfg job`` prints
the composed config (``--resolve`` resolves its interpolations). A config error exits with status 2 and one line
per problem.
"""

from __future__ import annotations

from ragen.allocator import tune_process
from ragen.cli.train import main

__all__ = ["main"]

if __name__ == "__main__":
    tune_process()  # before anything loads torch
    raise SystemExit(main(prog="python -m ragen.train"))
