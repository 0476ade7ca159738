"""NaN / inf never reaches the ArCHer trainer's weights (the PPO trainer's guard in ``ragen.archer.trainer``):
tiny in-process ArCHer runs with poisoned rewards, advantages and gradients."""

import dataclasses
import json
import math

import pytest
import torch
from test_archer_runs import _overrides
from trainer_helpers import load_actor_weights, read_metrics, tiny_init_weights

import ragen.archer.trainer as T
from ragen.archer.critic import ArcherCriticWorker
from ragen.archer.main import run
from ragen.archer.workers import ArcherPolicyWorker
from ragen.trainer.config.compose import load_train_config
from ragen.trainer.numerics import NonFiniteError


def _count_calls(monkeypatch, owner, name, calls, poison):
    """Wrap ``owner.name`` so its results on the calls numbered ``calls`` (1-based) go through ``poison``."""
    real, seen = getattr(owner, name), {"n": 0}

    def wrapped(*args, **kw):
        out = real(*args, **kw)
        seen["n"] += 1
        return poison(out) if seen["n"] in calls else out

    monkeypatch.setattr(owner, name, wrapped)
    return seen


def test_nan_rewards_and_advantages_are_kept_out_then_stop_the_run(tmp_path, monkeypatch):
    """Iteration 1 rolls out a NaN reward: that turn never enters the replay buffer (the buffer saved at
    checkpoint 1 is finite). Iterations 2 and 3 get NaN advantages from the critic: their actor updates and weight
    syncs are skipped (checkpoint 2's actor = the initial weights), and with trainer.max_consecutive_skips=3 the
    run stops at iteration 3 naming the tensors."""

    def nan_reward(out):
        records, rewards = out
        return [dataclasses.replace(records[0], reward=float("nan")), *records[1:]], rewards

    def nan_adv(adv):
        adv = adv.clone()
        adv[0] = float("nan")
        return adv

    _count_calls(monkeypatch, T, "transitions_from_batch", {1}, nan_reward)
    _count_calls(monkeypatch, ArcherCriticWorker, "advantages", {1, 2}, nan_adv)
    cfg = load_train_config("archer_twenty_questions", [*_overrides(tmp_path, 4), "trainer.max_consecutive_skips=3",
                                                        "trainer.val_freq=0"])
    with pytest.raises(NonFiniteError, match=r"3 consecutive training steps skipped because of NaN/inf in "
                                             r"advantages \(.*step 1: rewards \(1 non-finite\); step 2: advantages"):
        run(cfg)
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [1, 2]
    assert records[0]["nonfinite/rewards"] == 1.0 and records[1]["nonfinite/advantages"] >= 1.0
    assert "actor/pg_loss" not in records[1]  # the actor update was skipped
    assert all(math.isfinite(v) for r in records for v in r.values())
    buffer = json.loads((tmp_path / "checkpoints" / "global_step_1" / "buffer.json").read_text())
    rewards = [r["reward"] for r in buffer["items"]]
    assert len(rewards) == buffer["total_added"] and rewards and all(math.isfinite(x) for x in rewards)
    init, w2 = tiny_init_weights(), load_actor_weights(tmp_path / "checkpoints" / "global_step_2")
    assert all(torch.equal(init[k], w2[k]) for k in init)


def test_non_finite_actor_gradients_skip_the_step_and_stop_the_run(tmp_path, monkeypatch):
    """The actor's REINFORCE loss is inf (a real non-finite gradient in the worker): the worker skips its
    optimizer steps (``actor/skipped_steps``), the weights stay the initial ones, and two such iterations in a row
    stop the run naming ``actor gradients``."""
    real = ArcherPolicyWorker.reinforce_update

    def reinforce_update(self, batch, clip=None, epochs=1, loss_scale=1.0):
        update = self.trainable.update

        def inf_update(b, mask_fn, micro, **kw):
            def inf_micro(mb, num_tokens, num_seqs):
                res = micro(mb, num_tokens, num_seqs)
                return dataclasses.replace(res, loss=res.loss * float("inf"))

            return update(b, mask_fn, inf_micro, **kw)

        self.trainable.update = inf_update
        try:
            return real(self, batch, clip, epochs, loss_scale)
        finally:
            del self.trainable.update

    monkeypatch.setattr(ArcherPolicyWorker, "reinforce_update", reinforce_update)
    cfg = load_train_config("archer_twenty_questions", [*_overrides(tmp_path, 3), "trainer.max_consecutive_skips=2",
                                                        "archer.warmup_iter=0", "trainer.val_freq=0"])
    with pytest.raises(NonFiniteError, match=r"2 consecutive training steps skipped because of NaN/inf in actor "
                                             r"gradients .*step 1: actor gradients \(1 non-finite\)"):
        run(cfg)
    (record,) = read_metrics(tmp_path)
    assert record["actor/skipped_steps"] == 1.0 and math.isfinite(record["critic/grad_norm"])
    init, w1 = tiny_init_weights(), load_actor_weights(tmp_path / "checkpoints" / "global_step_1")
    assert all(torch.equal(init[k], w1[k]) for k in init)
