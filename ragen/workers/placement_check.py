"""Reserve a Ray placement group, or fail fast naming what the cluster lacks (scale-out).

``placement_group(...).wait()`` blocks for as long as the cluster cannot satisfy the bundles; on a cluster that is
one node short a run would hang there with no word. :func:`reserve` waits at most ``timeout_s`` seconds, then
removes the pending group and raises :class:`PlacementError` with :func:`shortfall_message`: the bundles asked
for, the strategy, the cluster's free resources, each alive node's resources and which of them are short.

:func:`shortfall_message` is a pure function over the dicts Ray returns (``ray.nodes()``,
``ray.available_resources()``), so its wording is tested without a cluster.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class PlacementError(RuntimeError):
    """The cluster could not reserve a placement group within the timeout; the message names what is missing."""


def _fmt(res: dict[str, float]) -> str:
    """``{CPU: 1, GPU: 0.5, node_a: 1}``, Ray's bookkeeping keys (``node:<ip>``, ``memory`` ...) left out."""
    shown = {k: v for k, v in sorted(res.items()) if not _internal(k)}
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in shown.items()) + "}"


def _internal(key: str) -> bool:
    return key.startswith("node:") or key in ("memory", "object_store_memory") or key.startswith("accelerator_type")


def _fits(bundle: dict[str, float], res: dict[str, float]) -> bool:
    return all(res.get(k, 0.0) + 1e-9 >= v for k, v in bundle.items())


def shortfall_message(label: str, bundles: list[dict[str, float]], strategy: str, nodes: list[dict[str, Any]],
                      available: dict[str, float], timeout_s: float) -> str:
    """Why ``bundles`` could not be placed: what was asked, what is free, what each node has and lacks.

    ``nodes``: ``ray.nodes()`` records (``NodeID``, ``Alive``, ``NodeManagerAddress``, ``Resources`` = the node's
    total resources); ``available``: ``ray.available_resources()`` (free now, the whole cluster).
    """
    same = all(b == bundles[0] for b in bundles)
    asked = (f"{len(bundles)} bundles of {_fmt(bundles[0])}" if same
             else f"bundles {', '.join(_fmt(b) for b in bundles)}")
    total: dict[str, float] = {}
    for b in bundles:
        for k, v in b.items():
            total[k] = total.get(k, 0.0) + v
    short = [f"{k}: needs {v:g}, {available.get(k, 0.0):g} free" for k, v in sorted(total.items())
             if available.get(k, 0.0) + 1e-9 < v]
    alive = [n for n in nodes if n.get("Alive", True)]
    fitting = [n for n in alive if _fits(bundles[0], n.get("Resources", {}))]
    reasons = []
    if short:
        reasons.append("short of " + "; ".join(short))
    if strategy == "STRICT_SPREAD" and len(fitting) < len(bundles):
        reasons.append(f"STRICT_SPREAD needs {len(bundles)} nodes that each fit one bundle, {len(fitting)} do")
    if strategy == "STRICT_PACK" and not any(_fits(total, n.get("Resources", {})) for n in alive):
        reasons.append(f"STRICT_PACK needs one node with {_fmt(total)}, none has it")
    if not reasons:
        reasons.append("the free resources are split over nodes so that no bundle fits, or other work holds them")
    listing = "; ".join(f"{str(n.get('NodeID', '?'))[:12]} ({n.get('NodeManagerAddress', '?')}): "
                        f"{_fmt(n.get('Resources', {}))}" for n in alive) or "none alive"
    return (f"{label} needs {asked} (placement strategy {strategy}) but the Ray cluster could not reserve them "
            f"within {timeout_s:g} s: {', '.join(reasons)}. Cluster has {_fmt(available)} free; "
            f"{len(alive)} alive node(s): {listing}. Add nodes / resources, lower the world size or "
            f"trainer.cpus_per_worker, or change trainer.placement_strategy (a longer trainer.placement_timeout_s "
            f"helps while an autoscaler adds nodes).")


def reserve(label: str, bundles: list[dict[str, float]], strategy: str, timeout_s: float,
            make_pg: Callable[..., Any] | None = None) -> Any:
    """A ready placement group of ``bundles`` with ``strategy``, or :class:`PlacementError` after ``timeout_s``
    seconds (the pending group is removed first, so nothing stays queued in the cluster).

    ``make_pg(bundles, strategy=...)`` defaults to ``ray.util.placement_group``; a returned object without a
    ``wait`` method (a test fake) is taken as ready.
    """
    import ray
    from ray.util.placement_group import remove_placement_group

    if make_pg is None:
        from ray.util.placement_group import placement_group as make_pg
    pg = make_pg(bundles, strategy=strategy)
    if not hasattr(pg, "wait") or pg.wait(timeout_seconds=timeout_s):
        return pg
    remove_placement_group(pg)
    raise PlacementError(shortfall_message(label, bundles, strategy, ray.nodes(), ray.available_resources(),
                                           timeout_s))
