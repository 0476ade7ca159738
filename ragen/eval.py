"""Evaluation CLI: ``python -m ragen.eval MODEL [MODEL_2] --env NAME [--env ...] --n 200 [key=value ...]``.

Plays ``--n`` episodes per env on the fixed validation seeds (``rollout.val_seed + i``, the same for every model),
greedy by default (``--temperature 0``), with the agent settings of the composed config (``--config-name``,
default ``base``, plus Hydra overrides), and reports success rate, mean episode reward, format rate and mean
turns with 95% intervals; with two models, also their difference (model 2 - model 1) with its interval.
``--json PATH`` writes every number (per-episode results included). The implementation lives in the
``ragen.evaluation`` package: ``models`` (model arguments), ``runner`` (rollouts), ``stats`` (intervals),
``report`` (metrics, table, JSON) and ``cli``.
"""

from __future__ import annotations

import sys

from ragen.evaluation.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
