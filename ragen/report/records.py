"""Token-level episode records for the run report: what the trainer saves so a page can colour every model token.

One record per episode (JSON-ready dict): the episode summary of ``ragen.agent.batch.episode_record`` (env,
seed, group, success, per-turn prompt / response / actions / reward) plus ``rows``, the episode's token sequences
(one in the ``trajectory`` layout, one per turn in the ``turn`` layout, in turn order). Each row holds, per real
token t (padding dropped):

* ``token_ids``, ``pieces`` (each id decoded on its own; a character split over several byte-level tokens shows
  as replacement characters), ``response_mask`` (1 on model tokens), ``turn_ids`` (k on the model tokens of turn k,
  -1 elsewhere);
* ``advantages``, ``returns``, ``values``, ``log_probs``: float lists or null when not computed.

Position convention (``ragen.algorithms.inputs.AdvantageInputs``): ``advantages[t]``, ``returns[t]`` and
``log_probs[t]`` belong to token t itself (the log-prob of sampling token t, the advantage its policy-gradient term
uses); ``values[t]`` is the critic's V of the context *before* token t. Only model tokens carry meaningful
numbers; the rest are stored as computed (0 for advantages, returns and log-probs).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ragen.agent.batch import RolloutBatch, episode_record

FLOAT_DIGITS = 6  # significant digits kept in the JSON (the report shows 3-4)


@dataclass
class Credit:
    """Per-token numbers of one batch, each (B, T) in the batch's layout, or None when not computed.

    advantages / returns: the estimator's output (``advantages[:, t]`` belongs to token t); values: the critic's
    values before the update (``values[:, t]`` = V of the context before token t); log_probs: log pi_old of token t
    (the actor's, or the engine's sampling log-probs when no actor ran).
    """

    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    values: torch.Tensor | None = None
    log_probs: torch.Tensor | None = None


def sample_indices(n: int, k: int) -> list[int]:
    """``min(k, n)`` indices spread evenly over ``range(n)`` (deterministic: no RNG, so sampling for the report
    never changes the training randomness)."""
    if k <= 0 or n <= 0:
        return []
    k = min(k, n)
    return sorted({(i * n) // k for i in range(k)})


def _floats(x: torch.Tensor | None, row: int, length: int) -> list[float] | None:
    if x is None:
        return None
    return [float(f"{v:.{FLOAT_DIGITS}g}") for v in x[row, :length].double().tolist()]


class PieceDecoder:
    """Decodes token ids one by one, caching pieces (prompt tokens repeat across rows)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.cache: dict[int, str] = {}

    def __call__(self, ids: list[int]) -> list[str]:
        for i in ids:
            if i not in self.cache:
                self.cache[i] = self.tokenizer.decode([i], skip_special_tokens=False)
        return [self.cache[i] for i in ids]


def token_row(batch: RolloutBatch, row: int, decode: PieceDecoder, credit: Credit) -> dict[str, Any]:
    """The real tokens of ``batch`` row ``row`` (right padding dropped) with their per-token numbers."""
    length = int(batch.attention_mask[row].sum())
    ids = batch.input_ids[row, :length].tolist()
    return {
        "token_ids": ids,
        "pieces": decode(ids),
        "response_mask": batch.response_mask[row, :length].tolist(),
        "turn_ids": batch.turn_ids[row, :length].tolist(),
        "advantages": _floats(credit.advantages, row, length),
        "returns": _floats(credit.returns, row, length),
        "values": _floats(credit.values, row, length),
        "log_probs": _floats(credit.log_probs, row, length),
    }


def episode_rows(batch: RolloutBatch) -> list[list[int]]:
    """Row indices of each episode, episodes in order of first appearance, rows in turn order.

    Trajectory layout: one row per episode. Turn layout: ``RolloutBatch.episode_index`` / ``turn_index``."""
    ep = batch.episode_index
    if ep is None:
        return [[r] for r in range(batch.batch_size)]
    turn = batch.turn_index
    eps = ep.tolist()
    tks = turn.tolist() if turn is not None else [0] * len(eps)
    order: dict[int, list[int]] = {}
    for r, e in enumerate(eps):
        order.setdefault(e, []).append(r)
    return [sorted(rows, key=lambda r: tks[r]) for rows in order.values()]


def episode_token_records(batch: RolloutBatch, tokenizer: Any, credit: Credit | None = None,
                          episodes: list[int] | None = None) -> list[dict[str, Any]]:
    """JSON-ready records of the episodes ``episodes`` (indices into :func:`episode_rows`; None = all), each the
    episode summary plus its token ``rows`` (module docstring)."""
    credit = credit or Credit()
    groups = episode_rows(batch)
    aligned = len(batch.episodes) == batch.batch_size
    decode = PieceDecoder(tokenizer)
    out = []
    for e in range(len(groups)) if episodes is None else episodes:
        rows = groups[e]
        first = rows[0]
        summary = episode_record(batch.episodes[first]) if aligned else {"env": "", "seed": -1, "success": False,
                                                                         "turns": []}
        summary["turn_rewards"] = [float(r) for r in batch.turn_rewards[first, : int(batch.num_turns[first])]]
        summary["rows"] = [token_row(batch, r, decode, credit) for r in rows]
        out.append(summary)
    return out


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Records of one JSONL file (empty list when it does not exist)."""
    import json

    path = Path(path)
    if not path.exists():
        return []
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]
