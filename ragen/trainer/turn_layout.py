"""Training on the ``turn`` layout (docs/design.md, the two layouts): one row per turn, each with the exact prompt the
model saw. Estimators need each episode's model tokens in order, so advantages are computed on a per-episode
compact view and scattered back to the turn rows; the row count varies per step, so the worker batch is padded
with empty rows to a size the mini-batches and ranks divide (``TurnLayout`` of ``ragen.trainer.layout``).
"""

from __future__ import annotations

import math

import torch

from ragen.agent.batch import RolloutBatch
from ragen.algorithms import AdvantageInputs, compute_advantage
from ragen.workers.data import TrainBatch


def _positions(batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """Flat index of every model token: (row, col) in the batch and (episode slot, position) in the compact view,
    plus the first row of each episode."""
    ep, tk = batch.episode_index.tolist(), batch.turn_index.tolist()
    episodes = sorted(set(ep))
    slot = {e: i for i, e in enumerate(episodes)}
    rows, cols, eps, pos = [], [], [], []
    filled = [0] * len(episodes)
    first = [-1] * len(episodes)
    for r in sorted(range(batch.batch_size), key=lambda r: (ep[r], tk[r])):
        s = slot[ep[r]]
        if first[s] < 0:
            first[s] = r
        c = torch.nonzero(batch.response_mask[r]).flatten()
        rows.append(torch.full_like(c, r))
        cols.append(c)
        eps.append(torch.full_like(c, s))
        pos.append(torch.arange(filled[s], filled[s] + len(c)))
        filled[s] += len(c)
    cat = [torch.cat(x) if x else torch.zeros(0, dtype=torch.long) for x in (rows, cols, eps, pos)]
    return cat[0], cat[1], cat[2], cat[3], first


def turn_layout_advantages(
    estimator: str, batch: RolloutBatch, values: torch.Tensor | None, bootstrap_values: torch.Tensor | None = None,
    token_penalties: torch.Tensor | None = None, **scalars,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``compute_advantage`` for a turn-layout batch: (advantages, returns), (B, T), 0 off the response.

    ``values`` / ``token_penalties``: (B, T) over the turn rows, ``values`` in ``ValueModel``'s convention
    (V of the context before token t) computed inside each turn sample, so the gather below never mixes turns.
    Each episode's model tokens, in turn order, form one row of the compact view (no env tokens in it);
    per-episode fields come from the episode's first row. ``bootstrap_values`` (B,): per row, V of its episode's
    bootstrap prompt (``ragen.trainer.bootstrap``; read for truncated episodes only), the same state and value the
    trajectory layout bootstraps from.
    """
    rows, cols, eps, pos, first = _positions(batch)
    n_ep, width = len(first), max(1, int(pos.max()) + 1 if len(pos) else 1)

    def gather(x: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        out = torch.full((n_ep, width), fill, dtype=x.dtype)
        out[eps, pos] = x[rows, cols]
        return out

    mask = torch.zeros(n_ep, width, dtype=torch.long)
    mask[eps, pos] = 1
    idx = torch.tensor(first)
    pick = (lambda t: None if t is None else t[idx])  # noqa: E731
    inputs = AdvantageInputs(
        token_rewards=gather(batch.token_rewards.float()), response_mask=mask, turn_ids=gather(batch.turn_ids, -1),
        values=None if values is None else gather(values.float()), group_ids=pick(batch.group_ids),
        truncated=pick(batch.truncated), step_rewards=pick(batch.step_rewards),
        outcome_rewards=pick(batch.outcome_rewards), tool_results=pick(batch.tool_results), attention_mask=mask,
        turn_obs_keys=None if batch.turn_obs_keys is None else [batch.turn_obs_keys[i] for i in first],
        bootstrap_values=None if bootstrap_values is None else bootstrap_values.float()[idx],
        token_penalties=None if token_penalties is None else gather(token_penalties.float()),
        failed=pick(batch.failed),
    )
    adv_c, ret_c = compute_advantage(estimator, inputs, **scalars)
    adv = torch.zeros(batch.input_ids.shape, dtype=adv_c.dtype)
    ret = torch.zeros(batch.input_ids.shape, dtype=ret_c.dtype)
    adv[rows, cols] = adv_c[eps, pos]
    ret[rows, cols] = ret_c[eps, pos]
    return adv, ret


def pad_rows(tb: TrainBatch, multiple: int, pad_id: int) -> TrainBatch:
    """Append empty rows (one attended pad token, no response) so B is a multiple of ``multiple``."""
    b = tb.batch_size
    extra = (-b) % multiple
    if extra == 0:
        return tb
    t = tb.seq_len
    ids = torch.full((extra, t), pad_id, dtype=tb.input_ids.dtype)
    attn = torch.zeros(extra, t, dtype=tb.attention_mask.dtype)
    attn[:, 0] = 1
    fields = {}
    for name, x in tb.tensors().items():
        fill = {"input_ids": ids, "attention_mask": attn}.get(name, torch.zeros((extra, *x.shape[1:]), dtype=x.dtype))
        if name == "seq_ids":  # a sequence of its own for every padding row
            fill = torch.arange(extra, dtype=x.dtype) + (int(x.max()) + 1 if x.numel() else 0)
        fields[name] = torch.cat([x, fill])
    return TrainBatch(**fields)


def row_multiple(*sizes: int) -> int:
    """The least common multiple of the mini-batch sizes and world sizes the padded batch must divide."""
    out = 1
    for s in sizes:
        out = out * s // math.gcd(out, s)
    return out
