"""A rollout engine living inside an actor rank's process (the hybrid engine), and its weight sync.

With ``rollout.engine`` ``hf``, or ``vllm`` placed ``colocated``, every actor rank hosts one engine replica on its
own device (tensor parallel size 1); the driver splits each turn's prompts over them
(``ragen.trainer.hosted.HostedEngines``). ``PolicyWorker`` holds an :class:`EngineHost` (composed, not inherited)
and exposes it through thin methods (``engine_generate``, ``engine_sleep``, ``engine_wake``,
``sync_engine_weights``).

Order: the host is built first in the worker's constructor, right after the process group, and put to sleep before
the training model and optimizer exist (vLLM sizes its KV cache from the free device memory it finds when it starts,
and refuses to start when ``gpu_memory_utilization`` of the device is not free).

Weight sync, never through the driver: every actor rank takes part (gathering an FSDP2-sharded parameter,
``DTensor.full_tensor()``, is a collective), parameters are gathered one at a time in state-dict order
(:func:`gathered`), LoRA merged per module and the value head left out
(``ragen.workers.lora.merge_lora_stream``), cast to the engine's dtype, and handed to the rank's own engine as a lazy
stream: the ``hf`` engine copies each tensor into its model as it arrives; vLLM groups the stream into buckets of
``bucket_bytes`` and loads each in place (``ragen.rollout.vllm_engine``). No full state dict is built, and the driver
gets back a :class:`SyncSummary` of three numbers.

vLLM runs in-process here (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set while it is built): weights are then handed to
its worker as tensors. One rank: vLLM's uniprocess executor, which starts a process group of one. Several ranks: the
ranks already form the trainer's process group, so each engine is started with vLLM's ``external_launcher`` executor
(the uniprocess executor that joins an existing group: ``RANK`` / ``LOCAL_RANK`` say where it sits), each rank its
own data-parallel replica.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class EngineSpec:
    """What a hosting rank builds: engine ``name`` (``hf`` or ``vllm``, ``ragen.rollout.make_engine``) with the
    constructor keyword arguments ``kwargs`` (``device`` is the rank's own, filled in by the host)."""

    name: str
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SyncSummary:
    """One rank's weight sync: tensors and bytes handed to its engine (at the engine's dtype), and seconds taken."""

    tensors: int
    bytes: int
    seconds: float

    def as_metrics(self) -> dict[str, float]:
        return {"tensors": float(self.tensors), "bytes": float(self.bytes), "seconds": self.seconds}


def gathered(state: Mapping[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) of every entry of a state dict, one at a time: an FSDP2 DTensor is gathered with
    ``full_tensor()`` (a collective: every rank must iterate the same state in the same order), a plain tensor is
    passed as it is, detached. A tied lm_head is sent under its own name too (gathered again rather than kept):
    vLLM's in-place reload restores a layer that received nothing from its old tensors."""
    for name, tensor in state.items():
        full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
        yield name, full.detach()


def cast_stream(items: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype,
                device: torch.device | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Floating tensors cast to ``dtype`` (others as they are), moved to ``device`` when given."""
    for name, t in items:
        yield name, t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)


@contextlib.contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with ``values`` set inside, restored afterwards (an in-process worker shares the driver's)."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def vllm_environ(rank: int, world_size: int) -> dict[str, str]:
    """Environment for building a hosted vLLM engine: in-process engine core; with several ranks, where this one
    sits in the existing process group (read by the ``external_launcher`` executor; each rank sees one device)."""
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    if world_size > 1:
        env.update({"RANK": str(rank), "LOCAL_RANK": "0"})
    return env


def engine_kwargs_for(spec: EngineSpec, device: torch.device, world_size: int) -> dict[str, Any]:
    """``spec.kwargs`` with this rank's device (``cuda`` means the rank's own GPU), and for vLLM on several ranks
    the executor that joins the ranks' process group."""
    from ragen.rollout.registry import engine_entry

    kwargs = {**spec.kwargs, "device": str(device) if engine_entry(spec.name).device_index else device.type}
    if spec.name == "vllm" and world_size > 1:
        kwargs["distributed_executor_backend"] = "external_launcher"
    return kwargs


class EngineHost:
    """One rollout engine in this process.

    ``make(name, **kwargs)`` builds the engine (default ``ragen.rollout.make_engine``; tests pass fakes). The engine
    is put to sleep at once (``sleep`` frees memory where the engine can: vLLM sleep mode, the hf engine on a GPU), so
    the caller builds its training model next; the first weight sync wakes it. The engine keeps its own sleep state
    (``ragen.rollout.base.SleepState``: ``asleep``, the parts still asleep; a wake brings back only what is asleep,
    so waking twice is harmless and a restart or a resume can always ``ensure_awake``); the host asks it before a
    generate or a weight load.
    """

    def __init__(self, spec: EngineSpec, device: torch.device, rank: int = 0, world_size: int = 1,
                 make: Any = None):
        if make is None:
            from ragen.rollout import make_engine as make
        from ragen.rollout.registry import engine_entries, engine_entry

        if not engine_entry(spec.name).hosted:
            hosted = [e.name for e in engine_entries() if e.hosted]
            raise ValueError(f"engine {spec.name!r} cannot be hosted by a worker; use one of {', '.join(hosted)}")
        kwargs = engine_kwargs_for(spec, device, world_size)
        env = vllm_environ(rank, world_size) if spec.name == "vllm" else {}
        with _environ(env):
            self.engine = make(spec.name, **kwargs)
        self.dtype = _engine_dtype(self.engine, kwargs.get("dtype", "float32"))
        self.device = device
        self.sleep()

    @property
    def asleep(self) -> frozenset[str]:
        """The engine's parts asleep now (the engine's own record)."""
        return self.engine.asleep

    def generate(self, prompts: list[list[int]], sampling: Any) -> list[Any]:
        """The engine's samples for ``prompts`` (in order); the engine must be awake."""
        if self.asleep:
            raise RuntimeError(f"the hosted engine is asleep ({', '.join(sorted(self.asleep))}); wake it (or sync "
                               "its weights) before generating")
        return self.engine.generate(prompts, sampling)

    def sleep(self) -> None:
        """Free the engine's memory for training (weights and KV cache)."""
        self.engine.sleep()

    def wake(self, tags: Iterable[str] | None = None) -> None:
        """Bring back ``tags`` (None = all) of what is asleep; parts already awake are left alone (by the engine)."""
        self.engine.wake(None if tags is None else tuple(tags))

    def ensure_awake(self) -> None:
        self.wake(None)

    def load_weights(self, items: Iterable[tuple[str, torch.Tensor]]) -> SyncSummary:
        """Hand the (name, tensor) stream to the engine's ``update_weights`` at the engine's dtype (a hf engine on
        this rank's GPU gets tensors there); counts what passed. The weights must be awake."""
        if "weights" in self.asleep:
            raise RuntimeError("the hosted engine's weights are asleep; wake(('weights',)) before a weight sync")
        start = time.perf_counter()
        counts = {"tensors": 0, "bytes": 0}

        def counted() -> Iterator[tuple[str, torch.Tensor]]:
            for name, t in cast_stream(items, self.dtype):
                counts["tensors"] += 1
                counts["bytes"] += t.numel() * t.element_size()
                yield name, t

        self.engine.update_weights(counted())
        return SyncSummary(counts["tensors"], counts["bytes"], time.perf_counter() - start)


def _engine_dtype(engine: Any, fallback: str | torch.dtype) -> torch.dtype:
    """The dtype the engine holds its weights in (its ``dtype`` attribute, else the one it was asked for)."""
    dtype = getattr(engine, "dtype", None)
    if isinstance(dtype, torch.dtype):
        return dtype
    from ragen.rollout.hf import parse_dtype

    return parse_dtype(fallback)
