"""Weight sync of the colocated rollout engines: bytes through Ray's object store and wall time per sync.

Two actor ranks (Ray actors, gloo, FSDP2 world size 2 on CPU) each host an hf engine (``ragen.workers.engine_host``).
Each sync is timed and measured twice:

- ``driver`` (the alternative: one engine in the driver): rank 0 returns the gathered full fp32 state dict
  (``PolicyWorker.full_state_dict``, every rank gathers) through Ray to the driver, which copies it into its own hf
  engine;
- ``hosted``: ``HostedEngines.sync_weights`` (with the step's wake of the weights before and of the KV cache after):
  every rank gathers one parameter at a time and copies it into its own engine; the driver gets three numbers.

"object store" is the growth of Ray's plasma store's cumulative created bytes during the sync (what the raylet
reports, every node); "returned" is the size of the tensors in what the driver received. Median over ``--repeats``.

Usage: python bench/weight_sync.py [--model tiny|<alias or folder>] [--ranks 2] [--repeats 3] [--dtype float32]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402


def plasma_created_bytes() -> int:
    """Ray's cumulative bytes created in the plasma object store (all nodes)."""
    import ray
    from ray._private.internal_api import get_memory_info_reply, get_state_from_address

    reply = get_memory_info_reply(get_state_from_address(ray.get_runtime_context().gcs_address))
    return int(reply.store_stats.cumulative_created_bytes)


def tensor_bytes(obj: Any) -> int:
    """Bytes of every tensor inside ``obj`` (dicts, lists, tuples)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def measure(fn) -> dict[str, float]:
    before = plasma_created_bytes()
    start = time.perf_counter()
    returned = fn()
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "object_store_bytes": plasma_created_bytes() - before,
            "returned_tensor_bytes": tensor_bytes(returned)}


def model_folder(name: str) -> tuple[str, Any]:
    from ragen.trainer.builders import prepare_model
    from ragen.trainer.config.compose import load_train_config

    overrides = ["model=tiny"] if name == "tiny" else [f"model.path={name}"]
    return prepare_model(load_train_config("base", overrides))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", default="float32", help="the engines' (rollout) dtype")
    args = ap.parse_args()

    import ray

    from ragen.rollout.hf import HFEngine
    from ragen.trainer.hosted import HostedEngines
    from ragen.trainer.placement import wake_and_sync
    from ragen.workers import ActorConfig, PolicyWorker, WorkerGroup
    from ragen.workers.engine_host import EngineSpec

    path, tok = model_folder(args.model)
    ray.init(address="local", num_cpus=args.ranks, include_dashboard=False, logging_level="ERROR",
             log_to_driver=False, runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}})
    spec = EngineSpec("hf", {"model": path, "tokenizer": tok, "dtype": args.dtype})
    group = WorkerGroup(PolicyWorker, args.ranks, resources_per_worker={"CPU": 1}, model_name_or_path=path,
                        cfg=ActorConfig(mixed_precision="fp32"), engine=spec, num_threads=1)
    hosted = HostedEngines(group)
    driver_engine = HFEngine(path, tok, dtype=args.dtype)

    def driver_sync() -> Any:
        state = group.call_rank0("full_state_dict")
        driver_engine.update_weights(state)
        return state

    def hosted_sync() -> Any:
        wake_and_sync(hosted, hosted.sync_weights)
        hosted.sleep()
        return hosted.last_sync

    rows: dict[str, list[dict[str, float]]] = {"driver": [], "hosted": []}
    try:
        hosted_sync()  # warm-up of both paths (first allocations)
        driver_sync()
        for _ in range(args.repeats):
            rows["driver"].append(measure(driver_sync))
            rows["hosted"].append(measure(hosted_sync))
        summary = hosted.last_sync
    finally:
        group.shutdown()
        ray.shutdown()
    params = sum(v.numel() for v in driver_engine.model.state_dict().values())
    print(f"model {args.model} ({params / 1e6:.1f}M parameters in the state dict), {args.ranks} actor ranks, "
          f"engine dtype {args.dtype}, median of {args.repeats}")
    print(f"{'path':8s} {'object store MB':>16s} {'returned MB':>12s} {'seconds':>8s}")
    out = {}
    for name, rs in rows.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        out[name] = med
        print(f"{name:8s} {med['object_store_bytes'] / 1e6:16.3f} {med['returned_tensor_bytes'] / 1e6:12.3f} "
              f"{med['seconds']:8.3f}")
    print(f"hosted summary per rank: {summary}")
    print(json.dumps({"model": args.model, "ranks": args.ranks, "dtype": args.dtype, **out}))


if __name__ == "__main__":
    from ragen.allocator import tune_process

    tune_process()  # the process settings of ragen's programs
    main()
