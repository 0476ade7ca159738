"""The inference-engine protocol the agent proxy talks to (docs/design.md, engines).

Token in, token out: prompts are token-id lists and samples come back as the exact sampled ids with
the log-probs of the distribution actually sampled from (after temperature; keep top_p=1, top_k=0
for training rollouts so the trainer's recomputed log-probs agree).
"""

from __future__ import annotations

from collections.abc import Iterable
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


@runtime_checkable
class Engine(Protocol):
    """A batched sampler over token ids."""

    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingParams) -> list[Sample]: ...

    def update_weights(self, state_dict: dict[str, Any] | Iterable[tuple[str, Any]]) -> None: ...

    def sleep(self) -> None: ...

    def wake(self, tags: tuple[str, ...] | None = None) -> None:
        """Undo ``sleep``; ``tags`` (vLLM: "weights", "kv_cache") wake only that part, None = all."""
        ...
