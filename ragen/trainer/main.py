"""Run a training (or evaluation) job from a frozen config: validate, set up, fit, shut down."""

from __future__ import annotations

from typing import Any

from ragen.trainer.config import TrainConfig
from ragen.trainer.validate import validate


def run(cfg: TrainConfig) -> dict[str, float]:
    """Validate ``cfg`` (before anything starts), then train, or evaluate when ``trainer.val_only``.

    Returns the final metrics. Workers, Ray (when this call started it) and loggers are shut down even on
    errors.
    """
    validate(cfg)
    from ragen.trainer.ppo_trainer import PPOTrainer

    trainer = PPOTrainer(cfg)
    started_ray = _ray_running() is False
    try:
        trainer.setup(with_workers=not cfg.trainer.val_only)
        return trainer.evaluate() if cfg.trainer.val_only else trainer.fit()
    finally:
        trainer.shutdown()
        if started_ray and cfg.trainer.use_ray and not cfg.trainer.val_only:
            import ray

            ray.shutdown()


def _ray_running() -> Any:
    try:
        import ray
    except ImportError:
        return None
    return ray.is_initialized()
