"""Warm start only: ``python -m ragen.sft [--config-name NAME] [--check] [key=value ...]`` = ``ragen sft``.

Supervised fine-tuning on the envs' experts (``ragen.trainer.warm_start``) with the same Hydra config groups as
``ragen.train``, and no RL: ``trainer.sft_warmup_steps`` steps (default here 20 when the config has 0), a
validation before and after, and a checkpoint ``<trainer.output_dir>/checkpoints/global_step_0`` whose ``actor``
folder is a transformers model: start PPO from it with ``model.path=<that folder>``, or run both in one job with
``python -m ragen.train trainer.sft_warmup_steps=N``.
"""

from __future__ import annotations

import dataclasses

from ragen.trainer.config import TrainConfig

DEFAULT_STEPS = 20


def sft_config(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` as a warm-start-only job: no RL steps, ``DEFAULT_STEPS`` warm-start steps unless set."""
    steps = cfg.trainer.sft_warmup_steps or DEFAULT_STEPS
    trainer = dataclasses.replace(cfg.trainer, total_steps=0, sft_warmup_steps=steps)
    return dataclasses.replace(cfg, trainer=trainer)


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """The command line (``ragen.cli.sft``)."""
    from ragen.cli.sft import main as cli

    return cli(argv, prog)


if __name__ == "__main__":
    raise SystemExit(main(prog="python -m ragen.sft"))
