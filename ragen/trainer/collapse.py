"""The template-collapse metrics of a training step (docs/collapse.md): does the policy still read its prompt?

Every ``trainer.collapse_every`` steps (steps 1, 1 + N, 1 + 2N, ...; 0 = never) the trainer takes a deterministic
sample of the step's rollout, at most ``trainer.collapse_prompts`` distinct prompts per turn (the prompt of turn k is
everything the policy saw before answering at turn k), and the actor scores every sampled response under every
sampled prompt of the same turn with its own forward, under the weights that sampled them (before the update) and
the sampling temperature (``PolicyWorker.collapse_cross``). ``ragen.algorithms.collapse`` turns that cross matrix
into ``collapse/mi``, ``collapse/retrieval_acc``, ``collapse/chance_acc`` ... pooled over turns and per turn
(``collapse/turn_k/...``).

Rows of failed episodes (the env raised; their tokens are not the policy's play) and trajectory rows whose history
was cut for the context window (the row is not what the policy saw; a turn-layout row always is) are left out. The
sample is chosen without randomness and the forward neither trains nor draws random numbers, so the metrics change
no training number.
"""

from __future__ import annotations

from typing import Any

import torch

from ragen.agent.batch import RolloutBatch
from ragen.algorithms.collapse import TurnPair, collapse_metrics_by_turn, pick_pairs, turn_pairs


def collapse_due(step: int, every: int) -> bool:
    """Whether step ``step`` (1-based) measures collapse: steps 1, 1 + every, 1 + 2 * every, ...; ``every`` <= 0:
    never."""
    return every > 0 and (step - 1) % every == 0


def collapse_sample(batch: RolloutBatch, prompts_per_turn: int) -> list[TurnPair]:
    """The (prompt, response) pairs scored: per turn, at most ``prompts_per_turn`` distinct prompts with a non-empty
    response, spread evenly over the batch's rows in order (``pick_pairs`` without a generator), ordered by (turn,
    row). Rows of failed episodes are left out, and trajectory rows of episodes whose history was cut (a turn row,
    ``batch.turn_index`` set, is the exact prompt the policy saw, cut or not)."""
    skip = torch.zeros(batch.batch_size, dtype=torch.bool)
    cut = batch.context_cut if batch.turn_index is None else None
    for flags in (batch.failed, cut):
        if flags is not None and flags.shape == skip.shape:
            skip |= flags.bool().cpu()
    rows = [r for r in range(batch.batch_size) if not bool(skip[r])]
    pairs = turn_pairs(batch.input_ids, batch.attention_mask, batch.turn_ids, rows)
    return pick_pairs(pairs, prompts_per_turn)


def comparable(pairs: list[TurnPair]) -> list[TurnPair]:
    """``pairs`` of the turns that hold at least two of them (a turn with one prompt compares nothing)."""
    counts: dict[int, int] = {}
    for p in pairs:
        counts[p.turn] = counts.get(p.turn, 0) + 1
    return [p for p in pairs if counts[p.turn] >= 2]


def collapse_step_metrics(actor: Any, batch: RolloutBatch, prompts_per_turn: int, pad_id: int) -> dict[str, float]:
    """``collapse/*`` metrics of ``batch`` (the step's rollout, before filtering) scored by ``actor`` (a worker group
    of ``PolicyWorker``: every rank gets the same pairs, rank 0's matrix is used). ``collapse/n_responses`` is 0 and
    nothing else is logged when no turn holds two distinct prompts (e.g. every group replays one seed and the batch
    has one group)."""
    pairs = comparable(collapse_sample(batch, prompts_per_turn))
    if not pairs:
        return {"collapse/n_responses": 0.0}
    turns = [p.turn for p in pairs]
    cross = actor.call_rank0("collapse_cross", [p.prompt for p in pairs], [p.response for p in pairs], turns,
                             pad_id)
    lengths = torch.tensor([len(p.response) for p in pairs], dtype=torch.long)
    result = collapse_metrics_by_turn(cross, torch.tensor(turns, dtype=torch.long), response_lengths=lengths)
    return result.as_metrics("collapse")
