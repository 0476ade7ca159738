"""The bootstrap values of episodes cut by the length budget (docs/design.md, position conventions).

A ``truncated`` episode did not end: its return continues past the last response, so the GAE family bootstraps
from V of the state that followed it. That state is the episode's next generation prompt, cut to the length budget
by the prompt builder's own rule (``EpisodeContext.bootstrap_prompt``; ``RolloutBatch.bootstrap_prompts``), which is
the kind of state every V(s_k) is trained on. Both layouts read the same prompt through the same value pass, so
their advantages agree on truncated episodes too; the value after a turn row's closing token (a position no critic
loss trains) is never used.
"""

from __future__ import annotations

from typing import Any

import torch

from ragen.agent.batch import RolloutBatch
from ragen.trainer.layout import pad_rows
from ragen.workers.data import TrainBatch


def bootstrap_batch(prompts: list[list[int]], pad_id: int) -> TrainBatch:
    """One right-padded row per prompt (no response tokens): the value pass reads V after each row's last token."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    att = torch.zeros(len(prompts), width, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, : len(p)] = torch.tensor(p, dtype=torch.long)
        att[i, : len(p)] = 1
    return TrainBatch(ids, att, torch.zeros_like(att))


def bootstrap_values(value_group: Any, batch: RolloutBatch, pad_id: int, row_multiple: int) -> torch.Tensor | None:
    """(B,) float: V of each truncated row's bootstrap prompt (the critic's ``last_values``), 0 on other rows; None
    when no row is truncated. Each distinct prompt is evaluated once (the ``turn`` layout repeats an episode's on
    every row); the value batch is padded with empty rows to ``row_multiple`` (the worker groups' world sizes)."""
    prompts = batch.bootstrap_prompts
    if prompts is None or not bool(batch.truncated.any()):
        return None
    rows = [r for r in range(batch.batch_size) if bool(batch.truncated[r]) and prompts[r]]
    if not rows:
        raise ValueError("truncated rows without a bootstrap prompt: the rollout must set "
                         "RolloutBatch.bootstrap_prompts for every truncated episode")
    unique: dict[tuple[int, ...], int] = {}
    for r in rows:
        unique.setdefault(tuple(prompts[r]), len(unique))
    tb = pad_rows(bootstrap_batch([list(p) for p in unique], pad_id), row_multiple, pad_id)
    _, last = value_group.call("compute_values", tb)
    out = torch.zeros(batch.batch_size, dtype=torch.float32)
    for r in rows:
        out[r] = float(last[unique[tuple(prompts[r])]])
    return out
