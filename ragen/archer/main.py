"""Validate and run an ArCHer-family job from a frozen config (``ragen.launch`` hands it ``algorithm.name`` archer,
chai or filtered_bc)."""

from __future__ import annotations

from dataclasses import fields

import ragen.trainer.config.shared_checks  # noqa: F401  (registers the checks both families share)
from ragen.archer.dialogues import dialogue_problems
from ragen.trainer.config.archer_schema import ALGORITHMS, ArcherSection, critic_problems, uses_critic
from ragen.trainer.config.preflight import preflight, register, register_family
from ragen.trainer.config.run_shape import world_size
from ragen.trainer.config.schema import TrainConfig, TrainerSection
from ragen.trainer.layout import layout_of

register_family("archer", ALGORITHMS)


@register("archer", reads=("algorithm", "archer", "critic", "agent.layout", "actor.mini_batch_size",
                           "actor.micro_batch_size", "trainer"), families=("archer",))
def check_archer(cfg: TrainConfig) -> list[str]:
    """Problems specific to the ArCHer family (each names its key and the fix)."""
    a, name, out = cfg.archer, cfg.algorithm.name, []
    if name not in ALGORITHMS:
        out.append(f"algorithm.name={name!r} is not in the ArCHer family; use one of {', '.join(ALGORITHMS)} "
                   "(ppo runs with python -m ragen.train)")
    if uses_critic(name):
        out += critic_problems(cfg.critic)
        ws = world_size(cfg, "critic")
        if ws >= 1 and a.batch_size % ws:
            out.append(f"archer.batch_size={a.batch_size} must be a multiple of trainer.critic_world_size={ws} "
                       "(each critic mini-batch is split evenly over the critic ranks)")
    if not uses_critic(name) and a.critic_micro_batch_size is not None:
        out.append(f"archer.critic_micro_batch_size={a.critic_micro_batch_size} has no effect: {name} trains no "
                   "critic; set it to null")
    defaults = ArcherSection()
    if name != "chai" and a.chai_candidates != defaults.chai_candidates:
        out.append(f"archer.chai_candidates={a.chai_candidates} has no effect: only online CHAI samples candidates "
                   f"(algorithm.name={name}); remove the override")
    if name != "filtered_bc" and a.filter_quantile != defaults.filter_quantile:
        out.append(f"archer.filter_quantile={a.filter_quantile} has no effect: only online filtered BC filters "
                   f"trajectories (algorithm.name={name}); remove the override")
    if name != "filtered_bc" and a.bc_loss_agg != "token-mean":
        out.append(f"archer.bc_loss_agg={a.bc_loss_agg!r} is online filtered BC's loss and has no effect with "
                   f"algorithm.name={name}; leave it at token-mean")
    for key in ("collapse_every", "collapse_prompts"):
        value, default = getattr(cfg.trainer, key), getattr(TrainerSection(), key)
        if value != default:
            out.append(f"trainer.{key}={value} has no effect: the ArCHer family logs no collapse metrics (the PPO "
                       f"trainer does); remove the override (default {default})")
    for key in ("async_rollout", "max_staleness", "stale_policy", "partial_rollouts"):
        value, default = getattr(cfg.trainer, key), getattr(TrainerSection(), key)
        if value != default:
            out.append(f"trainer.{key}={value} has no effect: the ArCHer family trains synchronously (asynchronous "
                       f"training is the PPO trainer's); remove the override (default {default})")
    out += dialogue_problems(cfg)
    out += _rollout_correction_problems(cfg)
    out += layout_of(cfg).turn_rows_problems("the ArCHer family stores one replay record per turn with the exact "
                                             "prompt the model saw")
    if name != "chai" and a.batch_size % cfg.actor.mini_batch_size:
        out.append(f"archer.batch_size={a.batch_size} must be a multiple of actor.mini_batch_size="
                   f"{cfg.actor.mini_batch_size} (each actor / BC mini-batch is one or more optimizer steps)")
    mini, micro, aws = cfg.actor.mini_batch_size, cfg.actor.micro_batch_size, world_size(cfg, "actor")
    if aws >= 1 and mini % aws:
        out.append(f"actor.mini_batch_size={mini} must be a multiple of trainer.actor_world_size={aws}")
    elif aws >= 1 and (mini // aws) % micro:
        out.append(f"actor.micro_batch_size={micro} (per rank) must divide the per-rank mini-batch {mini}/{aws}="
                   f"{mini // aws}")
    return out


def _rollout_correction_problems(cfg: TrainConfig) -> list[str]:
    """``algorithm.rollout_correction`` weights the PPO trainer's policy loss; the ArCHer family's losses never read
    it."""
    from ragen.algorithms.rollout_correction import RolloutCorrectionConfig

    rc, defaults = cfg.algorithm.rollout_correction, RolloutCorrectionConfig()
    return [f"algorithm.rollout_correction.{f.name}={getattr(rc, f.name)!r} has no effect: it weights the PPO "
            f"trainer's policy loss, which algorithm.name={cfg.algorithm.name} does not use; remove the override"
            for f in fields(rc) if getattr(rc, f.name) != getattr(defaults, f.name)]


def validate_archer(cfg: TrainConfig) -> None:
    """The registered checks of the ``archer`` family (``ragen.trainer.config.preflight``: the checks both families
    share, ``ragen.trainer.config.shared_checks``, plus :func:`check_archer`); raises one ConfigError."""
    preflight(cfg, "archer")


def run(cfg: TrainConfig) -> dict[str, float]:
    """Validate, set up, train, shut down (Ray too when this call started it)."""
    from ragen.plugins import load_plugins

    load_plugins(cfg.imports)
    validate_archer(cfg)
    import ray

    from ragen.archer.trainer import ArcherTrainer

    started_ray = not ray.is_initialized()
    trainer = ArcherTrainer(cfg)
    try:
        trainer.setup()
        return trainer.fit()
    finally:
        trainer.shutdown()
        if started_ray and cfg.trainer.use_ray and ray.is_initialized():
            ray.shutdown()
