"""``ragen archer`` = ``python -m ragen.archer``: the ArCHer family (ArCHer, online CHAI, online filtered BC).

Same config tree as ``ragen train``; ``algorithm.name=archer|chai|filtered_bc`` selects the algorithm, the
``archer`` section its loop. ``bash scripts/train_archer.sh`` runs it (default config archer_twenty_questions).
"""

from __future__ import annotations

from typing import Any

from ragen.cli.command import HydraCommand
from ragen.cli.help import RUN_OUTPUTS
from ragen.cli.hydra_app import main as run_command


def task(cfg: Any) -> None:
    """Hydra's composed config -> the ArCHer family's checks, pre-start checks, then the run (or the plan)."""
    from ragen.archer.main import run, validate_archer
    from ragen.launch import cli_main

    cli_main(cfg, validate_archer, label=f"{cfg.algorithm.name} done", runner=run)


COMMAND = HydraCommand(
    name="archer",
    module="ragen.archer",
    config_name="archer_twenty_questions",
    summary=("Train with the ArCHer family (Zhou et al. 2024): ArCHer's utterance-level double critic with a "
             "token-level actor, online CHAI or online filtered BC (algorithm.name=archer|chai|filtered_bc), on the "
             "replay loop of the archer section. bash scripts/train_archer.sh runs this command."),
    examples=(
        ("", "= bash scripts/train_archer.sh: ArCHer on Twenty Questions (scripted oracle)"),
        ("--config-name chai_twenty_questions", "online CHAI"),
        ("--config-name filtered_bc_twenty_questions", "online filtered BC"),
        ("--config-name archer_guess_my_city", "also archer_webshop, archer_text_adventure"),
        ("--config-name archer_text_adventure env.config.game_path=/path/to/detective.z5", "your Z-machine game"),
        ("--config-name archer_twenty_questions_paper trainer=gpu --check", "the paper's loop settings on GPUs"),
        ("algorithm.name=chai model=tiny critic.encoder=tiny --check", "the plan only; nothing starts"),
    ),
    outputs=RUN_OUTPUTS,
    task=task,
)


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    return run_command(COMMAND, argv, prog)
