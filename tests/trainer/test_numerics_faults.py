"""NaN / inf never reaches the weights: the checks, the guard, and tiny in-process runs with poisoned
log-probs."""

import math

import pytest
import torch
from trainer_helpers import read_metrics, tiny_init_weights, tiny_overrides

from ragen.trainer import numerics as N
from ragen.trainer.config.compose import load_train_config
from ragen.trainer.config.schema import ConfigError
from ragen.workers.actor import PolicyWorker

FAST = ["trainer.use_ray=false", "trainer.val_before_train=false", "trainer.val_freq=0", "trainer.save_freq=1",
        "trainer.keep_last_ckpt=null",
        "trainer.loggers=[jsonl]"]


def test_nonfinite_counts_and_metrics():
    t = torch.tensor([[0.0, float("nan"), 1.0], [float("inf"), -float("inf"), 2.0]])
    counts = N.nonfinite_counts({"a": torch.zeros(2, 3), "b": t, "c": None, "ids": torch.ones(2, 3, dtype=torch.long),
                                 "d": torch.tensor([float("nan")])})
    assert counts == {"b": 3, "d": 1}
    assert N.skip_metrics(counts) == {"train/skipped_update": 1.0, "nonfinite/b": 3.0, "nonfinite/d": 1.0}
    assert N.gradient_skips({"actor/skipped_steps": 2.0, "critic/skipped_steps": 0.0, "actor/lr": 1.0}) == {
        "actor gradients": 2}


def test_guard_counts_consecutive_skips_and_names_the_tensor():
    g = N.SkipGuard(limit=3)
    g.record(1, {"advantages": 2})
    g.record(2, {"advantages": 1})
    g.record(3, {})  # a clean step resets the run of skips
    assert (g.consecutive, g.total) == (0, 2)
    g.record(4, {"values": 5})
    g.record(5, {"actor gradients": 1})
    with pytest.raises(N.NonFiniteError) as err:
        g.record(6, {"old_log_probs": 4, "advantages": 4})
    msg = str(err.value)
    assert "3 consecutive" in msg and "old_log_probs, advantages" in msg
    assert "step 4: values (5 non-finite)" in msg and "step 5: actor gradients (1 non-finite)" in msg
    assert "trainer.max_consecutive_skips" in msg
    never = N.SkipGuard(limit=0)
    for s in range(10):
        never.record(s, {"returns": 1})
    assert never.total == 10


def test_negative_limit_is_a_config_error():
    with pytest.raises(ConfigError, match="trainer.max_consecutive_skips must be >= 0"):
        load_train_config("base", ["trainer.max_consecutive_skips=-1"])


def _poison(monkeypatch, calls_to_poison):
    """compute_log_probs returns NaN at one position on its calls number ``calls_to_poison`` (1-based)."""
    real = PolicyWorker.compute_log_probs
    seen = {"n": 0}

    def poisoned(self, batch):
        lp = real(self, batch)
        seen["n"] += 1
        if seen["n"] in calls_to_poison:
            lp = lp.clone()
            lp[0, -1] = float("nan")
        return lp

    monkeypatch.setattr(PolicyWorker, "compute_log_probs", poisoned)
    return seen


def test_nan_steps_are_skipped_and_consecutive_ones_stop_the_run(tmp_path, monkeypatch):
    """Old log-probs hold a NaN at steps 1, 3 and 4 (limit 2): step 1 skips its update (checkpoint 1 = initial
    weights), step 2 trains, step 3 skips (checkpoint 3 = checkpoint 2), step 4 stops the run naming the tensor;
    resume=auto then picks checkpoint 3."""
    from trainer_helpers import load_actor_weights

    from ragen.launch import run
    from ragen.utils.checkpoint import resolve_resume

    _poison(monkeypatch, {1, 3, 4})
    cfg = load_train_config("ppo_bandit", [*tiny_overrides(tmp_path, 5), *FAST, "trainer.max_consecutive_skips=2",
                                           "algorithm.estimator=grpo", "critic.enable=false",
                                           "actor.ppo_epochs=2"])  # exactly on-policy would skip old_log_probs
    with pytest.raises(N.NonFiniteError, match=r"2 consecutive .*old_log_probs.*step 3: old_log_probs \(1 non"):
        run(cfg)
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert [r.get("train/skipped_update", 0.0) for r in records] == [1.0, 0.0, 1.0]
    assert records[0]["nonfinite/old_log_probs"] == 1.0 and "actor/pg_loss" in records[1]
    assert all(math.isfinite(v) for r in records for v in r.values())
    init = tiny_init_weights()
    w = {s: load_actor_weights(tmp_path / "checkpoints" / f"global_step_{s}") for s in (1, 2, 3)}
    assert all(torch.equal(init[k], w[1][k]) for k in init)
    assert any(not torch.equal(w[1][k], w[2][k]) for k in init)
    assert all(torch.equal(w[2][k], w[3][k]) for k in init)
    assert resolve_resume("auto", tmp_path / "checkpoints").name == "global_step_3"


def _poison_rewards(monkeypatch, calls):
    """The train rollouts number ``calls`` (1-based) carry a NaN token reward (as a broken reward function would)."""
    from ragen.agent.rollout import AgentProxy

    real, seen = AgentProxy.rollout, {"n": 0}

    def rollout(self, mode="train", responder=None):
        batch = real(self, mode, responder)
        if mode == "train":
            seen["n"] += 1
            if seen["n"] in calls:
                batch.token_rewards[0, -1] = float("nan")
        return batch

    monkeypatch.setattr(AgentProxy, "rollout", rollout)


def _poison_values(monkeypatch, calls):
    """The critic's values hold an inf on its compute_values calls number ``calls``."""
    from ragen.workers.critic import CriticWorker

    real, seen = CriticWorker.compute_values, {"n": 0}

    def compute_values(self, batch):
        values, last = real(self, batch)
        seen["n"] += 1
        if seen["n"] in calls:
            values = values.clone()
            values[0, 0] = float("inf")
        return values, last

    monkeypatch.setattr(CriticWorker, "compute_values", compute_values)


def _inf_actor_loss(monkeypatch, calls):
    """The actor's loss is inf on its update calls number ``calls``: a real non-finite gradient in the worker."""
    import dataclasses

    real, seen = PolicyWorker.update, {"n": 0}

    def update(self, batch, **kw):
        seen["n"] += 1
        if seen["n"] not in calls:
            return real(self, batch, **kw)
        micro = self._micro_loss

        def inf_loss(b, num_tokens, num_seqs):
            res = micro(b, num_tokens, num_seqs)
            return dataclasses.replace(res, loss=res.loss * float("inf"))

        self._micro_loss = inf_loss
        try:
            return real(self, batch, **kw)
        finally:
            del self._micro_loss

    monkeypatch.setattr(PolicyWorker, "update", update)


@pytest.mark.parametrize("poison, tensor, extra", [
    (_poison_rewards, "token_rewards", ["algorithm.estimator=grpo", "critic.enable=false"]),
    (_poison_values, "values", []),
    (_inf_actor_loss, "actor gradients", ["algorithm.estimator=grpo", "critic.enable=false"]),
])
def test_poisoned_rewards_values_and_gradients_never_reach_the_weights(tmp_path, monkeypatch, poison, tensor, extra):
    """Rewards (NaN), the critic's values (inf) or the actor's loss (inf: non-finite gradients) are poisoned in
    steps 1 and 2 with ``trainer.max_consecutive_skips=2``: step 1's checkpoint holds the initial weights (the
    update was skipped, counted in the metrics), and step 2 stops the run naming the tensor."""
    from trainer_helpers import load_actor_weights

    from ragen.launch import run

    poison(monkeypatch, {1, 2})
    cfg = load_train_config("ppo_bandit", [*tiny_overrides(tmp_path, 3), *FAST, "trainer.max_consecutive_skips=2",
                                           *extra])
    with pytest.raises(N.NonFiniteError, match=rf"2 consecutive training steps skipped because of NaN/inf in "
                                               rf"{tensor}.*step 1: {tensor} \(\d+ non-finite\)"):
        run(cfg)
    (record,) = read_metrics(tmp_path)
    if tensor == "actor gradients":  # the inputs were finite: the worker skipped its optimizer steps
        assert record["actor/skipped_steps"] > 0 and "train/skipped_update" not in record
    else:  # the driver skipped both updates
        assert record["train/skipped_update"] == 1.0 and record[f"nonfinite/{tensor}"] >= 1
        assert "actor/skipped_steps" not in record and "critic/value_loss" not in record
    init, w1 = tiny_init_weights(), load_actor_weights(tmp_path / "checkpoints" / "global_step_1")
    assert all(torch.equal(init[k], w1[k]) for k in init)
