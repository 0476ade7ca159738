"""An engine that knows which policy version it holds, and stamps it on every sample (asynchronous training,
docs/async.md).

:class:`VersionedEngine` wraps any ``Engine`` (``ragen.rollout.base``). The trainer's policy version is the number of
complete training steps whose weights the engine holds; :meth:`VersionedEngine.publish` loads the weights of a new
version and sets the version in one critical section, so no sample can carry a version its weights do not have. Each
``generate`` call runs under the same lock and puts the version it ran under in every sample's
``extra["policy_version"]`` (the agent proxy keeps it per token, ``RolloutBatch.sample_versions``).

The lock makes weights change only between forward passes: a weight load waits for the ``generate`` call in flight
to end, never tearing it. :meth:`VersionedEngine.hold` keeps the lock over several calls (a whole rollout batch,
when partial rollouts are off): the next version is then published only after the batch ends. The lock is
re-entrant, so calls inside ``hold`` from the same thread pass.

A weight load drops the kept KV caches of the old weights (the hf engine's ``update_weights`` clears its prefix
store; vLLM's sync resets its prefix cache): an episode that continues under new weights recomputes its history's
keys and values at its next turn.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from ragen.rollout.base import VERSION_KEY, Sample, SamplingParams


class VersionedEngine:
    """The ``Engine`` protocol over ``engine``, with a policy ``version`` (module docstring). ``version``: the
    version the wrapped engine holds now (the run's complete steps at the start or a resume)."""

    def __init__(self, engine: Any, version: int = 0) -> None:
        self.engine = engine
        self._version = int(version)
        self._lock = threading.RLock()
        self.publish_wait_s = 0.0  # the last publish's wait for the engine (a generate call, or a held batch)

    @property
    def version(self) -> int:
        """The policy version the engine holds (changes only in :meth:`publish`)."""
        return self._version

    @property
    def asleep(self) -> frozenset[str]:
        return self.engine.asleep

    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingParams) -> list[Sample]:
        """The wrapped engine's samples, each stamped with the version it was generated under."""
        with self._lock:
            version = self._version
            samples = self.engine.generate(prompt_token_ids, sampling)
        for sample in samples:
            sample.extra[VERSION_KEY] = version
        return samples

    def publish(self, version: int, load: Callable[[], Any] | None) -> Any:
        """Load the weights of ``version`` (``load()``, e.g. the trainer's weight sync; None: the weights did not
        change, e.g. a step whose update was skipped) and make ``version`` the engine's version, atomically with
        respect to ``generate``. Returns what ``load`` returned."""
        if version < self._version:
            raise ValueError(f"policy version goes back from {self._version} to {version}")
        start = time.perf_counter()
        with self._lock:
            self.publish_wait_s = time.perf_counter() - start
            out = None if load is None else load()
            self._version = int(version)
        return out

    def reset_version(self, version: int) -> None:
        """The version after a resume or a restart rewound the run to step ``version`` (the engine has just been
        given that checkpoint's weights)."""
        with self._lock:
            self._version = int(version)

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Within: no weight load and no other thread's ``generate`` (one rollout batch under one version)."""
        with self._lock:
            yield

    def update_weights(self, state_dict: dict[str, Any] | Iterable[tuple[str, Any]]) -> Any:
        """Load weights into the wrapped engine between its forward passes (the version changes only in
        :meth:`publish`, which calls this through its ``load``)."""
        with self._lock:
            return self.engine.update_weights(state_dict)

    def sleep(self) -> None:
        with self._lock:
            self.engine.sleep()

    def wake(self, tags: tuple[str, ...] | None = None) -> None:
        with self._lock:
            self.engine.wake(tags)

    def __getattr__(self, name: str) -> Any:  # engine-specific extras (prefix_cache_paused, retain_prefixes, ...)
        return getattr(self.engine, name)
