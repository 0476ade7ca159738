"""Device, process group and FSDP2 setup shared by the workers.

Sharding: with world size > 1 every decoder layer is its own FSDP2 unit (``fully_shard``), then the root
(embeddings, final norm, lm_head / value head), so only one layer's full weights exist at a time. World size
1 takes a documented no-shard path: the plain module, no process group, identical maths (the world size
2 == 1 test checks the sharded path against it).

Mixed precision (``"bf16"``): bf16 compute with fp32 master weights, gradients and AdamW state.
  - GPU + sharded: FSDP2 ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``.
  - CPU (and unsharded GPU): ``torch.autocast(device, bfloat16)`` around forward. FSDP2's policy also works
    with gloo, but on a 2-core AVX512-BF16 CPU (SmolLM2-135M, 4 x 512 tokens, one rank) its all-bf16
    step measured 29 s (backward 21 s) against 11 s (backward 4 s) with autocast (bf16 matmuls, fp32
    elementwise ops and gradients).
``"fp32"`` runs everything in fp32 (CPUs without native bf16, tests, debugging).
``"auto"`` (the config default) is resolved here, on the worker's own device, by
``ragen.utils.hardware.resolve_precision``: bf16 where the device computes it natively, else fp32 (an AVX2-only
CPU emulates bf16 matmuls ~60x slower than fp32).
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn

from ragen.utils.hardware import resolve_precision


def init_distributed(rank: int, world_size: int, master_addr: str = "127.0.0.1", master_port: int = 29500,
                     backend: str | None = None, device: str | None = None) -> torch.device:
    """Pick this rank's device and, for world size > 1, join the process group; returns the device.

    ``device``: the run's ``trainer.device`` as resolved by the trainer (``ragen.trainer.config.run_shape.device``):
    ``cpu`` computes on the CPU even where CUDA is visible, ``cuda`` on the first visible CUDA device (Ray sets
    CUDA_VISIBLE_DEVICES per actor; no CUDA visible is an error). None (direct users): the first visible CUDA
    device when there is one, else CPU. Backend: ``backend`` or nccl on GPU / gloo on CPU. Idempotent (an existing
    group is reused).
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"bad rank/world size: rank={rank}, world_size={world_size}")
    if device not in (None, "cpu", "cuda"):
        raise ValueError(f"device={device!r} is unknown; use 'cpu', 'cuda' or None (CUDA when visible)")
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("this worker was placed for trainer.device=cuda but sees no CUDA device "
                           f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}); "
                           "set trainer.device=cpu or give the workers GPUs")
    use_cuda = device == "cuda" or (device is None and torch.cuda.is_available())
    chosen = torch.device("cuda", 0) if use_cuda else torch.device("cpu")
    if chosen.type == "cuda":
        torch.cuda.set_device(chosen)
    if world_size > 1 and not dist.is_initialized():
        backend = backend or ("nccl" if chosen.type == "cuda" else "gloo")
        os.environ.setdefault("MASTER_ADDR", master_addr)
        os.environ.setdefault("MASTER_PORT", str(master_port))
        dist.init_process_group(backend, init_method=f"tcp://{master_addr}:{master_port}", rank=rank,
                                world_size=world_size, timeout=datetime.timedelta(minutes=30))
    return chosen


def is_sharded() -> bool:
    """True when running under a process group of more than one rank."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def shard_model(model: nn.Module, layers: Iterable[nn.Module], *, device: torch.device,
                mixed_precision: str = "auto") -> nn.Module:
    """Place ``model`` on ``device`` and, when sharded, apply FSDP2 to each of ``layers`` then the root.

    A model built on the host is moved to ``device`` in fp32 (master weights) before sharding. A model built on
    the meta device (``ragen.models.meta``) keeps its dtypes and is sharded first, then only this rank's shards
    are allocated on ``device`` (``to_empty``; world size 1: the whole model, once): its values are uninitialised
    until the caller loads them (``ragen.workers.materialize``). Tied parameters stay one parameter.
    On GPU with ``mixed_precision`` resolving to bf16 the FSDP2 policy casts the parameters to bf16 for compute;
    elsewhere ``compute_autocast`` provides bf16 compute.
    """
    on_meta = any(p.is_meta for p in model.parameters())
    if not on_meta:
        model.to(device=device, dtype=torch.float32)
    ties = _tied_parameters(model)
    if is_sharded():
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy()
        if resolve_precision(mixed_precision, device)[0] == "bf16" and device.type == "cuda":
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in layers:
            fully_shard(layer, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
    if on_meta:
        model.to_empty(device=device)
        for (owner, name), *others in ties:  # to_empty gives each module attribute a parameter of its own
            for module, attr in others:
                if getattr(module, attr) is not getattr(owner, name):
                    setattr(module, attr, getattr(owner, name))
    return model


def _tied_parameters(model: nn.Module) -> list[list[tuple[nn.Module, str]]]:
    """The (module, attribute) places of every parameter that several module attributes share (tied embeddings)."""
    places: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None:
                places.setdefault(id(p), []).append((module, name))
    return [group for group in places.values() if len(group) > 1]


def compute_autocast(device: torch.device, mixed_precision: str) -> contextlib.AbstractContextManager:
    """The autocast context for forward passes: bf16 autocast when ``mixed_precision`` resolves to bf16 on
    ``device`` (``auto``: native bf16 only), unless FSDP2's GPU policy already casts."""
    if resolve_precision(mixed_precision, device)[0] != "bf16" or (device.type == "cuda" and is_sharded()):
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    """Sum a few scalars over ranks (identity when unsharded)."""
    if not is_sharded():
        return [float(v) for v in values]
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def all_reduce_max(value: float, device: torch.device) -> float:
    """The largest of one scalar over ranks (identity when unsharded)."""
    if not is_sharded():
        return float(value)
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def all_reduce_mean(values: dict[str, float], device: torch.device) -> dict[str, float]:
    """Average a metric dict over ranks (every rank must pass the same keys)."""
    keys = sorted(values)
    sums = all_reduce_sum([values[k] for k in keys], device)
    n = dist.get_world_size() if is_sharded() else 1
    return {k: s / n for k, s in zip(keys, sums, strict=True)}


def clip_grad_norm(params: list[nn.Parameter], max_norm: float | None) -> float:
    """Global L2 grad norm over all ranks' shards; clips in place when ``max_norm`` is set. Returns the norm."""
    grads = [p for p in params if p.grad is not None]
    if not grads:
        return 0.0
    norm = torch.nn.utils.clip_grad_norm_(grads, max_norm if max_norm is not None else float("inf"))
    if hasattr(norm, "full_tensor"):  # DTensor under FSDP2
        norm = norm.full_tensor()
    return float(norm)


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Full (unsharded) CPU state dict on rank 0, in the parameters' dtype (fp32 master weights; a bf16 reference's
    bf16); other ranks get ``{}`` (all ranks must call)."""
    if not is_sharded():
        return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_full_state_dict(model: nn.Module, state: dict[str, torch.Tensor], strict: bool = True) -> None:
    """Load a full state dict (every rank passes the same dict) into a plain or sharded model; ``strict=False``
    leaves the parameters ``state`` does not name as they are (e.g. LoRA adapters when loading a plain model)."""
    if not is_sharded():
        model.load_state_dict(state, strict=strict)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, strict=strict))


def optimizer_full_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer state keyed by parameter names, unsharded, on rank 0 ({} elsewhere; all ranks call)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_optimizer_state_dict(model, optimizer, options=opts)


def load_optimizer_full_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Inverse of ``optimizer_full_state`` (every rank passes the full state); any world size."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))


def reshard(module: nn.Module) -> None:
    """Free FSDP2's unsharded parameters (the root keeps them after a forward without backward), so that
    ``module.parameters()`` are the sharded DTensors and nothing else of the module holds the full weights; a no-op
    on an unsharded module."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return
    for m in module.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def barrier() -> None:
    if is_sharded():
        dist.barrier()


def destroy() -> None:
    """Leave the process group (no-op when unsharded)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
