"""Non-finite numbers never reach the weights.

Before the critic and actor updates the driver checks every input tensor of the update, in the order they are
produced: rollout rewards and sampling log-probs, then values, old / reference log-probs, advantages and returns.
A NaN or inf anywhere (also off the response mask: ``nan * 0`` is still NaN) skips both updates and the weight
sync of that step; the step's metrics say which tensors (``nonfinite/<tensor>`` = number of bad entries,
``train/skipped_update`` = 1). A worker whose gradient norm is not finite skips that optimizer step
(``<role>/skipped_steps``, ``ragen.workers.trainable``). :class:`SkipGuard` counts consecutive steps with a skip
and, after ``trainer.max_consecutive_skips`` of them, stops the run with :class:`NonFiniteError` naming the tensor:
the last complete checkpoint (written before the bad steps) stays the one ``trainer.resume=auto`` picks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ragen.utils.console import RunStopped


class NonFiniteError(RunStopped):
    """Too many consecutive training steps were skipped because of NaN / inf numbers."""


def nonfinite_counts(tensors: dict[str, torch.Tensor | None]) -> dict[str, int]:
    """``{name: number of NaN / inf entries}`` of the floating-point tensors among ``tensors`` that have any, in
    the given order (None and integer tensors are skipped)."""
    out = {}
    for name, t in tensors.items():
        if t is None or not torch.is_floating_point(t):
            continue
        bad = int((~torch.isfinite(t)).sum())
        if bad:
            out[name] = bad
    return out


def update_inputs(batch, train_batch) -> dict[str, torch.Tensor | None]:
    """The tensors an update reads, by the name an error reports: ``batch`` is the ``RolloutBatch`` (rewards,
    sampling log-probs), ``train_batch`` the ``TrainBatch`` handed to the workers. Each (B, T), ``turn_rewards``
    (B, K)."""
    return {
        "token_rewards": batch.token_rewards, "turn_rewards": batch.turn_rewards,
        "sample_log_probs": batch.sample_log_probs, "values": train_batch.values,
        "old_log_probs": train_batch.old_log_probs, "ref_log_probs": train_batch.ref_log_probs,
        "advantages": train_batch.advantages, "returns": train_batch.returns, "is_weights": train_batch.is_weights,
    }


def skip_metrics(bad: dict[str, int]) -> dict[str, float]:
    """Metrics of a step whose update was skipped for the non-finite tensors ``bad``."""
    return {"train/skipped_update": 1.0, **{f"nonfinite/{k}": float(v) for k, v in bad.items()}}


def gradient_skips(metrics: dict[str, float]) -> dict[str, int]:
    """``{"<role> gradients": n}`` for the roles whose update skipped ``n`` > 0 optimizer steps (non-finite grad
    norm), read from a step's ``<role>/skipped_steps`` metrics."""
    return {f"{k.split('/')[0]} gradients": int(v) for k, v in metrics.items()
            if k.endswith("/skipped_steps") and v > 0}


class AllEpisodesFailed(RunStopped):
    """Too many consecutive training steps in which every episode failed (``trainer.max_failed_steps``)."""


@dataclass
class FailedEpisodesGuard:
    """Stops the run after ``limit`` consecutive training steps whose every episode failed: the env raised, hung or
    broke the protocol (``limit`` <= 0: never). Such steps train nothing, so a run would otherwise go on to its last
    step and end with success 0, the reasons only in ``env_errors.jsonl``."""

    limit: int
    what: str = "training step"  # what a step is called in the message ("warm-start step")
    consecutive: int = 0

    def record(self, step: int, episodes: list[Any]) -> None:
        """Register the episodes of step ``step`` (``EpisodeRecord``: ``failed``, ``env_name``, ``error``);
        raises :class:`AllEpisodesFailed` naming each env's first error when the limit is reached."""
        if not episodes or not all(ep.failed for ep in episodes):
            self.consecutive = 0
            return
        self.consecutive += 1
        if 0 < self.limit <= self.consecutive:
            first: dict[str, str] = {}
            for ep in episodes:
                first.setdefault(ep.env_name, str(ep.error))
            reasons = "; ".join(f"env {name}: {error}" for name, error in first.items())
            raise AllEpisodesFailed(
                f"every episode of the last {self.consecutive} {self.what}(s) failed (up to {self.what} {step}); "
                f"{reasons}. "
                "Each failure is in env_errors.jsonl; `ragen train ... --check` tests every env of the run in seconds. "
                "Fix the env, or raise trainer.max_failed_steps (0 = never stop)")


@dataclass
class SkipGuard:
    """Stops the run after ``limit`` consecutive skipped steps (``limit`` <= 0: never stops, only counts)."""

    limit: int
    consecutive: int = 0
    total: int = 0
    reasons: list[str] = field(default_factory=list)

    def record(self, step: int, bad: dict[str, int]) -> None:
        """Register step ``step`` and what was non-finite in it (empty: a clean step resets the count); raises
        :class:`NonFiniteError` naming the tensors of the last ``limit`` steps when the limit is reached."""
        if not bad:
            self.consecutive, self.reasons = 0, []
            return
        self.consecutive += 1
        self.total += 1
        self.reasons.append(f"step {step}: " + ", ".join(f"{k} ({v} non-finite)" for k, v in bad.items()))
        if 0 < self.limit <= self.consecutive:
            raise NonFiniteError(
                f"{self.consecutive} consecutive training steps skipped because of NaN/inf in "
                f"{', '.join(bad)} ({'; '.join(self.reasons[-self.limit:])}). The weights were not updated by these "
                "steps; resume from the last checkpoint (trainer.resume=auto) after fixing the source (env rewards, "
                "lr, precision), or raise trainer.max_consecutive_skips (0 = never stop)")
