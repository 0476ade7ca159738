"""In-run recovery from a dead worker (``trainer.max_restarts``).

A worker process that dies mid-step (killed, crashed, or lost with its node) surfaces in the driver as a
``WorkerFailure`` naming the role, rank, method and phase (``PPOTrainer._guarded``). With restarts left, the
trainer does not exit (``PPOTrainer.restart``): :func:`rebuild_workers` tears down every worker group of the run
(the survivors too: FSDP ranks of a group share a process group that cannot take a new member) and builds them
again in the same placements (the actor's ranks with fresh engines of their own, asleep until their first weight
sync). A separately placed vLLM engine (``rollout.vllm.placement=separate``) is replaced on every restart, whether it
died (its calls raise a ``WorkerFailure`` naming the rollout engine, in the trainer or, asynchronously, in the
rollout thread, which hands it to the trainer's next step) or a worker did (its NCCL group with the old actor's rank
0 cannot take the new one): the old engine actor is killed, a new one starts in the same bundle before the worker
groups, as at set-up, the run's engine handle (which the proxies keep) is bound to it, and the new actor's rank 0
forms the NCCL weight-sync group with it (``placement.replace_engine_actor``, ``placement.init_nccl_sync``).
:func:`rewind` then loads the last complete checkpoint (``ragen.utils.checkpoint.latest_checkpoint``: an
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


def rebuild_workers(run: Run, placement_group: Any, engine_spec: Any, *, nccl: bool,
                    kill_engine: Callable[[Any], None] | None = None) -> None:
    """Replace every worker group of ``run`` by a new one in the same placement (``placement_group``); the actor's
    ranks host fresh engines (``engine_spec``; the run's engine handle, which the proxies keep, is bound to them),
    or (``nccl``) the separately placed engine is replaced first, its old actor ended by ``kill_engine`` (default
    ``ray.kill``), and the new engine joins the new actor's rank 0 (module docstring)."""
    run.stop_workers()
    if nccl:  # run.engine: the RemoteEngine, or the VersionedEngine around it (which forwards rebind and actor)
        placement.replace_engine_actor(
            run.engine, lambda: builders.build_engine(run.cfg, run.model_path, run.tokenizer, placement_group),
            kill_engine)
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
