"""A worker dies or hangs mid-call (issue 13): the group names the role, rank and method instead of hanging, and the
driver adds the phase, the step and the checkpoint to resume from."""

from __future__ import annotations

import os
import signal
import time

import pytest

from ragen.workers.group import WorkerFailure, get_results


class Doomed:
    """A worker whose rank 1 can be killed (SIGKILL on its own process) or hung on request."""

    def __init__(self, rank: int, world_size: int, master_addr: str, master_port: int, role: str = "actor") -> None:
        self.rank, self.role = rank, role

    def get_role(self) -> str:
        return self.role

    def ping(self) -> int:
        return self.rank

    def pid(self) -> int:
        return os.getpid()

    def work(self, mode: str = "ok") -> int:
        if self.rank == 1 and mode == "die":
            os.kill(os.getpid(), signal.SIGKILL)
        if mode == "hang_any":
            time.sleep(600)
        return self.rank * 10


def test_dead_and_hung_ranks_are_named_not_waited_for():
    ray = pytest.importorskip("ray")
    from ragen.workers import WorkerGroup

    here = os.path.dirname(os.path.abspath(__file__))  # the workers import Doomed from this file
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
             runtime_env={"env_vars": {"PYTHONPATH": path, "OMP_NUM_THREADS": "1"}})
    try:
        group = WorkerGroup(Doomed, world_size=2, label="critic", call_timeout_s=60.0,
                            resources_per_worker={"CPU": 0.5})
        assert group.call_rank0("work") == 0
        pids = [ray.get(w.pid.remote()) for w in group.workers]
        with pytest.raises(WorkerFailure, match=r"critic worker rank 1 died during work\(\)"):
            group.call_rank0("work", mode="die")
        # rank 0 still answers, but not within the timeout: named, not waited for
        t0 = time.perf_counter()
        with pytest.raises(WorkerFailure, match=r"actor worker rank 0 did not finish work\(\) within "
                                                r"trainer.worker_call_timeout_s=2 s"):
            get_results([group.workers[0].work.remote(mode="hang_any")], "actor", "work", 2.0)
        assert time.perf_counter() - t0 < 30
        group.shutdown()
        # a worker's own ``role`` reaches its constructor (the group only borrows it for its messages)
        ref = WorkerGroup(Doomed, world_size=1, role="ref", resources_per_worker={"CPU": 0.5})
        assert ref.call_rank0("get_role") == "ref" and ref.role == "ref"
        ref.shutdown()
    finally:
        ray.shutdown()
    assert len(set(pids)) == 2  # two real processes


def test_driver_names_phase_step_and_resumable_checkpoint(tmp_path, monkeypatch):
    """An in-process run whose actor group fails in step 2's update: the error names the worker, the phase
    ``actor_update``, step 2 and checkpoint 1, which resume=auto picks."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trainer"))
    from trainer_helpers import tiny_overrides

    from ragen.trainer.compose import load_train_config
    from ragen.trainer.main import run
    from ragen.utils.checkpoint import resolve_resume
    from ragen.workers.group import LocalWorkerGroup

    real = LocalWorkerGroup.call
    updates = {"n": 0}

    def call(self, method, batch=None, **kw):
        if method == "update":
            updates["n"] += 1
            if updates["n"] == 2:
                raise WorkerFailure("actor worker rank 0 died during update() (simulated SIGKILL)")
        return real(self, method, batch, **kw)

    monkeypatch.setattr(LocalWorkerGroup, "call", call)
    cfg = load_train_config("ppo_bandit", [
        *tiny_overrides(tmp_path, 3), "trainer.use_ray=false", "trainer.val_before_train=false",
        "trainer.val_freq=0", "trainer.save_freq=1", "algorithm.estimator=grpo", "critic.enable=false"])
    with pytest.raises(WorkerFailure) as err:
        run(cfg)
    msg = str(err.value)
    assert "actor worker rank 0 died during update()" in msg
    assert "in phase 'actor_update' of step 2" in msg
    assert str(tmp_path / "checkpoints" / "global_step_1") in msg and "trainer.resume=auto" in msg
    assert resolve_resume("auto", tmp_path / "checkpoints").name == "global_step_1"
