"""GPU memory within a PPO step: the between-phase offload of the training groups and the per-phase memory peaks.

With ``trainer.offload`` resolving to ``phase`` (``ragen.trainer.config.run_shape.offload_mode``: CUDA with an engine
that
shares the training GPUs) the step runs::

    rollout -> engine sleep -> reload (actor, critic, reference) -> log-probs, values, updates
    -> offload (all but the actor's parameters) -> engine wake (weights) -> weight sync
    -> offload (the actor's parameters) -> engine wake (KV cache)

so nothing of the updates (parameters, gradients, optimizer state) is on the GPU when the engine allocates its KV
cache, and the GPU holds at most the larger of the engine and the training state, never both. The actor's
parameters leave only after the sync, which reads them (an FSDP2 gather needs them on the GPU); the engine's
weights alone are awake then. ``PPOTrainer.train_step`` calls :meth:`PhaseOffload.reload` after the engine sleeps,
and ``ragen.trainer.placement.wake_and_sync`` calls :meth:`PhaseOffload.before_wake` before each wake.

:func:`step_metrics` collects the memory peaks of the step's phases (``ragen.utils.memory.PhaseMemory``):
each worker rank records its own (``<role>_log_probs``, ``ref_log_probs``, ``<role>_values``, ``<role>_update``,
``actor_ref_log_probs`` for a LoRA actor), the driver its engine phases (``rollout``, ``weight_sync``:
:data:`DRIVER_PHASES`); a key's value is the largest over ranks (the rank nearest to running out of memory is the
one that matters).
"""

from __future__ import annotations

import time
from typing import Any

from ragen.trainer.config.run_shape import offload_mode
from ragen.trainer.config.schema import TrainConfig
from ragen.utils.memory import PHASE_MEMORY, max_peaks

TRAINING_ROLES = ("actor", "critic", "ref")
DRIVER_PHASES = ("rollout", "weight_sync")  # measured in the driver process, where an in-process engine runs


class PhaseOffload:
    """The offload schedule of one step over the training worker groups (``actor`` / ``critic`` / ``ref``; None
    entries are skipped). ``offload_s``: seconds spent offloading (inside ``timing/weight_sync``), logged as
    ``timing/offload``; the reload is a phase of its own (``timing/reload``)."""

    def __init__(self, workers: dict[str, Any]) -> None:
        self.groups = {r: workers[r] for r in TRAINING_ROLES if workers.get(r) is not None}
        self.offload_s = 0.0

    def reload(self) -> None:
        """Before the first training phase: every group's state back on its GPUs."""
        for group in self.groups.values():
            group.call("reload")

    def before_wake(self, tags: tuple[str, ...] | None) -> None:
        """Before ``engine.wake(tags)``: off the GPUs goes everything but the actor's parameters when only the
        engine's weights wake (the sync reads them next), everything when the KV cache wakes (``kv_cache`` in
        ``tags``, or ``tags`` None: all at once). Parts already off stay off."""
        everything = tags is None or "kv_cache" in tags
        start = time.perf_counter()
        for role, group in self.groups.items():
            group.call("offload", params=everything or role != "actor", optimizer=True)
        self.offload_s += time.perf_counter() - start


def phase_offload(cfg: TrainConfig, workers: dict[str, Any]) -> PhaseOffload | None:
    """This step's schedule, or None when ``trainer.offload`` resolves to none."""
    return PhaseOffload(workers) if offload_mode(cfg) == "phase" else None


def step_metrics(workers: dict[str, Any], offload: PhaseOffload | None) -> dict[str, float]:
    """The step's memory metrics: :func:`phase_memory_metrics`, and ``timing/offload`` when ``offload`` ran."""
    out = phase_memory_metrics(workers)
    if offload is not None:
        out["timing/offload"] = offload.offload_s
    return out


def phase_memory_metrics(workers: dict[str, Any]) -> dict[str, float]:
    """``memory/<phase>/...`` (GiB) of the phases run since the last call: the driver's own and every rank's of the
    training groups (``phase_memory()``, one ``PhasePeaks`` per rank), the largest value of each key. In-process
    groups share the driver's record: the first call takes it whole, the rest find it empty."""
    peaks = [PHASE_MEMORY.take()]
    for role in TRAINING_ROLES:
        if workers.get(role) is not None:
            peaks += [rank.values for rank in workers[role].call("phase_memory")]
    return max_peaks(peaks)
