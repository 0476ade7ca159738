"""The lr schedule follows the run's fraction (``Trainable.update(progress=...)``): in the ``turn`` layout an update
has fewer mini-batches than the horizon's upper bound assumes, yet the schedule still ends at ``min_lr_ratio``; where
every update has the bound's mini-batches (the trajectory layout) it is the per-optimizer-step schedule exactly."""

from __future__ import annotations

import math

import pytest
import torch

from ragen.workers.config import ActorConfig
from ragen.workers.data import TrainBatch
from ragen.workers.trainable import MicroResult, Trainable

BASE, MIN = 1e-2, 0.1


def _run(rows: int, updates: int, horizon: int, progress: bool) -> tuple[list[float], float]:
    """``updates`` updates of a Linear model on ``rows`` rows (mini-batches of 2) under a cosine schedule of
    ``horizon`` optimizer steps; returns the lr of every optimizer step and the rate left after the last update."""
    cfg = ActorConfig(lr=BASE, mini_batch_size=2, micro_batch_size=2, lr_schedule="cosine", total_steps=horizon,
                      min_lr_ratio=MIN, mixed_precision="fp32")
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    ids = torch.arange(rows)[:, None].repeat(1, 2)
    tb = TrainBatch(input_ids=ids, attention_mask=torch.ones_like(ids), response_mask=torch.ones_like(ids))
    x = torch.randn(rows, 3)
    trainable = Trainable(model, cfg, torch.device("cpu"), 1, prefix="actor")
    seen: list[float] = []

    def micro(b: TrainBatch, num_tokens: float, num_seqs: float) -> MicroResult:
        seen.append(float(trainable.optimizer.param_groups[0]["lr"]))
        return MicroResult(loss=model(x[b.input_ids[:, 0]]).square().sum() / num_tokens, token_sums={}, sums={})

    for u in range(updates):
        trainable.update(tb, lambda b: b.response_mask, micro, progress=(u, updates) if progress else None)
    return seen, float(trainable.optimizer.param_groups[0]["lr"])


def _cosine(position: float, horizon: int) -> float:
    return BASE * (MIN + (1 - MIN) * 0.5 * (1 + math.cos(math.pi * min(1.0, position / horizon))))


def test_fewer_mini_batches_than_the_bound_still_end_the_schedule_at_min_lr_ratio():
    # a horizon of 3 updates x 4 mini-batches (the turn layout's bound), but each update has 2 mini-batches
    lrs, after = _run(rows=4, updates=3, horizon=12, progress=True)
    assert lrs == pytest.approx([_cosine(4 * u + 2 * i, 12) for u in range(3) for i in range(2)], rel=1e-9)
    assert after == pytest.approx(BASE * MIN, rel=1e-9)
    # counting optimizer steps instead stops at step 6 of 12: half-way, far above the minimum
    _, counted = _run(rows=4, updates=3, horizon=12, progress=False)
    assert counted == pytest.approx(_cosine(6, 12), rel=1e-9) and counted > 4 * BASE * MIN


def test_with_the_bounds_mini_batches_the_schedule_is_the_per_step_one():
    with_progress, after = _run(rows=8, updates=3, horizon=12, progress=True)
    counted, after_counted = _run(rows=8, updates=3, horizon=12, progress=False)
    assert with_progress == pytest.approx(counted, rel=1e-12) and after == pytest.approx(after_counted, rel=1e-12)
    assert after == pytest.approx(BASE * MIN, rel=1e-9)


def test_every_update_starts_at_the_scheduled_rate():
    # the first optimizer step of each update runs at the schedule's rate, not the rate the first update began with
    lrs, after = _run(rows=4, updates=3, horizon=6, progress=False)
    assert lrs == pytest.approx([_cosine(k, 6) for k in range(6)], rel=1e-9)
    assert after == pytest.approx(BASE * MIN, rel=1e-9)
