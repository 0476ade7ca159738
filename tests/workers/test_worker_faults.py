"""A worker dies or hangs mid-call: the group names the role, rank and method instead of hanging, and the
driver adds the phase, the step and the checkpoint to resume from."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path
from types import SimpleNamespace

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


class SlowStart(Doomed):
    """A worker that never answers its start-up ping."""

    def ping(self) -> int:
        time.sleep(600)
        return self.rank


class HungEngine:
    """A rollout engine actor whose generate and NCCL calls hang and whose wake kills its process."""

    def generate(self, prompts, sampling):
        time.sleep(600)

    def wake(self, tags=None):
        os.kill(os.getpid(), signal.SIGKILL)

    def rpc(self, method, *args):
        time.sleep(600)


class HungSender:
    """The actor's rank 0 in an NCCL weight sync, stuck in the rendezvous."""

    def sync_address(self):
        return "127.0.0.1", 1

    def init_weight_sender(self, host, port, world):
        time.sleep(600)


@pytest.fixture(scope="module")
def ray_here():
    """A local Ray whose workers import this file's classes."""
    ray = pytest.importorskip("ray")
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
             runtime_env={"env_vars": {"PYTHONPATH": path, "OMP_NUM_THREADS": "1"}})
    yield ray
    ray.shutdown()


@pytest.mark.slow
def test_dead_and_hung_ranks_are_named_not_waited_for(ray_here):
    ray = ray_here
    from ragen.workers import WorkerGroup

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
    assert len(set(pids)) == 2  # two real processes


@pytest.mark.slow
def test_engine_nccl_and_start_hangs_are_named_not_waited_for(ray_here):
    """The remote calls outside the worker groups' ``call``: the vLLM engine actor (generate / wake), the NCCL
    weight sync's rendezvous and buckets, and the ranks' start-up ping each stop within their timeout with a
    ``WorkerFailure`` naming who and what (before: a bare ``ray.get`` with no timeout, or a raw Ray error)."""
    ray = ray_here
    from ragen.trainer import placement
    from ragen.trainer.config.compose import load_train_config
    from ragen.workers import WorkerGroup

    cfg = load_train_config("base", ["trainer.worker_call_timeout_s=1.5"])
    engine = placement.RemoteEngine(ray.remote(HungEngine).options(num_cpus=0).remote(),
                                    timeout_s=cfg.trainer.worker_call_timeout_s)
    t0 = time.perf_counter()
    with pytest.raises(WorkerFailure, match=r"rollout engine did not finish generate\(\) within "
                                            r"trainer.worker_call_timeout_s=1.5 s"):
        engine.generate([[1, 2]], None)
    group = SimpleNamespace(workers=[ray.remote(HungSender).options(num_cpus=0).remote()],
                            call_rank0=lambda method, *a: [])
    with pytest.raises(WorkerFailure, match=r"NCCL weight-sync group \(actor rank 0, rollout engine\) did not "
                                            r"finish init_weight_group\(\) within trainer.worker_call_timeout_s=1.5"):
        placement.init_nccl_sync(cfg, engine, group)
    with pytest.raises(WorkerFailure, match=r"did not finish nccl_sync\(\) within trainer.worker_call_timeout_s=2 s"):
        placement.nccl_sync(engine, group, "float32", 8, timeout_s=2.0)
    fresh = placement.RemoteEngine(ray.remote(HungEngine).options(num_cpus=0).remote(), timeout_s=30.0)
    with pytest.raises(WorkerFailure, match=r"rollout engine died during wake\(\)"):  # (a busy actor queues calls)
        fresh.wake(("weights",))
    # the rank's ping never answers; the budget is long enough for the group's free_port() task to cold-start a Ray
    # worker that unpickles it (importing ragen.workers.group, hence torch: seconds on a slow 2-core machine)
    with pytest.raises(WorkerFailure, match=r"critic worker rank 0 did not finish ping\(\) within "
                                            r"trainer.worker_start_timeout_s=15 s"):
        WorkerGroup(SlowStart, world_size=1, label="critic", ready_timeout_s=15, resources_per_worker={"CPU": 0.5})
    assert time.perf_counter() - t0 < 60
    for _ in range(100):  # the half-started group released its placement group (Ray frees it asynchronously)
        if ray.available_resources().get("CPU", 0) == 2:
            break
        time.sleep(0.1)
    assert ray.available_resources().get("CPU", 0) == 2, ray.available_resources()


def test_no_bare_ray_get_in_the_package():
    """Every blocking wait on a remote call goes through ``remote_get`` (a timeout, a named failure): no other
    ``ray.get`` (or ``ray.wait``) is left anywhere under ragen/."""
    root = Path(__file__).resolve().parents[2] / "ragen"
    found = []
    for path in sorted(root.rglob("*.py")):
        for line in path.read_text().splitlines():
            code = line.split("#")[0]
            # a call, or the function handed on (``get = ray.get``, ``f(..., ray.get)``)
            if re.search(r"\bray\.(get|wait)\s*\(", code) or re.search(r"[=,(]\s*ray\.(get|wait)\s*[),]?$", code):
                found.append(f"{path.relative_to(root.parent)}: {line.strip()}")
    assert found == ["ragen/workers/group.py: return ray.get(refs, timeout=limit)"], found


def test_driver_names_phase_step_and_resumable_checkpoint(tmp_path, monkeypatch):
    """An in-process run whose actor group fails in step 2's update: the error names the worker, the phase
    ``actor_update``, step 2 and checkpoint 1, which resume=auto picks."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trainer"))
    from trainer_helpers import tiny_overrides

    from ragen.launch import run
    from ragen.trainer.config.compose import load_train_config
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


@pytest.mark.parametrize("fail_method, overrides, where", [
    ("compute_log_probs", ["trainer.val_before_train=true", "trainer.report=true"], "in phase 'val_credit' of step 0"),
    ("sft_update", ["trainer.sft_warmup_steps=1"], "in phase 'warm_start' of step 0"),
])
def test_validation_and_warm_start_failures_name_their_phase(tmp_path, monkeypatch, fail_method, overrides, where):
    """A worker dying in the validation before training (its credit pass) or in the warm start is named with that
    phase (before: only the train step and the save were guarded, so such a failure carried no phase)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trainer"))
    from trainer_helpers import tiny_overrides

    from ragen.launch import run
    from ragen.trainer.config.compose import load_train_config
    from ragen.workers.group import LocalWorkerGroup

    real = LocalWorkerGroup.call

    def call(self, method, batch=None, **kw):
        if method == fail_method:
            raise WorkerFailure(f"actor worker rank 0 died during {method}() (simulated)")
        return real(self, method, batch, **kw)

    monkeypatch.setattr(LocalWorkerGroup, "call", call)
    cfg = load_train_config("ppo_bandit", [*tiny_overrides(tmp_path, 1), "trainer.use_ray=false",
                                           "trainer.val_before_train=false", "algorithm.estimator=grpo",
                                           "critic.enable=false", *overrides])
    with pytest.raises(WorkerFailure, match=rf"died during {fail_method}\(\) \(simulated\); {re.escape(where)}\. "
                                            r"Last complete checkpoint: \(none\)"):
        run(cfg)
