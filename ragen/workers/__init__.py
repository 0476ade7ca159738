"""Model workers: FSDP2 policy / reference / critic workers and the groups that drive them.

One worker instance lives on each rank (a Ray actor, or in-process for world size 1) and holds the
rank-local shard of a model. The driver talks to a *group*, never to ranks directly::

    from ragen.workers import ActorConfig, CriticConfig, PolicyWorker, CriticWorker, TrainBatch, WorkerGroup

    actor = WorkerGroup(PolicyWorker, world_size=2, resources_per_worker={"CPU": 1},
                        model_name_or_path="smollm2-135m-instruct", cfg=ActorConfig(...))
    old_lp = actor.call("compute_log_probs", batch)            # (B, T) tensor, ranks concatenated
    metrics = actor.call("update", batch)                      # dict[str, float], already all-reduced
    state = actor.call_rank0("full_state_dict")                # full unsharded weights (on rank 0)
    actor.call("save", dir="ckpt/actor"); actor.call("load", dir="ckpt/actor")
    actor.shutdown()

Public names:
  - ``ActorConfig``, ``CriticConfig`` (config.py): frozen dataclasses mirrored by the trainer's YAML.
  - ``TrainBatch`` (data.py): the (B, T) tensors a worker consumes; ``split``/``select``/``chunk``/``cat``.
  - ``token_log_probs`` (logprob.py): chunked per-token log-probs (+ entropy) without a full (B, T, V) tensor.
  - ``PolicyWorker`` (actor.py): role "actor" (PPO update) or "ref" (frozen); ``compute_log_probs``,
    ``update``, ``full_state_dict``, ``save``, ``load``; an actor built with ``engine=EngineSpec(...)`` hosts a
    rollout engine (engine_host.py: ``engine_generate``, ``engine_sleep`` / ``engine_wake``,
    ``sync_engine_weights``).
  - ``CriticWorker`` (critic.py): value-head model; ``compute_values``, ``update``, ``save``, ``load``.
  - ``WorkerGroup`` (Ray placement group of ranks), ``LocalWorkerGroup`` (in-process, world size 1):
    ``call(method, batch=None, **kw)``, ``call_rank0(method, **kw)``, ``call_each(method, args_per_rank)``,
    ``shutdown()``.
  - ``init_distributed``, ``shard_model``, ``compute_autocast`` (dist.py): device / process group / FSDP2.

Imports are lazy so ``import ragen.workers`` does not pull in Ray or build anything.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ActorConfig": "ragen.workers.config",
    "CriticConfig": "ragen.workers.config",
    "TrainBatch": "ragen.workers.data",
    "token_log_probs": "ragen.workers.logprob",
    "PolicyWorker": "ragen.workers.actor",
    "CriticWorker": "ragen.workers.critic",
    "WorkerGroup": "ragen.workers.group",
    "LocalWorkerGroup": "ragen.workers.group",
    "init_distributed": "ragen.workers.dist",
    "shard_model": "ragen.workers.dist",
    "compute_autocast": "ragen.workers.dist",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'ragen.workers' has no attribute {name!r}; public names: {__all__}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
