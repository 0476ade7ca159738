"""``trainer.max_restarts`` without Ray (in-process groups, the failure simulated): failures beyond the budget stop
the run with the named ``WorkerFailure``. (A real SIGKILL, the restart from a checkpoint and its equality with an
uninterrupted run, on a Ray cluster: ``test_ray_cluster.py``.)"""

from __future__ import annotations

import pytest
from trainer_helpers import tiny_overrides

from ragen.launch import run
from ragen.trainer.compose import load_train_config
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
