"""Values derived from the frozen config (never stored back into it): roles, world sizes, batch shapes."""

from __future__ import annotations

import math

from ragen.trainer.config import TrainConfig

# Estimators that normalise within env groups and so need group_size >= 2.
GROUP_ESTIMATORS = ("grpo", "rloo", "ms_grpo", "ms_po", "gigpo")


def estimator_needs_values(name: str) -> bool:
    """True when estimator ``name`` reads the critic's values (its registry spec lists ``values``)."""
    from ragen.algorithms import ADVANTAGE_ESTIMATORS

    spec = ADVANTAGE_ESTIMATORS.get(name)
    return spec is not None and "values" in spec.needs


def needs_critic(cfg: TrainConfig) -> bool:
    """Critic on: ``critic.enable`` when set, else exactly when the estimator needs values."""
    if cfg.critic.enable is not None:
        return bool(cfg.critic.enable)
    return estimator_needs_values(cfg.algorithm.estimator)


def uses_kl(cfg: TrainConfig) -> bool:
    return bool(cfg.actor.use_kl_loss or cfg.algorithm.kl_in_reward)


def needs_ref(cfg: TrainConfig) -> bool:
    """Reference worker on: ``ref.enable`` when set, else exactly when a KL term is used."""
    if cfg.ref.enable is not None:
        return bool(cfg.ref.enable)
    return uses_kl(cfg)


def device(cfg: TrainConfig) -> str:
    """``cpu`` or ``cuda`` (``auto`` = cuda when GPUs are configured and visible)."""
    if cfg.trainer.device != "auto":
        return cfg.trainer.device
    import torch

    return "cuda" if cfg.trainer.n_gpus_per_node > 0 and torch.cuda.is_available() else "cpu"


def total_gpus(cfg: TrainConfig) -> int:
    return cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes


def world_size(cfg: TrainConfig, role: str) -> int:
    """World size of ``role`` (actor / critic / ref): the configured one, else all GPUs, else 1."""
    value = getattr(cfg.trainer, f"{role}_world_size")
    if value is not None:
        return int(value)
    return max(1, total_gpus(cfg)) if device(cfg) == "cuda" else 1


def kept_groups(cfg: TrainConfig) -> int:
    """Groups kept after rollout filtering: ``ceil(rollout_filter_ratio * n_groups)`` (at least 1)."""
    return max(1, math.ceil(cfg.algorithm.rollout_filter_ratio * cfg.rollout.n_groups - 1e-9))


def train_batch_size(cfg: TrainConfig) -> int:
    """Sequences per training step after filtering (``turn`` layout: one row per turn, so this counts episodes)."""
    return kept_groups(cfg) * cfg.rollout.group_size
