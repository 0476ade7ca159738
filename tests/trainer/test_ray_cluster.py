"""The trainer on a real multi-node Ray cluster on this machine (scale-out and restarts).

``ray.cluster_utils.Cluster`` starts a head and a second node, each with its own raylet, one CPU and a custom
resource naming it. The trainer joins it (``trainer.ray_address``, never a Ray of its own):

1. ``python -m ragen.train`` (GAE) with the actor at FSDP world size 2 (gloo over loopback), SPREAD placement:
   exits 0, its two ranks ran on the two different nodes, and after 2 PPO steps its parameters equal the same run's
   with both ranks packed on one node (each of the two ranks hosts an engine that plays its share of the episodes
   with its own seed, so a world-size-1 run samples other episodes; world size 2 against 1 on the same batches:
   ``tests/workers/test_fsdp_ray.py``);
2. the actor's process killed (SIGKILL) in step 2 with ``trainer.max_restarts=1``: the worker groups are rebuilt
   from checkpoint 1, every step is logged once, ``trainer/restarts`` counts 1, and the parameters again equal the
   uninterrupted world-size-1 run's;
3. the second node gone: a world-size-2 SPREAD run fails within seconds naming the missing resources (no hang).

The tests share the cluster and run in file order (the last one removes the node).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from trainer_helpers import assert_all_finite, load_actor_weights, read_metrics, tiny_init_weights, tiny_overrides

from ragen.launch import run
from ragen.trainer.config.compose import load_train_config

ROOT = Path(__file__).resolve().parents[2]
QUICK = ["trainer.use_ray=true", "trainer.val_before_train=false", "trainer.val_freq=0", "trainer.report=false"]
GRPO = ["algorithm.estimator=grpo", "critic.enable=false", *QUICK]  # no critic: one worker group
# GAE: the critic's values make the advantages nonzero even when every reward is the same (the tiny model never
# answers in format), so the update moves the actor; half a CPU per rank fits actor (2) + critic (1) on 2 CPUs
GAE = ["algorithm.estimator=gae", *QUICK, "trainer.cpus_per_worker=0.5"]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    node = {"num_cpus": 1, "object_store_memory": 100 * 1024**2}
    c = Cluster(initialize_head=True, head_node_args={**node, "resources": {"node_a": 1}, "include_dashboard": False})
    second = c.add_node(**node, resources={"node_b": 1})
    c.wait_for_nodes()
    c.second = second
    yield c
    c.shutdown()


@pytest.fixture(scope="module")
def ws1_reference(tmp_path_factory) -> dict:
    """The 2-step GAE run in-process at world size 1 (no Ray): its final actor weights and last metrics."""
    out = tmp_path_factory.mktemp("ws1")
    run(load_train_config("ppo_bandit", [*tiny_overrides(out, 2), *GAE, "trainer.use_ray=false"]))
    weights = load_actor_weights(out / "checkpoints" / "global_step_2")
    initial = tiny_init_weights()
    assert max(float((weights[k] - v).abs().max()) for k, v in initial.items()) > 1e-4  # the update moved them
    return {"weights": weights, "metrics": read_metrics(out)[-1]}


def _assert_same_run(run_dir: Path, reference: dict) -> None:
    got, want = load_actor_weights(run_dir / "checkpoints" / "global_step_2"), reference["weights"]
    assert got.keys() == want.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k], atol=2e-5, rtol=1e-4, msg=k)
    last = read_metrics(run_dir)[-1]
    for key in ("actor/pg_loss", "actor/grad_norm", "critic/vf_loss"):
        assert last[key] == pytest.approx(reference["metrics"][key], rel=1e-4, abs=1e-6), key


def test_world_size_2_spread_over_two_nodes_equals_one_node(cluster, tmp_path, subprocess_env):
    packed = tmp_path / "packed"
    run(load_train_config("ppo_bandit", [*tiny_overrides(packed, 2), *GAE, "trainer.actor_world_size=2",
                                         "trainer.placement_strategy=PACK", f"trainer.ray_address={cluster.address}"]))
    assert len({loc["node_id"] for loc in json.loads((packed / "placement.json").read_text())["actor"]}) == 1
    run_dir = tmp_path / "ws2"
    overrides = [*tiny_overrides(run_dir, 2), *GAE, "trainer.actor_world_size=2",
                 "trainer.placement_strategy=SPREAD", f"trainer.ray_address={cluster.address}"]
    proc = subprocess.run([sys.executable, "-m", "ragen.train", "--config-name", "ppo_bandit", *overrides],
                          cwd=tmp_path, env=subprocess_env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    where = json.loads((run_dir / "placement.json").read_text())["actor"]
    assert [loc["rank"] for loc in where] == [0, 1]
    assert {loc["node_id"] for loc in where} == {cluster.head_node.node_id, cluster.second.node_id}
    assert "[ragen] placement 2 node(s)" in proc.stdout + proc.stderr + (run_dir / "train.log").read_text()
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == [1, 2]
    assert_all_finite(records)
    weights = load_actor_weights(packed / "checkpoints" / "global_step_2")
    assert max(float((weights[k] - v).abs().max()) for k, v in tiny_init_weights().items()) > 1e-4  # it trained
    _assert_same_run(run_dir, {"weights": weights, "metrics": read_metrics(packed)[-1]})


def test_killed_worker_is_replaced_from_the_last_checkpoint(cluster, ws1_reference, tmp_path, monkeypatch):
    """SIGKILL the actor's process as step 2's update starts: the run restarts once from checkpoint 1, redoes
    step 2 and logs every step once with ``trainer/restarts``; it ends where the uninterrupted run ends."""
    from ragen.workers.group import WorkerGroup

    real, killed, updates = WorkerGroup.call, [], {"n": 0}

    def call(self, method, batch=None, **kw):
        if method == "update" and self.role == "actor":
            updates["n"] += 1
            if updates["n"] == 2:
                pid = self.location()[0]["pid"]
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        return real(self, method, batch, **kw)

    monkeypatch.setattr(WorkerGroup, "call", call)
    cfg = load_train_config("ppo_bandit", [*tiny_overrides(tmp_path, 2), *GAE, "trainer.save_freq=1",
                                           "trainer.max_restarts=1", f"trainer.ray_address={cluster.address}"])
    metrics = run(cfg)
    assert updates["n"] == 3  # steps 1, 2 (killed), 2 again
    records = read_metrics(tmp_path)
    assert [(r["step"], r["trainer/restarts"]) for r in records] == [(1, 0.0), (2, 1.0)]
    assert metrics["trainer/restarts"] == 1.0
    assert_all_finite(records)
    pid_after = json.loads((tmp_path / "placement.json").read_text())["actor"][0]["pid"]
    assert len(killed) == 1 and pid_after != killed[0]  # a new process
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["global_step_1", "global_step_2"]
    _assert_same_run(tmp_path, ws1_reference)


def test_cluster_missing_a_node_fails_fast_naming_the_resources(cluster, tmp_path):
    from ragen.workers.placement_check import PlacementError

    cluster.remove_node(cluster.second)
    cfg = load_train_config("ppo_bandit", [*tiny_overrides(tmp_path, 1), *GRPO, "trainer.actor_world_size=2",
                                           "trainer.placement_strategy=SPREAD", "trainer.placement_timeout_s=3",
                                           f"trainer.ray_address={cluster.address}"])
    t0 = time.perf_counter()
    with pytest.raises(PlacementError) as err:
        run(cfg)
    assert time.perf_counter() - t0 < 60
    msg = str(err.value)
    assert "actor worker group needs 2 bundles of {CPU: 1} (placement strategy SPREAD)" in msg
    assert "within 3 s" in msg and "short of CPU: needs 2, 1 free" in msg
    assert "1 alive node(s)" in msg and "node_a: 1" in msg and "node_b" not in msg
    assert "trainer.placement_strategy" in msg
