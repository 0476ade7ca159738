"""Worker ranks in fresh processes (``torch.multiprocessing`` spawn, gloo), for checks that need a process of their
own per rank: peak RSS (``ru_maxrss`` only grows, so each build is measured in a new process) and FSDP2 builds of
two ranks without Ray.

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


def _rank_main(rank: int, world_size: int, port: int, spec: dict[str, Any], out_dir: str) -> None:
    """Build one worker rank as ``spec`` says, record its peak-RSS growth over the post-import baseline, run
    ``spec["calls"]`` on this rank's rows and save the results to ``out_dir/rank<r>.pt``."""
    torch.set_num_threads(1)
    import peft  # noqa: F401  (imports the worker build would do lazily belong to the baseline)
    import transformers.models.llama.modeling_llama  # noqa: F401

    from ragen.utils.memory import peak_rss_gb
    from ragen.workers import ActorConfig, CriticConfig, CriticWorker, PolicyWorker
    from ragen.workers.data import TrainBatch

    baseline = peak_rss_gb()
    kw = dict(spec.get("kwargs", {}))
    if spec["worker"] == "critic":
        worker = CriticWorker(spec["model"], CriticConfig(**spec["cfg"]), rank, world_size, "127.0.0.1", port, **kw)
    else:
        worker = PolicyWorker(spec["model"], ActorConfig(**spec["cfg"]), rank, world_size, "127.0.0.1", port, **kw)
    out: dict[str, Any] = {"baseline_gb": baseline, "build_delta_gb": peak_rss_gb() - baseline}
    if spec.get("batch") is not None:
        ids, attn, resp = spec["batch"]
        rows = slice(rank * ids.shape[0] // world_size, (rank + 1) * ids.shape[0] // world_size)
        batch = TrainBatch(ids[rows], attn[rows], resp[rows])
        for name in spec.get("calls", ()):
            out[name] = getattr(worker, name)(batch)
    if spec.get("state"):
        from ragen.workers import dist as D

        out["state"] = D.full_state_dict(worker.module)
        out["dtypes"] = {k: str(v.dtype) for k, v in worker.module.state_dict().items()}
    torch.save(out, Path(out_dir) / f"rank{rank}.pt")
    from ragen.workers import dist as D

    D.destroy()


def run_ranks(spec: dict[str, Any], out_dir: str | Path, world_size: int = 2) -> list[dict[str, Any]]:
    """Run ``_rank_main`` on ``world_size`` fresh spawned processes; returns each rank's saved results."""
    import torch.multiprocessing as mp

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    mp.start_processes(_rank_main, args=(world_size, free_port(), spec, str(out_dir)), nprocs=world_size,
                       start_method="spawn")
    return [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(world_size)]
