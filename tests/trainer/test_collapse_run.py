"""The collapse metrics and the reward-variance filter in real training steps (in-process, tiny model):
``collapse/*`` appear at steps 1, 1 + N, ... with finite values and their time, and change no training number; the
variance-share filter hands the update exactly the rows of the groups it keeps, and a batch without reward variance
skips the update (weights unchanged, logged)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from trainer_helpers import load_actor_weights, read_metrics, tiny_overrides

from ragen.agent.rollout import AgentProxy
from ragen.launch import run
from ragen.trainer.config.compose import load_train_config
from ragen.workers import PolicyWorker

FAST = ["trainer.use_ray=false", "trainer.val_before_train=false", "trainer.report=false"]
# metrics that may differ between two identical runs (wall time, memory) or that only the collapse phase adds
NOT_TRAINING = ("timing/", "perf/", "memory/", "collapse/")


def _training(record: dict) -> dict:
    """The record without wall times (``timing/``, ``*/time/*``), throughput, memory and collapse metrics."""
    return {k: v for k, v in record.items() if not k.startswith(NOT_TRAINING) and "/time/" not in k}


def _multi_turn(tmp_path, every: int) -> list[dict]:
    run(load_train_config("ppo_multi_turn", [*tiny_overrides(tmp_path, 3), *FAST,
                                             f"trainer.collapse_every={every}"]))
    return read_metrics(tmp_path)


def test_collapse_metrics_at_their_steps_change_no_training(tmp_path):
    on, off = _multi_turn(tmp_path / "on", 2), _multi_turn(tmp_path / "off", 0)
    steps = {r["step"]: r for r in on if "timing/step" in r}
    assert sorted(steps) == [1, 2, 3]
    for s in (1, 3):
        r = steps[s]
        assert r["collapse/n_responses"] >= 4 and r["timing/collapse"] > 0
        for key in ("mi", "retrieval_acc", "chance_acc", "mi_bound", "turn_0/mi", "turn_0/retrieval_acc"):
            assert math.isfinite(r[f"collapse/{key}"]), key
        assert 0 < r["collapse/chance_acc"] < 1 and abs(r["collapse/mi"]) <= r["collapse/mi_bound"]
    assert not any(k.startswith("collapse/") or k == "timing/collapse" for k in steps[2])
    assert not any(k.startswith("collapse/") for r in off for k in r)
    for a, b in zip(on, off, strict=True):  # every training number identical, only metrics added
        assert _training(a) == _training(b)
    final_on = load_actor_weights(tmp_path / "on" / "checkpoints" / "global_step_3")
    final_off = load_actor_weights(tmp_path / "off" / "checkpoints" / "global_step_3")
    assert all(torch.equal(final_on[k], final_off[k]) for k in final_off)


def _rewarded(batch, per_group: list[list[float]]):
    """``batch`` with episode rewards set by group: the g-th group (sorted ids) gets ``per_group[g]`` in row order
    (one-turn rows: the reward on the turn and on its last model token)."""
    ids = torch.unique(batch.group_ids, sorted=True).tolist()
    reward = torch.zeros(batch.batch_size)
    for g, gid in enumerate(ids):
        rows = torch.nonzero(batch.group_ids == gid).flatten()
        reward[rows] = torch.tensor(per_group[g], dtype=torch.float32)
    turn = torch.zeros_like(batch.turn_rewards)
    turn[:, 0] = reward
    tokens = torch.zeros_like(batch.token_rewards)
    last = (batch.response_mask * torch.arange(batch.response_mask.shape[1])).argmax(dim=1)
    tokens[torch.arange(batch.batch_size), last] = reward
    return dataclasses.replace(batch, turn_rewards=turn, token_rewards=tokens)


def test_variance_share_filter_in_real_steps(tmp_path, monkeypatch):
    """Step 1: group rewards [0, 0], [0, 2], [0, 1], [1, 1] have variances 0, 1, 0.25, 0 (total 1.25); share 0.8
    keeps the second group alone (1 / 1.25 = 0.8): its two rows reach the actor's update, padded by two empty rows to
    the mini-batch of 4. Step 2: every reward equal: no group has signal, the update is skipped."""
    rollouts, updates = [], []
    real_rollout, real_update = AgentProxy.rollout, PolicyWorker.update

    def rollout(self, mode="train", responder=None):
        batch = real_rollout(self, mode, responder)
        if mode == "train":
            step = len(rollouts)
            batch = _rewarded(batch, [[0, 0], [0, 2], [0, 1], [1, 1]] if step == 0 else [[1, 1]] * 4)
            rollouts.append(batch)
        return batch

    def update(self, batch, progress=None):
        updates.append(batch)
        return real_update(self, batch, progress)

    monkeypatch.setattr(AgentProxy, "rollout", rollout)
    monkeypatch.setattr(PolicyWorker, "update", update)
    run(load_train_config("ppo_bandit", [
        *tiny_overrides(tmp_path, 2), *FAST, "algorithm=grpo", "rollout.n_groups=4", "rollout.group_size=2",
        "algorithm.rollout_filter=variance_share", "algorithm.rollout_filter_variance_share=0.8",
        "trainer.save_freq=1", "trainer.collapse_every=0"]))
    assert len(rollouts) == 2 and len(updates) == 1  # step 2 trains nothing
    first = rollouts[0]
    kept_gid = torch.unique(first.group_ids, sorted=True)[1]
    kept = torch.nonzero(first.group_ids == kept_gid).flatten()
    tb = updates[0]
    assert tb.batch_size == 4 and int(tb.response_mask[2:].sum()) == 0  # two padding rows
    assert torch.equal(tb.input_ids[:2], first.input_ids[kept])
    records = {r["step"]: r for r in read_metrics(tmp_path) if "timing/step" in r}
    one, two = records[1], records[2]
    assert one["rollout/snr_filter/kept_groups"] == 1 and one["rollout/total_groups"] == 4
    assert one["rollout/snr_filter/total_variance"] == pytest.approx(1.25)
    assert one["rollout/snr_filter/kept_variance_share"] == pytest.approx(0.8)
    assert one["rollout/snr_filter/threshold"] == pytest.approx(1.0) and one["rollout/snr_filter/no_signal"] == 0
    assert "train/skipped_update" not in one and "actor/pg_loss" in one
    assert two["rollout/snr_filter/no_signal"] == 1 and two["train/skipped_update"] == 1
    assert two["rollout/kept_groups"] == 0 and not any(k.startswith("actor/") for k in two)
    w1 = load_actor_weights(tmp_path / "checkpoints" / "global_step_1")
    w2 = load_actor_weights(tmp_path / "checkpoints" / "global_step_2")
    assert all(torch.equal(w1[k], w2[k]) for k in w1)
