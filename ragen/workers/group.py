"""Worker groups: one worker per rank, driven as a unit by the trainer.

``WorkerGroup`` places ``world_size`` Ray actors in a placement group (one bundle per rank, Ray strategy
``placement_strategy``: PACK by default, SPREAD for one rank per node ...), so the same code runs on a CPU box, a
GPU box or an existing cluster (``RAY_ADDRESS`` / ``trainer.ray_address``); a cluster too small for the bundles
fails after ``placement_timeout_s`` naming what it lacks (``ragen.workers.placement_check``).
``LocalWorkerGroup`` is the in-process, world-size-1 twin with the same interface, for tests, debugging and the
benchmark.

``call(method, batch, **kw)`` splits a ``TrainBatch`` evenly by rank, mini-batch first: the global mini-batches
(``mini_batch_size`` consecutive rows of the batch in prompt order, from the workers' ``cfg``) are decided once,
for any world size, and each is split over the ranks (``ragen.workers.data.mini_batch_plan``), so an update sees
the same mini-batches at any world size; both group kinds plan the same way, so world size 1 trains on exactly
the mini-batches a larger world size does. It runs ``method`` on every rank and combines: tensors are
concatenated and put back in batch row order, metric dicts (float values) are averaged over ranks, tuples of
tensors are concatenated element-wise (also in row order), ``None`` stays ``None``, anything else comes back as a
per-rank list. ``call_each(method, args)`` instead gives each rank its own arguments (the hosted engines' shares of
a turn's prompts, ``ragen.trainer.hosted``) and returns the per-rank results.
"""

from __future__ import annotations

import socket
from typing import Any

import torch

from ragen.workers.config import PLACEMENT_STRATEGIES
from ragen.workers.data import TrainBatch, mini_batch_plan
from ragen.workers.placement_check import reserve


def combine(results: list[Any], rows: list[torch.Tensor] | None = None) -> Any:
    """Merge per-rank results (see module docstring); ``rows[r]`` = the batch rows rank r got (None: consecutive
    parts in rank order), so per-row tensors come back in the batch's row order."""
    first = results[0]
    if all(r is None for r in results):
        return None
    if all(isinstance(r, torch.Tensor) for r in results):
        return _in_row_order(torch.cat(results, dim=0), rows)
    if all(isinstance(r, tuple) and r and all(isinstance(x, torch.Tensor) for x in r) for r in results):
        return tuple(_in_row_order(torch.cat(xs, dim=0), rows) for xs in zip(*results, strict=True))
    if all(isinstance(r, dict) for r in results) and all(isinstance(v, (int, float)) for v in first.values()):
        return {k: sum(float(r[k]) for r in results) / len(results) for k in first}
    return results


def _in_row_order(stacked: torch.Tensor, rows: list[torch.Tensor] | None) -> torch.Tensor:
    """Rank-ordered rows (rank 0's rows, then rank 1's ...) put back at their batch positions."""
    if rows is None:
        return stacked
    order = torch.cat(rows)
    out = torch.empty_like(stacked)
    out[order.to(stacked.device)] = stacked
    return out


def _split(batch: TrainBatch | None, world_size: int,
           mini_batch_size: int | None = None) -> tuple[list[TrainBatch | None], list[torch.Tensor] | None]:
    """(one part per rank, the batch rows of each part) with ``mini_batch_plan`` (prompt order, mini-batch first)."""
    if batch is None:
        return [None] * world_size, None
    if batch.batch_size % world_size:
        raise ValueError(f"batch of {batch.batch_size} sequences cannot be split evenly over {world_size} ranks; "
                         f"make the train batch size (after rollout filtering) a multiple of {world_size}")
    rows = mini_batch_plan(batch, world_size, mini_batch_size)
    if world_size == 1 and torch.equal(rows[0], torch.arange(batch.batch_size)):
        return [batch], None  # already in plan order: no copy
    return [batch.select(r) for r in rows], rows


def _call_args(part: TrainBatch | None) -> tuple:
    return () if part is None else (part,)


class LocalWorkerGroup:
    """In-process group of exactly one worker (world size 1, no Ray, no process group)."""

    def __init__(self, worker_cls: type, world_size: int = 1, **init_kwargs: Any):
        if world_size != 1:
            raise ValueError(f"LocalWorkerGroup runs world_size=1 only (got {world_size}); use WorkerGroup")
        init_kwargs.pop("resources_per_worker", None)
        init_kwargs.pop("placement_group", None)
        self.world_size = 1
        self.mini_batch_size = init_kwargs.pop("mini_batch_size", None) or getattr(init_kwargs.get("cfg"),
                                                                                      "mini_batch_size", None)
        self.worker = worker_cls(rank=0, world_size=1, **init_kwargs)

    def call(self, method: str, batch: TrainBatch | None = None, **kw: Any) -> Any:
        """Run ``method(batch, **kw)`` (or ``method(**kw)`` without a batch) on the worker, the batch's rows in the
        plan order of :class:`WorkerGroup` (per-row results come back in the batch's order)."""
        parts, rows = _split(batch, 1, self.mini_batch_size)
        return combine([getattr(self.worker, method)(*_call_args(parts[0]), **kw)], rows)

    def call_rank0(self, method: str, *args: Any, **kw: Any) -> Any:
        return getattr(self.worker, method)(*args, **kw)

    def call_each(self, method: str, args: list[tuple | None]) -> list[Any]:
        """``WorkerGroup.call_each`` for the one rank: ``args[0]`` (None: not called, result None)."""
        _check_each(args, 1)
        return [None if args[0] is None else getattr(self.worker, method)(*args[0])]

    def shutdown(self) -> None:
        self.worker = None


def _free_port() -> tuple[str, int]:
    """(this node's IP, a currently free TCP port)."""
    import ray

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return ray.util.get_node_ip_address(), s.getsockname()[1]


# ---------------------------------------------------------------------------- worker failures
CALL_KNOB = "trainer.worker_call_timeout_s"
START_KNOB = "trainer.worker_start_timeout_s"


class WorkerFailure(RuntimeError):
    """A remote worker died (its process was killed, crashed or was lost with its node) or did not answer within
    its timeout; the message names the worker (role and rank, or the rollout engine) and the method."""


def remote_get(refs: Any, who: str, method: str, timeout_s: float | None, knob: str = CALL_KNOB,
               wait_s: float | None = None) -> Any:
    """The one blocking ``ray.get`` of the package (a grep test keeps it so): wait at most ``timeout_s`` seconds
    (None or <= 0 = no limit; ``wait_s``, when given, is what is left of that budget) for ``refs`` (one object
    ref or a list). A dead actor or the timeout raises :class:`WorkerFailure` naming ``who`` (e.g. ``actor worker
    rank 1``, ``rollout engine``), ``method`` and the config key ``knob`` that sets the timeout, instead of
    hanging or surfacing a raw Ray error. Exceptions raised by the remote code itself propagate unchanged."""
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError

    limit = None if timeout_s is None or timeout_s <= 0 else (timeout_s if wait_s is None else max(wait_s, 1e-3))
    try:
        return ray.get(refs, timeout=limit)
    except RayActorError as exc:
        raise WorkerFailure(f"{who} died during {method}() "
                            f"({type(exc).__name__}: {str(exc).splitlines()[0][:300]})") from exc
    except GetTimeoutError as exc:
        raise WorkerFailure(f"{who} did not finish {method}() within {knob}={timeout_s:g} s "
                            "(hung or too slow)") from exc


def get_results(refs: list, role: str, method: str, timeout_s: float | None, knob: str = CALL_KNOB,
                ranks: list[int] | None = None) -> list:
    """The per-rank results of one call (:func:`remote_get` rank by rank, one deadline of ``timeout_s`` seconds
    shared by all ranks), so a failure names ``role`` and the rank (``ranks[i]`` for ``refs[i]``; default i)."""
    import time

    deadline = None if timeout_s is None or timeout_s <= 0 else time.monotonic() + timeout_s
    ranks = list(range(len(refs))) if ranks is None else ranks
    return [remote_get(ref, f"{role} worker rank {rank}", method, timeout_s, knob,
                       None if deadline is None else deadline - time.monotonic())
            for rank, ref in zip(ranks, refs, strict=True)]


def _check_each(args: list, world_size: int) -> None:
    if len(args) != world_size:
        raise ValueError(f"call_each needs one argument tuple (or None) per rank: {world_size}, got {len(args)}")


class WorkerGroup:
    """``world_size`` Ray actors of ``worker_cls`` (constructed as ``worker_cls(rank=r, world_size=W,
    master_addr=..., master_port=..., **init_kwargs)``), one placement-group bundle each.

    ``resources_per_worker``: Ray resources of one rank, e.g. ``{"CPU": 1}`` (default) or ``{"GPU": 1, "CPU": 4}``.
    ``mini_batch_size``: the global mini-batch size batches are sharded by (default: ``init_kwargs["cfg"]``'s).
    ``placement_group``: an existing Ray placement group with >= world_size bundles (e.g. to co-locate the actor
    and critic groups); by default the group creates and owns one with ``placement_strategy`` (Ray's PACK / SPREAD /
    STRICT_PACK / STRICT_SPREAD), waiting at most ``placement_timeout_s`` for it. Ray must already be initialised
    (``ray.init(...)``) by the driver. ``call_timeout_s``: seconds a ``call`` / ``call_rank0`` may take (None = no
    limit); a dead rank or a timeout raises :class:`WorkerFailure` naming ``label`` (default: the init kwarg
    ``role``, else the class name; ``role`` itself goes to the workers' constructors). ``ready_timeout_s``:
    seconds the ranks may take to start (construct and answer a ping; ``trainer.worker_start_timeout_s``).
    """

    def __init__(self, worker_cls: type, world_size: int, *, resources_per_worker: dict | None = None,
                 placement_group: Any = None, ready_timeout_s: float | None = 600.0, mini_batch_size: int | None = None,
                 call_timeout_s: float | None = None, label: str | None = None, placement_strategy: str = "PACK",
                 placement_timeout_s: float = 300.0, **init_kwargs: Any):
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if world_size < 1:
            raise ValueError(f"world_size={world_size} must be >= 1")
        if not ray.is_initialized():
            raise RuntimeError("WorkerGroup needs Ray: call ray.init() (or set RAY_ADDRESS) before creating it")
        self.world_size = world_size
        self.call_timeout_s = call_timeout_s
        self.role = label or init_kwargs.get("role") or worker_cls.__name__
        self.mini_batch_size = mini_batch_size or getattr(init_kwargs.get("cfg"), "mini_batch_size", None)
        res = dict(resources_per_worker or {"CPU": 1})
        self._owns_pg = placement_group is None
        if placement_strategy not in PLACEMENT_STRATEGIES:
            raise ValueError(f"placement_strategy={placement_strategy!r} is unknown; use one of "
                             f"{', '.join(PLACEMENT_STRATEGIES)}")
        self.placement_group = placement_group or reserve(
            f"{self.role} worker group", [dict(res) for _ in range(world_size)], placement_strategy,
            placement_timeout_s)

        def strategy(i: int) -> PlacementGroupSchedulingStrategy:
            return PlacementGroupSchedulingStrategy(self.placement_group, placement_group_bundle_index=i)

        port_ref = ray.remote(num_cpus=0)(_free_port).options(scheduling_strategy=strategy(0)).remote()
        addr, port = remote_get(port_ref, f"{self.role} worker group (bundle 0)", "free_port", ready_timeout_s,
                                START_KNOB)
        extra = {k: v for k, v in res.items() if k not in ("CPU", "GPU")}
        remote_cls = ray.remote(worker_cls)
        self.workers = [
            remote_cls.options(num_cpus=res.get("CPU", 0), num_gpus=res.get("GPU", 0), resources=extra or None,
                               scheduling_strategy=strategy(r)).remote(
                rank=r, world_size=world_size, master_addr=addr, master_port=port, **init_kwargs)
            for r in range(world_size)
        ]
        try:
            get_results([w.ping.remote() for w in self.workers], self.role, "ping", ready_timeout_s, START_KNOB)
        except WorkerFailure:
            self.shutdown()  # no half-started group left holding its placement group
            raise

    def location(self) -> list[dict[str, Any]]:
        """Where each rank runs: ``{"rank", "node_id", "host", "pid"}`` per rank (``ragen.utils.process.location``)."""
        return get_results([w.location.remote() for w in self.workers], self.role, "location", self.call_timeout_s)

    def call(self, method: str, batch: TrainBatch | None = None, **kw: Any) -> Any:
        """Run ``method`` on every rank (rank r gets its share of every global mini-batch of ``batch``) and combine
        the results (per-row tensors back in ``batch``'s row order)."""

        parts, rows = _split(batch, self.world_size, self.mini_batch_size)
        refs = [getattr(w, method).remote(*_call_args(p), **kw) for w, p in zip(self.workers, parts, strict=True)]
        return combine(get_results(refs, self.role, method, self.call_timeout_s), rows)

    def call_rank0(self, method: str, *args: Any, **kw: Any) -> Any:
        """Run ``method`` on every rank (collectives such as ``full_state_dict`` need all ranks) and return
        rank 0's result."""

        refs = [getattr(w, method).remote(*args, **kw) for w in self.workers]
        return get_results(refs, self.role, method, self.call_timeout_s)[0]

    def call_each(self, method: str, args: list[tuple | None]) -> list[Any]:
        """Run ``method(*args[r])`` on each rank r at once, each rank with its own arguments (None: rank r is not
        called); returns the results in rank order (None for ranks not called). Not for collectives: the ranks
        called need not be all of them."""
        _check_each(args, self.world_size)
        refs = {r: getattr(w, method).remote(*a) for r, (w, a) in enumerate(zip(self.workers, args, strict=True))
                if a is not None}
        got = get_results(list(refs.values()), self.role, method, self.call_timeout_s, ranks=list(refs))
        results: list[Any] = [None] * self.world_size
        for r, value in zip(refs, got, strict=True):
            results[r] = value
        return results

    def shutdown(self) -> None:
        """Kill the actors and release the placement group this group created."""
        import ray
        from ray.util.placement_group import remove_placement_group

        for w in self.workers:
            ray.kill(w)
        self.workers = []
        if self._owns_pg and self.placement_group is not None:
            remove_placement_group(self.placement_group)
            self.placement_group = None
