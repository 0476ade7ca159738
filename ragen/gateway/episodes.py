"""What the gateway keeps per episode: its calls' records, the tips new prompts may continue from, the answers to
replay to retried requests, and whether the episode failed (docs/gateway.md).

The HTTP server (``ragen.gateway.server``) fills an :class:`EpisodeBook`; the driver of agent programs reads each
episode's rows (``ragen.gateway.record.merge_calls``) and the book's counters. The book is used from the server's
event loop only (no locks): a reader outside it reads after the programs of a batch have finished.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ragen.gateway.record import CallRecord, EpisodeRows, merge_calls, merge_counters
from ragen.gateway.render import PromptRenderer, Tip
from ragen.gateway.toolcalls import ToolParser
from ragen.rollout.base import Sample


@dataclass
class Prepared:
    """A call's rendered prompt: the template's text and the ids the engine gets."""

    text: str
    ids: list[int]


@dataclass
class EpisodeLog:
    """One episode (one run of a program): its records in answer order, the tips of its samples (same order),
    the responses by request id, its failure (``failed``, with every error message in ``errors``), and whether it
    is ``closed`` (its program has ended: later calls are refused)."""

    key: str
    calls: list[CallRecord] = field(default_factory=list)
    tips: list[Tip] = field(default_factory=list)
    responses: dict[str, Any] = field(default_factory=dict)
    failed: bool = False
    errors: list[str] = field(default_factory=list)
    closed: bool = False

    def prepare(self, renderer: PromptRenderer, messages: list[dict[str, Any]],
                tools: list[dict[str, Any]] | None = None) -> Prepared:
        """Render a call's messages; the ids continue the most recent tip the text extends (``render``)."""
        text = renderer.text(messages, tools)
        return Prepared(text, renderer.prompt_ids(text, self.tips[::-1]))

    def record(self, renderer: PromptRenderer, parser: ToolParser, request_id: str, prompt: Prepared,
               samples: Sequence[Sample]) -> list[CallRecord]:
        """Record a call's samples (one record each, in sample order) with their tool-call parses."""
        out = []
        for s, sample in enumerate(samples):
            parse = parser.parse(renderer.completion_text(sample.token_ids), seed=f"{request_id}:{s}")
            rec = CallRecord(self.key, request_id, s, tuple(prompt.ids), tuple(sample.token_ids),
                             tuple(float(x) for x in sample.log_probs), sample.finish_reason, parse)
            self.calls.append(rec)
            self.tips.append(renderer.tip(prompt.text, prompt.ids, sample.token_ids))
            out.append(rec)
        return out

    def fail(self, message: str) -> None:
        self.failed = True
        self.errors.append(message)

    def rows(self) -> EpisodeRows:
        return merge_calls(self.calls)


class EpisodeBook:
    """The episodes a gateway served, by key (created on their first call)."""

    def __init__(self) -> None:
        self.episodes: dict[str, EpisodeLog] = {}

    def episode(self, key: str) -> EpisodeLog:
        if key not in self.episodes:
            self.episodes[key] = EpisodeLog(key)
        return self.episodes[key]

    def counters(self) -> dict[str, float]:
        """The merge counters over all episodes (``record.merge_counters``) and ``gateway/failed_episodes``."""
        out = merge_counters(ep.rows() for ep in self.episodes.values())
        out["gateway/failed_episodes"] = float(sum(ep.failed for ep in self.episodes.values()))
        return out
