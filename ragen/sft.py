"""``python -m ragen.sft [--config-name NAME] [--check] [key=value ...]`` = ``ragen sft`` (``ragen.cli.sft``).

The supervised warm start alone (``ragen.trainer.warm_start``): supervised fine-tuning on the envs' experts with
the same Hydra config groups as ``ragen.train`` and no RL; ``--help`` lists its options and outputs.
"""

from __future__ import annotations

from ragen.allocator import tune_process
from ragen.cli.sft import main

__all__ = ["main"]

if __name__ == "__main__":
    tune_process()  # before anything loads torch
    raise SystemExit(main(prog="python -m ragen.sft"))
