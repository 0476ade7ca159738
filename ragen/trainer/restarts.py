"""In-run recovery from a dead worker (``trainer.max_restarts``).

A worker process that dies mid-step (killed, crashed, or lost with its node) surfaces in the driver as a
``WorkerFailure`` naming the role, rank, method and phase (``PPOTrainer._guarded``). With restarts left, the
trainer does not exit: :func:`restart` tears down every worker group (the survivors too: FSDP ranks of a group
share a process group that cannot take a new member), builds them again in the same placements (the actor's ranks
with fresh engines of their own, asleep until their first weight sync), and loads the last complete checkpoint
(``ragen.utils.checkpoint.latest_checkpoint``: an interrupted save never counts) into the workers, the engines (the
weight sync wakes them, whatever phase the failure interrupted), the step counter, the RNG and the env seed
counters. The steps after that checkpoint are run
again, exactly as a ``trainer.resume=auto`` restart of the whole job would run them, and their metrics logged
before the failure are dropped so every step appears once. Before the first checkpoint the run restarts from its
initial state (:func:`initial_state`, taken at set-up).

The number of restarts so far is logged with every step as ``trainer/restarts``.
"""

from __future__ import annotations

from typing import Any

from ragen.trainer import builders, numerics, placement
from ragen.trainer.state import trim_metrics
from ragen.utils import console
from ragen.utils.checkpoint import latest_checkpoint
from ragen.utils.seeding import get_rng_state, set_rng_state


def initial_state(trainer: Any) -> dict[str, Any]:
    """What a restart before the first checkpoint goes back to: the RNG and the proxy's seed counters at set-up."""
    return {"rng": get_rng_state(), "proxy": trainer.proxy.state_dict()}


def restart(trainer: Any, failure: Exception) -> None:
    """Replace every worker group of ``trainer`` and continue from the last complete checkpoint (see module doc).

    Counts the restart in ``trainer.restarts``; the caller checks ``trainer.max_restarts`` first.
    """
    cfg = trainer.cfg
    trainer.restarts += 1
    console.say(f"[ragen] {failure}\n[ragen] restart {trainer.restarts}/{cfg.trainer.max_restarts}: rebuilding the "
                "worker groups")
    for group in trainer.workers.values():
        if group is not None:
            group.shutdown()
    trainer.workers = builders.build_workers(cfg, trainer.model_path, trainer.placement_group,
                                             engine=trainer.engine_spec)
    if trainer.engine_spec is not None:  # the proxies keep the handle; it drives the new ranks' engines
        trainer.engine.rebind(trainer.workers["actor"])
    line = builders.record_placement(trainer.workers, trainer.run_dir)
    if line:
        console.say(line)
    if trainer._nccl:
        placement.init_nccl_sync(cfg, trainer.engine, trainer.workers["actor"])
    last = latest_checkpoint(trainer.ckpt_root)
    if last is not None:
        trainer.load_checkpoint(last)
    else:
        trainer.step, trainer.warm_started = 0, False
        set_rng_state(trainer.initial_state["rng"])
        trainer.proxy.load_state_dict(trainer.initial_state["proxy"])
        trainer.sync_engine_weights()
        console.say("[ragen] no complete checkpoint yet: restarted from the initial model at step 0")
    trainer._rng_after_step = None
    trainer.skips = numerics.SkipGuard(cfg.trainer.max_consecutive_skips)
    trainer.failed_steps = numerics.FailedEpisodesGuard(cfg.trainer.max_failed_steps)
    trainer._proxy_after_step, trainer._updating = None, False
    trainer.history = [r for r in trainer.history if r.get("step", 0) <= trainer.step]
    trim_metrics(trainer.run_dir / "metrics.jsonl", trainer.step)  # the logger appends after the kept records
