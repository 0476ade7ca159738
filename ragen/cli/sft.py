"""``ragen sft`` = ``python -m ragen.sft``: the supervised warm start alone
(``ragen.trainer.warm_start.sft_config``)."""

from __future__ import annotations

from typing import Any

from ragen.cli.command import HydraCommand
from ragen.cli.help import RUN_OUTPUTS
from ragen.cli.hydra_app import main as run_command


def task(cfg: Any) -> None:
    """Hydra's composed config as a warm-start-only job -> validation, pre-start checks, the run (or the plan)."""
    from ragen.launch import cli_main, validate
    from ragen.trainer.warm_start import sft_config

    cli_main(cfg, validate, label="warm start done", transform=sft_config)


COMMAND = HydraCommand(
    name="sft",
    module="ragen.sft",
    config_name="base",
    summary=("Supervised fine-tuning on the envs' experts (the warm start of ragen train, alone): "
             "trainer.sft_warmup_steps steps (20 when the config has 0), a validation before and after, and the "
             "checkpoint <trainer.output_dir>/checkpoints/global_step_0, whose actor/ folder is a transformers "
             "model: start RL from it with ragen train model.path=<that folder>, or run both in one job with "
             "ragen train trainer.sft_warmup_steps=N."),
    examples=(
        ("--config-name ppo_multi_turn", "FrozenLake's expert, 20 warm-start steps"),
        ("--config-name ppo_multi_turn trainer.sft_warmup_steps=5 sft.noise=0.5", ""),
        ("--config-name ppo_multi_turn model=tiny --check", "the plan only; nothing starts"),
    ),
    outputs=RUN_OUTPUTS,
    task=task,
)


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    return run_command(COMMAND, argv, prog)
