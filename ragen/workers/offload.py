"""Between-phase offload: a worker's parameters, gradients and optimizer state leave the GPU while a colocated
rollout engine is awake, and come back before the phases that use them (``trainer.offload=phase``).

What moves: the storage of every parameter of the module (under FSDP2 the rank's local shard: the DTensor's local
tensor, whose storage is the padded shard FSDP2 all-gathers from), of every gradient that exists (none between
phases: each optimizer step ends with ``zero_grad(set_to_none=True)``), and of every tensor in the optimizer's
state on the device (AdamW's ``exp_avg`` / ``exp_avg_sq``; its ``step`` counters stay on the host, where PyTorch
keeps them). Buffers (rotary tables) are small and stay.

How: each storage is copied byte for byte into a host buffer (pinned on CUDA, so the copies run at full bus speed)
and then resized to zero bytes, which frees its device memory while every tensor viewing it (the parameter, FSDP2's
padded shard, an optimizer-state DTensor) stays the same Python object with the same shape; :meth:`reload` resizes
each storage back and copies the bytes in. Nothing is rebuilt, so optimizer state keys, FSDP2's bookkeeping and
any reference to a parameter stay valid, and the state after a reload is bitwise the state before the offload. (A
plain parameter whose storage cannot be resized, e.g. weights loaded memory-mapped on CPU, first gets memory of its
own, with the same values.)
The host buffers are allocated on the first offload and reused by every later one (one per storage, found again
by the tensor's place: parameter index, or parameter group, index and state key), so host memory does not grow
from step to step: it holds the rank's whole training state, about 4 bytes per parameter of the shard plus 8 for
AdamW's moments.

On a CPU device the host is the device: by default ``offload`` / ``reload`` only record what they would move
(``events``), which keeps the order of the calls visible to tests at no cost; ``host_copies=True`` runs the real
storage moves on CPU too (tests prove with it that a round trip leaves parameters and optimizer state bitwise
equal).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ragen.utils.memory import PHASE_MEMORY, release_cached_memory
from ragen.workers import dist as D

PARTS = ("params", "optimizer")  # "params" carries the gradients with it


@dataclass
class _Slot:
    """One device storage moved to the host: the storage (now zero bytes) and the buffer holding its bytes."""

    storage: torch.UntypedStorage
    host: torch.Tensor  # (nbytes,) uint8, pinned on CUDA


def _bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    """A flat uint8 view of the whole ``storage`` (as many elements as it has bytes)."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def _local(t: torch.Tensor) -> torch.Tensor:
    """The tensor whose storage holds ``t``'s data on this rank: a DTensor's local shard, else ``t``."""
    return t.to_local() if hasattr(t, "to_local") else t


def _own_storage(p: nn.Parameter) -> None:
    """Give a plain parameter whose storage cannot be resized (weights loaded memory-mapped, as on CPU) memory of its
    own, bitwise the same values, so it can be offloaded; device allocations (CUDA, FSDP2's shards) always can."""
    if not p.untyped_storage().resizable() and not hasattr(p, "to_local"):
        with torch.no_grad():
            p.data = p.data.clone()


class StateOffload:
    """Moves a module's parameters (with their gradients) and an optimizer's state between the device and reused
    host buffers (see the module docstring). ``optimizer`` None: parameters only (the frozen reference).
    ``host_copies``: move bytes (default: on CUDA devices only; on CPU the calls are bookkeeping)."""

    def __init__(self, module: nn.Module, optimizer: torch.optim.Optimizer | None, device: torch.device,
                 host_copies: bool | None = None):
        self.module, self.optimizer, self.device = module, optimizer, torch.device(device)
        self.host_copies = self.device.type == "cuda" if host_copies is None else host_copies
        self.events: list[str] = []  # "offload:params", "reload:optimizer", ... in call order
        self._off: dict[str, list[_Slot]] = {}  # part -> its storages now on the host
        self._host: dict[tuple, torch.Tensor] = {}  # host buffers by the tensor's place, reused

    @property
    def offloaded(self) -> tuple[str, ...]:
        """The parts (``PARTS``) off the device now."""
        return tuple(p for p in PARTS if p in self._off)

    def host_bytes(self) -> int:
        """Bytes of host buffers held (allocated once, then reused)."""
        return sum(b.numel() for b in self._host.values())

    def offload(self, params: bool = True, optimizer: bool = True) -> None:
        """Move the chosen parts off the device (parts already off stay off), then release the freed memory
        (``release_cached_memory``). Keeping ``params`` while the optimizer state leaves serves the weight sync,
        which reads the parameters while the engine's weights are awake."""
        parts = [p for p, on in zip(PARTS, (params, optimizer), strict=True) if on and p not in self._off]
        if not parts:
            return
        if self.host_copies:
            D.reshard(self.module)
        for part in parts:
            self.events.append(f"offload:{part}")
            self._off[part] = self._move_out(self._tensors(part)) if self.host_copies else []
        release_cached_memory()

    def reload(self, parts: tuple[str, ...] = PARTS) -> None:
        """Bring the chosen parts back (those on the device already stay as they are)."""
        for part in [p for p in parts if p in self._off]:
            self.events.append(f"reload:{part}")
            for slot in self._off.pop(part):
                slot.storage.resize_(slot.host.numel())
                _bytes(slot.storage).copy_(slot.host, non_blocking=True)
        self._synchronize()

    @contextlib.contextmanager
    def resident(self, optimizer: bool = True) -> Iterator[None]:
        """The state on the device for the block: parts off the device now come back and leave again after
        (``optimizer=False``: the parameters only, for passes that never read the optimizer state)."""
        parts = tuple(p for p in self.offloaded if optimizer or p == "params")
        if not parts:
            yield
            return
        self.reload(parts)
        try:
            yield
        finally:
            self.offload(params="params" in parts, optimizer="optimizer" in parts)

    # ------------------------------------------------------------------------------------------------------------
    def _tensors(self, part: str) -> list[tuple[tuple, torch.Tensor]]:
        """(place, tensor) of every tensor of ``part`` on the device (local shards of DTensors)."""
        out: list[tuple[tuple, torch.Tensor]] = []
        if part == "params":
            for i, p in enumerate(self.module.parameters()):
                _own_storage(p)
                out.append((("param", i), _local(p.detach())))
                if p.grad is not None:
                    out.append((("grad", i), _local(p.grad.detach())))
        elif self.optimizer is not None:
            for g, group in enumerate(self.optimizer.param_groups):
                for i, p in enumerate(group["params"]):
                    for key, value in self.optimizer.state.get(p, {}).items():
                        if isinstance(value, torch.Tensor):
                            out.append((("optim", g, i, key), _local(value.detach())))
        return [(place, t) for place, t in out if t.device.type == self.device.type]

    def _move_out(self, tensors: list[tuple[tuple, torch.Tensor]]) -> list[_Slot]:
        """Copy each distinct storage of ``tensors`` into its host buffer, then free the device copies."""
        slots, seen = [], set()
        with torch.no_grad():
            for place, t in tensors:
                storage = t.untyped_storage()
                if storage.nbytes() == 0 or storage.data_ptr() in seen:  # empty, or shared (tied weights, views)
                    continue
                if not storage.resizable():
                    raise RuntimeError(f"cannot offload {place}: its storage is not resizable (memory mapped or "
                                       "borrowed from another library)")
                seen.add(storage.data_ptr())
                host = self._host_buffer(place, storage.nbytes())
                host.copy_(_bytes(storage), non_blocking=True)
                slots.append(_Slot(storage, host))
        self._synchronize()
        for slot in slots:
            slot.storage.resize_(0)
        return slots

    def _host_buffer(self, place: tuple, nbytes: int) -> torch.Tensor:
        buf = self._host.get(place)
        if buf is None or buf.numel() != nbytes:
            buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.device.type == "cuda")
            self._host[place] = buf
        return buf

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def worker_phase(name: str | None = None, optimizer: bool = True) -> Callable:
    """Decorator of a worker method that uses its module: the method runs with the state on the device (called
    while offloaded, e.g. a validation pass or a checkpoint save between steps, it brings the state back for the
    call and puts it away after: ``StateOffload.resident``; ``optimizer=False`` for passes that only read the
    parameters). With ``name`` the call is a phase of the step: its memory peak is recorded in this process's
    ``PHASE_MEMORY`` as ``<worker role>_<name>`` and the cached memory is released after it. The worker provides
    ``role`` and ``state_offload()``."""

    def decorate(method: Callable) -> Callable:
        @functools.wraps(method)
        def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            phase = f"{self.role}_{name}" if name else None
            with self.state_offload().resident(optimizer=optimizer), PHASE_MEMORY.measure(phase):
                result = method(self, *args, **kwargs)
                if name:
                    release_cached_memory()  # before the phase's end: its RSS is what it leaves behind
            return result

        return run

    return decorate
