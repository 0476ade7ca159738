"""In-run recovery from a dead worker (``trainer.max_restarts``).

A worker process that dies mid-step (killed, crashed, or lost with its node) surfaces in the driver as a
``WorkerFailure`` naming the role, rank, method and phase (``PPOTrainer._guarded``). With restarts left, the
trainer does not exit (``PPOTrainer.restart``): :func:`rebuild_workers` tears down every worker group of the run
(the survivors too: FSDP ranks of a group share a process group that cannot take a new member) and builds them
again in the same placements (the actor's ranks with fresh engines of their own, asleep until their first weight
sync); :func:`rewind` then loads the last complete checkpoint (``ragen.utils.checkpoint.latest_checkpoint``: an
interrupted save never counts) into the workers, the engines (the weight sync wakes them, whatever phase the
failure interrupted), the step counter, the RNG and the env seed counters. The steps after that checkpoint are run
again, exactly as a ``trainer.resume=auto`` restart of the whole job would run them, and their metrics logged
before the failure are dropped so every step appears once. Before the first checkpoint the run restarts from its
initial state (:class:`InitialState`, taken at set-up).

The number of restarts so far is logged with every step as ``trainer/restarts``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ragen.trainer import builders, placement
from ragen.trainer.run import Run
from ragen.utils import console
from ragen.utils.checkpoint import latest_checkpoint
from ragen.utils.seeding import get_rng_state, set_rng_state


@dataclasses.dataclass(frozen=True)
class InitialState:
    """What a restart before the first checkpoint goes back to: the RNG and the train proxy's seed counters at
    set-up (:meth:`now`)."""

    rng: dict[str, Any]
    proxy: dict[str, int]

    @classmethod
    def now(cls, proxy: Any) -> InitialState:
        return cls(rng=get_rng_state(), proxy=proxy.state_dict())


def rebuild_workers(run: Run, placement_group: Any, engine_spec: Any, *, nccl: bool) -> None:
    """Replace every worker group of ``run`` by a new one in the same placement (``placement_group``); the actor's
    ranks host fresh engines (``engine_spec``; the run's engine handle, which the proxies keep, is bound to them),
    or a separately placed engine joins the new actor's rank 0 again (``nccl``)."""
    run.stop_workers()
    run.workers = builders.build_workers(run.cfg, run.model_path, placement_group, engine=engine_spec)
    if engine_spec is not None:  # the proxies keep the handle; it drives the new ranks' engines
        run.engine.rebind(run.workers["actor"])
    run.record_placement()
    if nccl:
        placement.init_nccl_sync(run.cfg, run.engine, run.workers["actor"])


def rewind(run: Run, initial: InitialState, load: Callable[[Path], None], sync_engine: Callable[[], Any]) -> None:
    """Continue ``run`` from its last complete checkpoint (``load(path)``), or, before the first one, from
    ``initial`` with the initial model (``sync_engine()``); the metrics logged past that step are dropped."""
    last = latest_checkpoint(run.ckpt_root)
    if last is not None:
        load(last)
    else:
        run.step, run.warm_started = 0, False
        set_rng_state(initial.rng)
        run.proxy.load_state_dict(initial.proxy)
        sync_engine()
        console.say("[ragen] no complete checkpoint yet: restarted from the initial model at step 0")
    run.rewind(run.step)
