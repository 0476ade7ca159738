"""Asynchronous rollouts with bounded staleness: the next batches are played while the trainer updates
(docs/async.md).

With ``trainer.async_rollout=true`` a :class:`RolloutQueue` plays training batches on a thread of its own through the
train proxy, over a :class:`ragen.rollout.versioned.VersionedEngine` that stamps every sampled token with the policy
version that sampled it (``RolloutBatch.sample_versions``). The policy version is the number of complete training
steps whose weights the engine holds; step ``s`` (0-based) consumes batch ``s`` and publishes version ``s + 1``.

* **Staleness** of a row consumed by step ``s``: ``s`` minus the oldest version among its model tokens
  (:func:`row_staleness`); a group's is that of its stalest row. ``trainer.max_staleness`` (k) bounds it.
* **Admission** (``trainer.stale_policy=wait``, the default): batch ``b`` starts only once the trainer has released
  step ``b - k`` (finished it, validation and checkpoint included), so the engine holds version ``>= b - k`` from its
  first token on, in flight and while queued, and nothing is ever dropped. At k = 0 batch ``b`` starts after step
  ``b - 1`` ended: the same calls in the same order as the synchronous loop, hence the same numbers.
* **Drop** (``stale_policy=drop``): batches start as soon as the queue has room (``k + 1`` batches), and groups whose
  staleness exceeds k at consumption are dropped whole (:func:`stale_groups`: group sizes stay fixed); a batch left
  empty is skipped for the next one.
* **Partial rollouts** (``trainer.partial_rollouts=true``): a weight sync does not wait for the batch in flight; its
  later turns are sampled under the new version and their tokens say so. Without it the producer holds the engine
  for its whole batch (``VersionedEngine.hold``), so a batch is one version and the sync waits for it.

A checkpoint records the train proxy's seed counters after the last *consumed* batch; what the queue holds is
discarded at a stop, a resume or a restart and replayed from the same seeds under the resumed policy, so no episode
is trained twice and none is skipped. An error in the rollout thread is raised by the trainer's next :meth:`get`.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from ragen.trainer.config.schema import STALE_POLICIES


@dataclass
class QueuedBatch:
    """One played batch: the step that consumes it (``index``), the batch, its rollout's wall seconds, the train
    proxy's seed counters after it (what a checkpoint records) and the engine's version when it began."""

    index: int
    batch: Any
    rollout_s: float
    proxy_state: dict[str, int]
    started_version: int


def row_staleness(versions: torch.Tensor, consumer_version: int) -> torch.Tensor:
    """(B,) long: ``consumer_version`` minus the oldest version among each row's model tokens.

    ``versions``: (B, T) long, ``RolloutBatch.sample_versions`` (-1 off model tokens); a row without versioned tokens
    (a placeholder, a failed episode) has staleness 0."""
    big = torch.iinfo(torch.long).max
    oldest = torch.where(versions >= 0, versions, torch.full_like(versions, big)).min(dim=1).values
    return torch.where(oldest == big, torch.zeros_like(oldest), consumer_version - oldest)


def stale_groups(staleness: torch.Tensor, group_ids: torch.Tensor, max_staleness: int) -> torch.Tensor:
    """(B,) bool: the rows of every group (``group_ids``, (B,) long) in which some row's ``staleness`` ((B,) long,
    :func:`row_staleness`) exceeds ``max_staleness``; whole groups, so the kept ones keep their size."""
    over = staleness > max_staleness
    bad = torch.unique(group_ids[over])
    return torch.isin(group_ids, bad)


def may_start(index: int, released: int, queued: int, max_staleness: int, policy: str, last: int) -> bool:
    """Whether batch ``index`` may start: never past the run's last step (``last``, exclusive, plus the batches
    ``drop`` discarded whole); under ``wait`` once
    ``index - released <= max_staleness`` (``released``: steps the trainer has finished); under ``drop`` while the
    queue (``queued`` batches) has room for ``max_staleness + 1``."""
    if index >= last:
        return False
    if policy == "wait":
        return index - released <= max_staleness
    return queued < max_staleness + 1


class RolloutQueue:
    """Plays the train proxy's batches on a thread and hands them to the trainer in order (module docstring).

    ``proxy``: the train proxy (``rollout("train")``, ``state_dict()``) over ``engine`` (a ``VersionedEngine``);
    ``first``: the step the first batch is for (the run's complete steps, at the start or a resume); ``last``: the
    run's ``trainer.total_steps``."""

    def __init__(self, proxy: Any, engine: Any, *, max_staleness: int, stale_policy: str, partial: bool, first: int,
                 last: int) -> None:
        if max_staleness < 0 or stale_policy not in STALE_POLICIES:
            raise ValueError(f"max_staleness must be >= 0 and stale_policy one of {STALE_POLICIES}, got "
                             f"{max_staleness}, {stale_policy!r}")
        self.proxy, self.engine = proxy, engine
        self.k, self.policy, self.partial, self.last = max_staleness, stale_policy, partial, last
        self._next = self._released = first
        self._queue: deque[QueuedBatch] = deque()
        self._cond = threading.Condition()
        self._stop = False
        self._error: BaseException | None = None
        self._idle_s = 0.0  # the rollout thread's time waiting for admission or room, since the last get
        self._since = time.perf_counter()
        self.dropped_groups = 0
        self.dropped_batches = 0
        self._thread = threading.Thread(target=self._play, name="ragen-rollout", daemon=True)

    def start(self) -> RolloutQueue:
        self._thread.start()
        return self

    def _play(self) -> None:
        try:
            while True:
                with self._cond:
                    t0 = time.perf_counter()
                    while not self._stop and not may_start(self._next, self._released, len(self._queue), self.k,
                                                           self.policy, self.last + self.dropped_batches):
                        self._cond.wait()
                    self._idle_s += time.perf_counter() - t0
                    if self._stop:
                        return
                    index, started = self._next, self.engine.version
                    self._next += 1
                t1 = time.perf_counter()
                with nullcontext() if self.partial else self.engine.hold():
                    batch = self.proxy.rollout("train")
                    state = self.proxy.state_dict()
                item = QueuedBatch(index, batch, time.perf_counter() - t1, state, started)
                with self._cond:
                    self._queue.append(item)
                    self._cond.notify_all()
        except BaseException as exc:  # noqa: BLE001 - handed to the trainer's next get
            with self._cond:
                self._error = exc
                self._cond.notify_all()

    def get(self, step: int) -> tuple[QueuedBatch, dict[str, float]]:
        """The batch step ``step`` trains on and its ``async/*`` metrics; under ``drop``, its stale groups are dropped
        (a batch left empty is skipped for the next one). Raises the rollout thread's error, if it had one."""
        dropped = 0
        while True:
            with self._cond:
                while not self._queue and self._error is None:
                    self._cond.wait()
                if self._error is not None:
                    raise self._error
                queued = len(self._queue)
                item = self._queue.popleft()
                self._cond.notify_all()
            staleness = row_staleness(_versions(item.batch), step)
            if self.policy == "drop":
                drop = stale_groups(staleness, item.batch.group_ids, self.k)
                if bool(drop.any()):
                    n = int(torch.unique(item.batch.group_ids[drop]).numel())
                    dropped += n
                    self.dropped_groups += n
                    if bool(drop.all()):  # one more batch to play for the run's last step
                        with self._cond:
                            self.dropped_batches += 1
                            self._cond.notify_all()
                        continue
                    item.batch = item.batch.select(torch.nonzero(~drop).flatten())
                    staleness = staleness[~drop]
            elif staleness.numel() and int(staleness.max()) > self.k:
                raise RuntimeError(f"a batch for step {step} is {int(staleness.max())} versions stale under admission "
                                   f"control with trainer.max_staleness={self.k}: the weight sync or the version "
                                   "accounting is broken")
            return item, self._metrics(item, staleness, queued, dropped)

    def _metrics(self, item: QueuedBatch, staleness: torch.Tensor, queued: int, dropped: int) -> dict[str, float]:
        now = time.perf_counter()
        with self._cond:
            idle, self._idle_s, since, self._since = self._idle_s, 0.0, self._since, now
        st = staleness.float()
        return {"async/staleness_mean": float(st.mean()) if st.numel() else 0.0,
                "async/staleness_max": float(st.max()) if st.numel() else 0.0,
                "async/queue_len": float(queued), "async/dropped_groups": float(dropped),
                "async/dropped_groups_total": float(self.dropped_groups),
                "async/rollout_s": item.rollout_s,
                "async/engine_idle_frac": min(1.0, idle / max(now - since, 1e-9))}

    def release(self, steps: int) -> None:
        """The trainer has finished ``steps`` steps (validation and checkpoint included): admit what that allows."""
        with self._cond:
            self._released = max(self._released, steps)
            self._cond.notify_all()

    def stop(self) -> int:
        """Stop the rollout thread (it ends the batch it is playing) and discard the queue; returns how many batches
        were discarded (their episodes are replayed from the checkpoint's seed counters after a resume)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join()
        with self._cond:
            discarded = len(self._queue)
            self._queue.clear()
        return discarded


def _versions(batch: Any) -> torch.Tensor:
    v = getattr(batch, "sample_versions", None)
    if v is None:
        raise ValueError("asynchronous training needs batches with sample_versions (a VersionedEngine's samples)")
    return v
