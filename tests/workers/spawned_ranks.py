"""Worker ranks in fresh processes (``torch.multiprocessing`` spawn, gloo), for checks that need a process of their
own per rank: peak RSS (the high-water mark only grows, so each build is measured in a new process) and FSDP2
builds of two ranks without Ray.

Imported as ``from spawned_ranks import ...`` (pytest puts this folder on ``sys.path``; spawned children inherit it).
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import torch


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def own_peak_gb() -> float:
    """This process image's peak resident set (``VmHWM``), GiB. Not ``ru_maxrss``: a spawned process starts from
    the resident set its parent had at the fork, so children of a large test process would all report its size."""
    with open("/proc/self/status", encoding="ascii") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:")) * 1024 / 2**30


def rank_rows(n: int, rank: int, world_size: int) -> slice:
    """The rows of an ``n``-row batch rank ``rank`` works on (consecutive equal parts in rank order)."""
    return slice(rank * n // world_size, (rank + 1) * n // world_size)


def _rank_main(rank: int, world_size: int, port: int, spec: dict[str, Any], out_dir: str) -> None:
    """Build one worker rank as ``spec`` says and run ``spec["steps"]`` in order; save the results to
    ``out_dir/rank<r>.pt``. ``results["rss_build"]`` is the peak-RSS growth of the build over the post-import
    baseline. Steps: ``("call", method)`` on this rank's rows of ``spec["batch"]`` (results[i]), ``("load",
    folder)`` (results[i]: the peak-RSS growth during the load), ``("state", None)`` (results[i]: the gathered
    full state dict on rank 0, {} elsewhere)."""
    torch.set_num_threads(1)
    import peft  # noqa: F401  (imports the worker build would do lazily belong to the baseline)
    import transformers.models.llama.modeling_llama  # noqa: F401

    from ragen.workers import ActorConfig, CriticConfig, CriticWorker, PolicyWorker
    from ragen.workers import dist as D
    from ragen.workers.data import TrainBatch

    baseline = own_peak_gb()
    kw = dict(spec.get("kwargs", {}))
    if spec["worker"] == "critic":
        worker = CriticWorker(spec["model"], CriticConfig(**spec["cfg"]), rank, world_size, "127.0.0.1", port, **kw)
    else:
        worker = PolicyWorker(spec["model"], ActorConfig(**spec["cfg"]), rank, world_size, "127.0.0.1", port, **kw)
    out: dict[Any, Any] = {"baseline_gb": baseline, "rss_build": own_peak_gb() - baseline}
    batch = None
    if spec.get("batch") is not None:
        ids, attn, resp = spec["batch"]
        rows = rank_rows(ids.shape[0], rank, world_size)
        batch = TrainBatch(ids[rows], attn[rows], resp[rows])
    for i, (op, arg) in enumerate(spec.get("steps", ())):
        if op == "call":
            out[i] = getattr(worker, arg)(batch)
        elif op == "load":
            before = own_peak_gb()
            worker.load(arg)
            out[i] = own_peak_gb() - before
        elif op == "state":
            out[i] = D.full_state_dict(worker.module)
        else:
            raise ValueError(f"unknown step {op!r}")
    torch.save(out, Path(out_dir) / f"rank{rank}.pt")
    D.barrier()  # no rank leaves the group while another still talks to it
    D.destroy()


def run_ranks(spec: dict[str, Any], out_dir: str | Path, world_size: int = 2) -> list[dict[Any, Any]]:
    """Run ``_rank_main`` on ``world_size`` fresh spawned processes; returns each rank's saved results."""
    import torch.multiprocessing as mp

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    mp.start_processes(_rank_main, args=(world_size, free_port(), spec, str(out_dir)), nprocs=world_size,
                       start_method="spawn")
    return [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(world_size)]
