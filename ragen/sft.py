"""Warm start only: ``python -m ragen.sft [--config-name NAME] [key=value ...]``.

Supervised fine-tuning on the envs' experts (``ragen.trainer.warm_start``) with the same Hydra config groups as
``ragen.train``, and no RL: ``trainer.sft_warmup_steps`` steps (default here 20 when the config has 0), a
validation before and after, and a checkpoint ``<trainer.output_dir>/checkpoints/global_step_0`` whose ``actor``
folder is a transformers model: start PPO from it with ``model.path=<that folder>``, or run both in one job with
``python -m ragen.train trainer.sft_warmup_steps=N``.
"""

from __future__ import annotations

import dataclasses
import sys

import hydra

from ragen.trainer.compose import config_dir, prepare_cli, to_train_config
from ragen.trainer.config import ConfigError, TrainConfig

DEFAULT_STEPS = 20


def sft_config(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` as a warm-start-only job: no RL steps, ``DEFAULT_STEPS`` warm-start steps unless set."""
    steps = cfg.trainer.sft_warmup_steps or DEFAULT_STEPS
    trainer = dataclasses.replace(cfg.trainer, total_steps=0, sft_warmup_steps=steps)
    return dataclasses.replace(cfg, trainer=trainer)


@hydra.main(config_path=str(config_dir()), config_name="base", version_base="1.3")
def main(cfg) -> None:
    from ragen.trainer.main import run_cli
    from ragen.trainer.validate import validate

    try:
        train_cfg = sft_config(to_train_config(cfg))
        validate(train_cfg)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        sys.exit(2)
    run_cli(train_cfg, label="warm start done")


if __name__ == "__main__":
    prepare_cli("base")  # plugins (entry points, imports) before Hydra composes
    main()
