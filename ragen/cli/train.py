"""``ragen train`` = ``python -m ragen.train``: the PPO family (``ragen.trainer``) on a Hydra config.

The launch scripts run it with their experiment config: ``bash train_ppo.sh`` = ``ragen train --config-name
ppo_bandit``, ``bash train_ppo_multi_turn.sh`` = ``--config-name ppo_multi_turn``, ``bash train_ppo_bilevel.sh`` =
``--config-name ppo_bilevel``, ``bash scripts/train_search_qa.sh RUN`` = ``--config-name search_qa_RUN``.
"""

from __future__ import annotations

from typing import Any

from ragen.cli.command import HydraCommand
from ragen.cli.help import RUN_OUTPUTS
from ragen.cli.hydra_app import main as run_command


def task(cfg: Any) -> None:
    """Hydra's composed config -> validation, pre-start checks, then the run (or the plan of a dry run)."""
    from ragen.launch import cli_main, validate

    cli_main(cfg, validate)


COMMAND = HydraCommand(
    name="train",
    module="ragen.train",
    config_name="base",
    summary=("Train an LLM agent with a PPO-family advantage estimator (gae, turn_gae, bilevel_gae, weighted_gae, "
             "grpo, rloo, reinforce_pp, ms_grpo, ms_po, gigpo). The config is checked before anything starts; the "
             "launch scripts run this command with their experiment config (train_ppo.sh: ppo_bandit, "
             "train_ppo_multi_turn.sh: ppo_multi_turn, train_ppo_bilevel.sh: ppo_bilevel, "
             "scripts/train_search_qa.sh RUN: search_qa_RUN)."),
    examples=(
        ("--config-name ppo_bandit", "= bash train_ppo.sh: PPO (GAE) on the bandit env, default model"),
        ("--config-name ppo_multi_turn", "= bash train_ppo_multi_turn.sh: FrozenLake 3x3, token GAE"),
        ("--config-name ppo_bilevel", "= bash train_ppo_bilevel.sh: FrozenLake 3x3, bi-level GAE"),
        ("--config-name ppo_bilevel env=sokoban", "another env from config/env/"),
        ("--config-name search_qa_ms_grpo", "= bash scripts/train_search_qa.sh ms_grpo"),
        ("--config-name ppo_bandit algorithm=grpo rollout.group_size=8", "critic-free, group-relative"),
        ("--config-name ppo_bandit model=tiny trainer.total_steps=2 --check", "the plan only; nothing starts"),
        ("--config-name ppo_bilevel trainer=gpu trainer.use_ray=true trainer.n_gpus_per_node=8 "
         "model.path=Qwen/Qwen2.5-3B-Instruct --check", ""),
        ("--config-name ppo_bandit trainer.resume=auto", "continue from the latest complete checkpoint"),
        ("--config-name ppo_bandit --cfg job --resolve", "the composed config, interpolations resolved"),
    ),
    outputs=RUN_OUTPUTS,
    task=task,
)


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    return run_command(COMMAND, argv, prog)
