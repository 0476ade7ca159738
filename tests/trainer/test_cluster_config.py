"""Cluster settings without a cluster: which Ray address the trainer joins, the placement strategy check (before Ray
starts), and the wording of the missing-resources error for each strategy (``ragen.workers.placement_check``)."""

from __future__ import annotations

import sys

import pytest

from ragen.trainer import builders
from ragen.trainer.config.compose import load_train_config
from ragen.trainer.config.schema import ConfigError
from ragen.workers.placement_check import shortfall_message

NODES = [  # ray.nodes() records: two alive nodes of 2 CPUs, one dead
    {"NodeID": "aaaa1111bbbb2222", "Alive": True, "NodeManagerAddress": "10.0.0.1",
     "Resources": {"CPU": 2.0, "memory": 1e9, "node:10.0.0.1": 1.0}},
    {"NodeID": "cccc3333dddd4444", "Alive": True, "NodeManagerAddress": "10.0.0.2", "Resources": {"CPU": 2.0}},
    {"NodeID": "eeee5555ffff6666", "Alive": False, "NodeManagerAddress": "10.0.0.3", "Resources": {"CPU": 8.0}},
]


class FakeRay:
    """Records ``ray.init`` keyword arguments."""

    def __init__(self):
        self.calls = []

    def is_initialized(self):
        return False

    def init(self, **kw):
        self.calls.append(kw)


@pytest.mark.parametrize(("key", "env", "expected"), [
    ("10.0.0.1:6379", "10.9.9.9:6379", "10.0.0.1:6379"),  # the config key wins
    (None, "10.9.9.9:6379", "10.9.9.9:6379"),
    (None, None, "local"),  # nothing given: a fresh local Ray with num_cpus (never one found on the machine)
])
def test_start_ray_joins_the_given_cluster_and_never_starts_its_own(monkeypatch, key, env, expected):
    fake = FakeRay()
    monkeypatch.setitem(sys.modules, "ray", fake)
    if env is None:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    else:
        monkeypatch.setenv("RAY_ADDRESS", env)
    cfg = load_train_config("base", ["model=tiny"] + ([f"trainer.ray_address={key}"] if key else []))
    builders.start_ray(cfg)
    (call,) = fake.calls
    assert call.get("address") == expected
    assert ("num_cpus" in call) == (expected == "local")  # joining a cluster never sizes (starts) a Ray


def test_placement_settings_are_checked_before_ray_starts():
    with pytest.raises(ConfigError, match=r"trainer.placement_strategy='spread' is unknown; use one of PACK, "
                                          r"SPREAD, STRICT_PACK, STRICT_SPREAD"):
        load_train_config("base", ["trainer.placement_strategy=spread"])
    with pytest.raises(ConfigError, match="trainer.max_restarts must be >= 0"):
        load_train_config("base", ["trainer.max_restarts=-1"])
    with pytest.raises(ConfigError, match="trainer.placement_timeout_s must be > 0"):
        load_train_config("base", ["trainer.placement_timeout_s=0"])
    for key in ("worker_call_timeout_s", "worker_start_timeout_s"):
        with pytest.raises(ConfigError, match=rf"trainer.{key} must be > 0 seconds or null \(no limit\), got -1"):
            load_train_config("base", [f"trainer.{key}=-1"])
        assert getattr(load_train_config("base", [f"trainer.{key}=null"]).trainer, key) is None
    assert load_train_config("base", []).trainer.worker_start_timeout_s == 600.0
    cfg = load_train_config("base", [])
    assert (cfg.trainer.ray_address, cfg.trainer.placement_strategy, cfg.trainer.max_restarts) == (None, "PACK", 0)


def test_shortfall_message_names_what_is_missing_per_strategy():
    free = {"CPU": 3.0, "memory": 5e8, "node:10.0.0.1": 1.0}
    msg = shortfall_message("actor worker group", [{"CPU": 2.0}] * 2, "PACK", NODES, free, 5)
    assert msg.startswith("actor worker group needs 2 bundles of {CPU: 2} (placement strategy PACK) but the Ray "
                          "cluster could not reserve them within 5 s: short of CPU: needs 4, 3 free.")
    assert "Cluster has {CPU: 3} free; 2 alive node(s): aaaa1111bbbb (10.0.0.1): {CPU: 2}; " \
           "cccc3333dddd (10.0.0.2): {CPU: 2}." in msg  # the dead node and Ray's bookkeeping keys left out
    msg = shortfall_message("critic worker group", [{"CPU": 1.0}] * 3, "STRICT_SPREAD", NODES, {"CPU": 4.0}, 5)
    assert "STRICT_SPREAD needs 3 nodes that each fit one bundle, 2 do" in msg and "short of" not in msg
    msg = shortfall_message("actor worker group", [{"CPU": 1.0}] * 3, "STRICT_PACK", NODES, {"CPU": 4.0}, 5)
    assert "STRICT_PACK needs one node with {CPU: 3}, none has it" in msg
    msg = shortfall_message("ref worker group", [{"GPU": 1.0, "CPU": 1.0}, {"GPU": 1.0, "CPU": 2.0}], "SPREAD",
                            NODES, {"CPU": 4.0}, 5)
    assert "bundles {CPU: 1, GPU: 1}, {CPU: 2, GPU: 1}" in msg and "short of GPU: needs 2, 0 free" in msg
