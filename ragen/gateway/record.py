"""What the gateway records of each call, and how an episode's calls become training rows (docs/gateway.md).

A :class:`CallRecord` is one sample of one chat-completion call: the prompt ids exactly as the engine received them,
the ids it sampled with their log-probs, why it stopped, and what the tool-call parser read from it. A call with
``n > 1`` samples gives ``n`` records that share the request id (their ``group_id``).

**The merge rule** (:func:`merge_calls`). Calls are taken in the order the gateway answered them. Call ``i`` merges
into the row of a previous call ``j`` when its prompt ids start, token for token, with that row's ids so far (the
row ends with ``prompt_j + sampled_j``); the extra prompt tokens are env tokens (tool results, the next user
message, the template's closing and opening tokens), the sampled ids model tokens. The candidates ``j`` are the
samples of the previous request (one candidate unless it asked for ``n > 1``). Otherwise call ``i`` starts a new
row, a *fork*, with its reason (:class:`Fork`):

* ``prefix_mismatch``: the prompt differs from the previous call's row at ``position``; ``where`` says whether that
  position is in the previous prompt (``prompt``: the template re-rendered earlier history) or in the previous
  sample (``completion``: e.g. the template stripped the ``<think>`` block the model wrote, or the program edited
  the answer);
* ``shorter_prompt``: the prompt is a proper prefix of the previous row (the program dropped the end of it);
* ``sibling``: another sample of the same request (``n > 1``): the same prompt, an alternative, never a
  continuation.

A merged episode is one row (the ``trajectory`` layout); an episode with a fork becomes several rows, each a
maximal run of calls that merge (the ``turn`` layout's rows, a row may hold several calls). The trainer thus never
trains on a token the model did not sample, nor on a prompt the model did not see: every model token of a row is a
token some call sampled, with that call's log-prob, and every row's prompt part up to a call is that call's prompt.

**Positions** (the convention of ``RolloutBatch``, docs/design.md "The token layout"): ``ids[t]`` is a token;
``log_probs[t]`` is the engine's log-prob of ``ids[t]`` itself (sampled after ``ids[:t]``, after temperature) on
model tokens, 0.0 elsewhere: the value ``RolloutBatch.sample_log_probs`` holds at ``t`` (the trainer recomputes it
from the logits at ``t - 1``); ``turn_ids[t]`` is ``k`` on the model tokens of the episode's ``k``-th trained call,
-1 elsewhere, so ``model_mask[t] = turn_ids[t] >= 0`` is ``response_mask``. Trained calls (those with at least one
sampled token) are numbered 0, 1, ... in row order, then call order within a row, so an episode's model tokens
gathered row by row (as the turn layout does) come in turn order. These three lists are the ``ids``,
``log_probs`` and ``turn_ids`` of the agent proxy's rows (``ragen.agent.layout.Row``).

**Which tokens are sampled.** The sampled ids include the stop token the engine stopped at (e.g. ``<|im_end|>``,
kept as the sample's last token, ``ragen.rollout.base.Sample``); when a sample ends without it (token budget, a
stop string), the template's closing token in the next prompt is an env token.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ragen.gateway.toolcalls import ToolCallParse


@dataclass(frozen=True)
class CallRecord:
    """One sample of one call (module docstring). ``episode``: the episode key the program's base URL or header
    named; ``request_id``: the call's id (a retried call keeps it, and is answered from the first record);
    ``sample_index``: which of the call's ``n`` samples; ``prompt_ids``: the rendered prompt as the engine got it;
    ``sampled_ids`` / ``log_probs``: the sample (same length); ``finish_reason``: the engine's
    (``ragen.rollout.base.Sample``); ``tool_parse``: the tool-call parser's reading of the sample's text."""

    episode: str
    request_id: str
    sample_index: int
    prompt_ids: tuple[int, ...]
    sampled_ids: tuple[int, ...]
    log_probs: tuple[float, ...]
    finish_reason: str
    tool_parse: ToolCallParse = field(default_factory=lambda: ToolCallParse(content=""))

    def __post_init__(self) -> None:
        if len(self.sampled_ids) != len(self.log_probs):
            raise ValueError(f"{len(self.sampled_ids)} sampled ids but {len(self.log_probs)} log-probs")

    @property
    def group_id(self) -> str:
        """The samples of one request form a group."""
        return self.request_id


@dataclass(frozen=True)
class Fork:
    """Call ``call`` (its index in the episode) could not continue the previous call's row (module docstring):
    ``reason`` (``prefix_mismatch``, ``shorter_prompt``, ``sibling``), the first differing ``position`` in the
    prompt (-1 when none differs) and ``where`` it falls (``prompt`` or ``completion`` of the previous call;
    empty when none differs)."""

    call: int
    reason: str
    position: int = -1
    where: str = ""


@dataclass
class GatewayRow:
    """One training row: a maximal run of merging calls (positions: module docstring). ``calls``: the indices of
    its calls in the episode; ``index``: its place among the episode's rows (the ``turn`` layout's turn index)."""

    ids: list[int]
    log_probs: list[float]
    turn_ids: list[int]
    calls: list[int]
    index: int = 0

    @property
    def model_mask(self) -> list[int]:
        """1 on tokens some call sampled, 0 on prompt and env tokens (``response_mask``)."""
        return [int(k >= 0) for k in self.turn_ids]


@dataclass
class EpisodeRows:
    """An episode's rows (in order of their first call), its forks, and how many calls merged into a row."""

    rows: list[GatewayRow]
    forks: list[Fork]
    merged: int

    @property
    def layout(self) -> str:
        """``trajectory`` when the episode is one row, else ``turn`` (its rows are turn rows)."""
        return "trajectory" if len(self.rows) <= 1 else "turn"


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    """The first index where ``a`` and ``b`` differ within their common length, or -1."""
    return next((t for t, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), -1)


def fork_reason(call: int, prompt: Sequence[int], prev: CallRecord, prev_row: Sequence[int]) -> Fork:
    """Why ``prompt`` (of call ``call``) does not continue ``prev_row`` (a row ending with ``prev``'s sample)."""
    if prev.prompt_ids == tuple(prompt):
        return Fork(call, "sibling")
    pos = _first_difference(prompt, prev_row)
    if pos < 0:
        return Fork(call, "shorter_prompt")
    completion_start = len(prev_row) - len(prev.sampled_ids)
    return Fork(call, "prefix_mismatch", pos, "completion" if pos >= completion_start else "prompt")


def _extends(prompt: Sequence[int], row: Sequence[int]) -> bool:
    return len(prompt) >= len(row) and list(prompt[: len(row)]) == list(row)


def merge_calls(calls: Sequence[CallRecord]) -> EpisodeRows:
    """One episode's calls (in answer order) -> its rows and forks (module docstring)."""
    rows: list[GatewayRow] = []
    forks: list[Fork] = []
    row_of: dict[int, int] = {}  # call index -> its row
    merged = 0
    prev_request: list[int] = []  # indices of the previous request's samples
    for i, call in enumerate(calls):
        if prev_request and calls[prev_request[0]].request_id == call.request_id:
            candidates = []  # a sibling sample of the same request: never a continuation
            prev_request.append(i)
            last = prev_request[0]
        else:
            candidates, last = prev_request, (prev_request[-1] if prev_request else -1)
            prev_request = [i]
        target = next((row_of[j] for j in candidates if _extends(call.prompt_ids, rows[row_of[j]].ids)), None)
        if target is None:
            if last >= 0:
                forks.append(fork_reason(i, call.prompt_ids, calls[last], rows[row_of[last]].ids))
            rows.append(GatewayRow(list(call.prompt_ids), [0.0] * len(call.prompt_ids),
                                   [-1] * len(call.prompt_ids), [], len(rows)))
            target = len(rows) - 1
        else:
            merged += 1
            row = rows[target]
            extra = len(call.prompt_ids) - len(row.ids)
            row.ids += call.prompt_ids[len(row.ids):]
            row.log_probs += [0.0] * extra
            row.turn_ids += [-1] * extra
        row = rows[target]
        row.ids += call.sampled_ids
        row.log_probs += call.log_probs
        row.turn_ids += [i] * len(call.sampled_ids)  # renumbered below
        row.calls.append(i)
        row_of[i] = target
    _number_turns(rows)
    return EpisodeRows(rows, forks, merged)


def _number_turns(rows: list[GatewayRow]) -> None:
    """Replace the call index on model tokens by the trained-turn number (module docstring, positions)."""
    number: dict[int, int] = {}
    for row in rows:
        for c in row.calls:
            if c in row.turn_ids:
                number[c] = len(number)
        row.turn_ids = [number[k] if k >= 0 else -1 for k in row.turn_ids]


def merge_counters(episodes: Iterable[EpisodeRows]) -> dict[str, float]:
    """``gateway/merged_turns`` (calls merged into a previous call's row), ``gateway/forks`` (calls that started a
    new row after the first) and ``gateway/forks/<reason>`` for each reason seen, over ``episodes``."""
    merged, reasons = 0, Counter()
    for ep in episodes:
        merged += ep.merged
        reasons.update(f.reason for f in ep.forks)
    out = {"gateway/merged_turns": float(merged), "gateway/forks": float(sum(reasons.values()))}
    out.update({f"gateway/forks/{r}": float(n) for r, n in sorted(reasons.items())})
    return out
