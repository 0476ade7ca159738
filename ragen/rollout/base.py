"""The inference-engine protocol the agent proxy talks to (docs/design.md, engines).

Token in, token out: prompts are token-id lists and samples come back as the exact sampled ids with
the log-probs of the distribution actually sampled from (after temperature; keep top_p=1, top_k=0
for training rollouts so the trainer's recomputed log-probs agree).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class SamplingParams:
    """Per-call sampling settings.

    ``stop`` strings end a sample when its decoded text contains one (the stop text is kept in the
    sample); ``stop_token_ids`` end it on one of those ids (the id is kept). ``seed`` makes sampling
    reproducible where the backend supports it.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 128
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None


# Finish reasons whose row holds no valid sample (vLLM: the request was aborted, or failed inside the engine);
# the agent proxy drops such rows (the slot fails and trains nothing) and counts them.
DROPPED_REASONS = frozenset({"abort", "error"})

# ``Sample.extra`` key of the policy version a sample was generated under (``ragen.rollout.versioned``)
VERSION_KEY = "policy_version"


@dataclass
class Sample:
    """One generated continuation: ids, their log-probs (same length), and why it ended.

    ``finish_reason``: "stop" (stop string / stop id / eos, kept as the last token), "length" (token budget), and
    from vLLM also "repetition" (its repetition detector ended a real sample), "abort" or "error" (no valid sample,
    see ``DROPPED_REASONS``).
    """

    token_ids: list[int]
    log_probs: list[float]
    finish_reason: str
    extra: dict[str, Any] = field(default_factory=dict)


ENGINE_PARTS = ("weights", "kv_cache")  # what ``sleep`` frees and ``wake(tags)`` brings back


class SleepState:
    """Which parts (:data:`ENGINE_PARTS`) of an engine are asleep, held by the engine itself: callers ask the
    engine (its ``asleep``) instead of keeping their own record. An engine starts awake. :meth:`sleep` frees
    (``free()``) unless every part is asleep already; :meth:`wake` brings back (``restore(parts)``) only the parts
    of ``tags`` that are asleep, so sleeping twice or waking what is awake does nothing (a restart or a resume can
    always wake everything)."""

    def __init__(self) -> None:
        self.asleep: frozenset[str] = frozenset()

    def sleep(self, free: Callable[[], None]) -> None:
        if self.asleep != frozenset(ENGINE_PARTS):
            free()
        self.asleep = frozenset(ENGINE_PARTS)

    def wake(self, tags: Iterable[str] | None, restore: Callable[[tuple[str, ...] | None], None]) -> None:
        """``restore`` gets the asleep parts of ``tags`` (None = all) in :data:`ENGINE_PARTS` order, or None when
        that is every part; unknown tags raise ``ValueError``."""
        wanted = frozenset(ENGINE_PARTS if tags is None else tags)
        unknown = wanted - frozenset(ENGINE_PARTS)
        if unknown:
            raise ValueError(f"unknown engine parts {sorted(unknown)}; use {ENGINE_PARTS}")
        todo = wanted & self.asleep
        if not todo:
            return
        restore(None if todo == frozenset(ENGINE_PARTS) else tuple(p for p in ENGINE_PARTS if p in todo))
        self.asleep = self.asleep - todo


@runtime_checkable
class Engine(Protocol):
    """A batched sampler over token ids. ``sleep`` / ``wake`` free and bring back its memory (:data:`ENGINE_PARTS`);
    the engine keeps its own :class:`SleepState` and reports what is asleep as ``asleep``."""

    @property
    def asleep(self) -> frozenset[str]: ...

    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingParams) -> list[Sample]: ...

    def update_weights(self, state_dict: dict[str, Any] | Iterable[tuple[str, Any]]) -> None: ...

    def sleep(self) -> None: ...

    def wake(self, tags: tuple[str, ...] | None = None) -> None:
        """Undo ``sleep``; ``tags`` ("weights", "kv_cache") wake only the parts of them still asleep, None = all."""
        ...
