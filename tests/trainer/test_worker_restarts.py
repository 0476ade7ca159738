"""``trainer.max_restarts`` without Ray (in-process groups, the failure simulated): failures beyond the budget stop
the run with the named ``WorkerFailure``. (A real SIGKILL, the restart from a checkpoint and its equality with an
uninterrupted run, on a Ray cluster: ``test_ray_cluster.py``.)"""

from __future__ import annotations

import pytest
from trainer_helpers import tiny_overrides

from ragen.launch import run
from ragen.trainer.config.compose import load_train_config
from ragen.workers.group import LocalWorkerGroup, WorkerFailure

FAST = ["trainer.use_ray=false", "trainer.val_before_train=false", "trainer.val_freq=0", "trainer.report=false",
        "trainer.save_freq=1", "algorithm.estimator=grpo", "critic.enable=false"]


def _failing_updates(monkeypatch, fail_at: set[int]) -> dict:
    """Make the actor group's ``update`` calls numbered in ``fail_at`` (1-based) raise ``WorkerFailure``."""
    real, seen = LocalWorkerGroup.call, {"n": 0}

    def call(self, method, batch=None, **kw):
        if method == "update" and getattr(self.worker, "role", None) == "actor":
            seen["n"] += 1
            if seen["n"] in fail_at:
                raise WorkerFailure("actor worker rank 0 died during update() (simulated)")
        return real(self, method, batch, **kw)

    monkeypatch.setattr(LocalWorkerGroup, "call", call)
    return seen


def test_failures_beyond_max_restarts_stop_the_run(tmp_path, monkeypatch):
    """Before any checkpoint: the first failure restarts from the initial model, the second ends the run."""
    seen = _failing_updates(monkeypatch, {1, 2})
    cfg = load_train_config("ppo_bandit", [*tiny_overrides(tmp_path, 1), *FAST, "trainer.max_restarts=1"])
    with pytest.raises(WorkerFailure, match=r"died during update\(\) \(simulated\); in phase 'actor_update' of "
                                            r"step 1\. Last complete checkpoint: \(none\)"):
        run(cfg)
    assert seen["n"] == 2


# (group role, method) of each call the step makes to its workers, in step order, and the phase that names it
STEP_CALLS = [(("actor", "engine_generate"), "rollout"), (("actor", "engine_sleep"), "engine_sleep"),
              (("actor", "compute_log_probs"), "old_log_probs"), (("critic", "compute_values"), "values"),
              (("critic", "update"), "critic_update"), (("actor", "update"), "actor_update"),
              (("actor", "engine_wake"), "weight_sync"), (("actor", "sync_engine_weights"), "weight_sync")]


@pytest.mark.slow
def test_a_restart_from_every_phase_of_a_step_continues_the_run(tmp_path, monkeypatch, capsys):
    """Each of the step's worker calls fails once (a dead worker), one after another: every restart rebuilds the
    groups and their hosted engines (new, asleep) and the run goes on to its last step, whatever phase failed:
    nothing is left asleep or half-woken that the next rollout or sync would trip over."""
    from ragen.ppo.trainer import PPOTrainer

    real_call, real_each, real_advance = LocalWorkerGroup.call, LocalWorkerGroup.call_each, PPOTrainer._advance
    failed, in_step = [], [False]
    role = {"PolicyWorker": "actor", "CriticWorker": "critic"}

    def advance(self):  # only a step's calls fail (the set-up's first load and the restarts' own sync do not)
        in_step[0] = True
        try:
            return real_advance(self)
        finally:
            in_step[0] = False

    def maybe_fail(group, method):
        key = (getattr(group.worker, "role", None) or role.get(type(group.worker).__name__), method)
        if in_step[0] and key in dict(STEP_CALLS) and key not in failed:
            failed.append(key)
            raise WorkerFailure(f"{key[0]} worker rank 0 died during {method}() (simulated)")

    def call(self, method, batch=None, **kw):
        maybe_fail(self, method)
        return real_call(self, method, batch, **kw)

    def call_each(self, method, args):
        maybe_fail(self, method)
        return real_each(self, method, args)

    monkeypatch.setattr(LocalWorkerGroup, "call", call)
    monkeypatch.setattr(LocalWorkerGroup, "call_each", call_each)
    monkeypatch.setattr(PPOTrainer, "_advance", advance)
    overrides = [*tiny_overrides(tmp_path, 2), "trainer.use_ray=false", "trainer.val_before_train=false",
                 "trainer.val_freq=0", "trainer.report=false", "trainer.save_freq=1",
                 f"trainer.max_restarts={len(STEP_CALLS)}",
                 "actor.ppo_epochs=2"]  # an exactly on-policy update would skip the old-log-prob phase
    metrics = run(load_train_config("ppo_bandit", overrides))
    assert failed == [key for key, _ in STEP_CALLS]
    assert metrics["trainer/restarts"] == len(STEP_CALLS)
    said = capsys.readouterr().out
    named = [line.split("in phase '")[1].split("'")[0] for line in said.splitlines() if "(simulated); in phase" in line]
    assert named == [phase for _, phase in STEP_CALLS]
