"""The two row layouts of a rollout, as the agent sees them: how finished episodes become rows (docs/design.md, the
two layouts). ``agent.layout`` names one of :data:`ROW_LAYOUTS`, looked up once (:func:`row_layout`).

* ``trajectory`` (:class:`TrajectoryRows`): one row per episode, ``[prompt][turn 0][env][turn 1]...`` from the exact
  sampled ids. A row whose history was cut from some prompt (``max_context_window`` / ``max_model_len``) is not what
  the model saw at that turn: it is masked (trains nothing).
* ``turn`` (:class:`TurnRows`): one row per generated turn, the exact prompt the model saw + its response (+ the
  end-of-turn token when the response lacks it). An episode without turns keeps a placeholder row.

An episode that failed before its first prompt (no context) has a one-token placeholder row (pad id, attention 1, no
model token) in both layouts, so every episode keeps a row and attention never covers an empty row.

What training does with each layout's rows (train batches, padding, advantages, config checks) is the trainer's half,
``ragen.trainer.layout``; each of its layouts holds the matching object of this module as ``rows``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from ragen.agent.context import EpisodeContext


@dataclass
class Row:
    """One row before padding: token ids, the engine's log-probs (0 off model tokens), per token the trained turn id
    (-1 off model tokens), its episode (slot index), its turn (-1: a whole episode or a placeholder), and whether it
    is masked (its tokens are not what the model saw: it trains nothing)."""

    ids: list[int]
    log_probs: list[float]
    turn_ids: list[int]
    episode: int
    turn: int
    masked: bool = False


def turn_map(ctx: EpisodeContext | None, n_turns: int) -> list[int]:
    """The trained turn id of each of the episode's ``n_turns`` env turns (``ragen.agent.collate``): turns with model
    tokens are numbered 0, 1, ... in order; an empty turn takes the id of the previous turn with tokens, a leading
    one that of the first (0)."""
    sizes = [len(ctx.responses[k][0]) if ctx is not None and k < len(ctx.responses) else 0 for k in range(n_turns)]
    out, last = [], -1
    for n in sizes:
        last += n > 0
        out.append(max(last, 0))
    return out


def placeholder(pad_id: int, episode: int) -> Row:
    """The one-token row of an episode without trainable tokens (module docstring)."""
    return Row([pad_id], [0.0], [-1], episode, -1)


class RowLayout(Protocol):
    """How one layout turns episodes into rows, and the row facts that follow from it."""

    name: str
    history_thinking: tuple[str, ...]  # the agent.history_thinking modes under which a row is what the model saw

    def rows(self, contexts: list[EpisodeContext | None], pad_id: int, max_len: int) -> list[Row]:
        """The rows of the episodes ``contexts`` (None: failed before its first prompt), each at most ``max_len``
        tokens, model tokens labelled with their trained turn id (:func:`turn_map`), in episode order."""
        ...

    def call_rows(self, episode: int, runs: list[Any]) -> list[Row]:
        """The rows of an episode recorded as runs of merged calls (``ragen.gateway.record.merge_calls``: each run
        has ``ids``, ``log_probs``, ``turn_ids`` and its ``index``; more than one run = the history forked), never
        empty ``runs``."""
        ...

    def max_rows(self, episodes: int, max_turns: int) -> int:
        """The most rows ``episodes`` episodes of at most ``max_turns`` turns give."""
        ...

    def fixed_rows(self, episodes: int) -> int | None:
        """The row count of ``episodes`` episodes when it does not depend on the rollout, else None."""
        ...


class TrajectoryRows:
    """One row per episode (module docstring)."""

    name = "trajectory"
    history_thinking = ("keep",)  # a row holds every turn's thinking, which later prompts leave out under strip

    def call_rows(self, episode: int, runs: list[Any]) -> list[Row]:
        # one row: the last run; after a fork no single row is what the model saw at every call, so it trains nothing
        last = runs[-1]
        return [Row(list(last.ids), list(last.log_probs), list(last.turn_ids), episode, -1, masked=len(runs) > 1)]

    def rows(self, contexts: list[EpisodeContext | None], pad_id: int, max_len: int) -> list[Row]:
        out = []
        for e, ctx in enumerate(contexts):
            if ctx is None:
                out.append(placeholder(pad_id, e))
                continue
            tmap = turn_map(ctx, ctx.num_turns)
            n = len(ctx.trained_ids(max_len))
            out.append(Row(ctx.ids[:n], ctx.log_probs[:n], [tmap[k] if k >= 0 else -1 for k in ctx.turn_ids[:n]],
                           e, -1, masked=ctx.history_cut))
        return out

    def max_rows(self, episodes: int, max_turns: int) -> int:
        return episodes

    def fixed_rows(self, episodes: int) -> int | None:
        return episodes


class TurnRows:
    """One row per generated turn (module docstring)."""

    name = "turn"
    history_thinking = ("keep", "strip")

    def call_rows(self, episode: int, runs: list[Any]) -> list[Row]:
        return [Row(list(r.ids), list(r.log_probs), list(r.turn_ids), episode, r.index) for r in runs]

    def rows(self, contexts: list[EpisodeContext | None], pad_id: int, max_len: int) -> list[Row]:
        out = []
        for e, ctx in enumerate(contexts):
            if ctx is None or ctx.num_turns == 0:
                out.append(placeholder(pad_id, e))
                continue
            tmap = turn_map(ctx, ctx.num_turns)
            for k, (resp, lps) in enumerate(ctx.responses):
                prompt = ctx.turn_prompts[k]
                close = [] if resp and resp[-1] == ctx.fmt.eot_id else [ctx.fmt.eot_id]
                ids = (prompt + resp + close)[:max_len]  # only an appended closing token can pass the budget
                out.append(Row(ids, ([0.0] * len(prompt) + lps + [0.0] * len(close))[:max_len],
                               ([-1] * len(prompt) + [tmap[k]] * len(resp) + [-1] * len(close))[:max_len], e, k))
        return out

    def max_rows(self, episodes: int, max_turns: int) -> int:
        return episodes * max_turns

    def fixed_rows(self, episodes: int) -> int | None:
        return None  # as many rows as the episodes took turns


ROW_LAYOUTS: dict[str, RowLayout] = {layout.name: layout for layout in (TrajectoryRows(), TurnRows())}


def row_layout(name: str) -> RowLayout:
    """The row layout ``name`` (``agent.layout``); a ValueError names the choices."""
    try:
        return ROW_LAYOUTS[name]
    except KeyError:
        raise ValueError(f"AgentConfig.layout must be one of {tuple(ROW_LAYOUTS)}, got {name!r}") from None
