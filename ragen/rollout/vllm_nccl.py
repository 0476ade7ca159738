"""Weight sync over NCCL for a vLLM engine on GPUs of its own (``rollout.vllm.placement=separate``).

Written against vLLM 0.32.0 (``vllm.distributed.utils.StatelessProcessGroup``,
``vllm.distributed.device_communicators.pynccl.PyNcclCommunicator``). The actor's rank 0 (sender, group rank 0) and
the engine's tensor-parallel workers (group ranks 1..tp) form one NCCL group outside both sides' own process
groups. A sync sends the same buckets as the colocated path (``vllm_engine.weight_buckets``), but only their
metadata travels through Ray / vLLM's RPC; the tensors themselves are broadcast GPU to GPU:

    engine.ragen_begin_weight_update
    for each bucket:  engine workers  ragen_receive_bucket(meta)   (allocate, receive, load_weights)
                      actor rank 0    broadcast the bucket's tensors, in meta order       -- both in flight at once
    engine.ragen_finish_weight_update, reset_prefix_cache

``sync_over_nccl`` is the driver's side of this protocol and is tested with fakes that record the calls and their
order (no GPU here). ``NcclWeightSender`` runs on the actor's rank 0 and ``NcclReceiverMixin`` in the engine's
workers (mixed into ``vllm_worker.WeightLoaderExtension``); both need CUDA and are exercised only on GPUs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

TensorMeta = tuple[str, str, tuple[int, ...]]  # (name, dtype name, shape)


@dataclass(frozen=True)
class BucketPlan:
    """The buckets of one sync: ``buckets[i]`` lists the (name, dtype, shape) broadcast in bucket i, in order."""

    buckets: tuple[tuple[TensorMeta, ...], ...]


def plan_buckets(metas: Iterable[TensorMeta], bucket_bytes: int) -> BucketPlan:
    """Group tensor metadata into buckets of at most ``bucket_bytes`` (a larger tensor gets its own bucket)."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    out: list[tuple[TensorMeta, ...]] = []
    bucket: list[TensorMeta] = []
    size = 0
    for name, dtype, shape in metas:
        numel = 1
        for d in shape:
            numel *= int(d)
        nbytes = numel * torch.empty((), dtype=getattr(torch, dtype)).element_size()
        if bucket and size + nbytes > bucket_bytes:
            out.append(tuple(bucket))
            bucket, size = [], 0
        bucket.append((name, dtype, tuple(int(d) for d in shape)))
        size += nbytes
    if bucket:
        out.append(tuple(bucket))
    return BucketPlan(tuple(out))


def sync_over_nccl(engine_rpc: Callable[..., Any], sender_call: Callable[..., Any], plan: BucketPlan,
                   wait: Callable[[list[Any]], Any], reset_prefix_cache: Callable[[], Any]) -> int:
    """Drive one NCCL weight sync; returns the number of tensors sent.

    ``engine_rpc(method, *args)`` starts a call on every engine worker and returns a handle without waiting
    (e.g. a Ray ref of the engine actor's ``collective_rpc``); ``sender_call(method, *args)`` does the same on
    the actor's rank 0; ``wait(handles)`` waits for all. The receive and the broadcast of one bucket must both be
    in flight before either is waited on (a collective), and bucket i finishes before bucket i + 1 starts, so at
    most one bucket is allocated on each side.
    """
    wait([engine_rpc("ragen_begin_weight_update")])
    sent = 0
    for index, metas in enumerate(plan.buckets):
        receive = engine_rpc("ragen_receive_bucket", list(metas))
        send = sender_call("broadcast_bucket", index)
        wait([receive, send])
        sent += len(metas)
    wait([engine_rpc("ragen_finish_weight_update")])
    reset_prefix_cache()
    return sent


class NcclWeightSender:
    """The actor's rank 0 side: joins the group as rank 0 and broadcasts planned buckets from a state dict."""

    def __init__(self, host: str, port: int, world_size: int, device: torch.device):
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
        from vllm.distributed.utils import StatelessProcessGroup

        group = StatelessProcessGroup.create(host=host, port=port, rank=0, world_size=world_size)
        self.comm = PyNcclCommunicator(group, device=device)
        self.device = device

    def broadcast_bucket(self, state: dict[str, torch.Tensor], metas: Iterable[TensorMeta]) -> None:
        """Broadcast the tensors of one bucket (cast to the planned dtype, on this GPU) in plan order."""
        for name, dtype, _ in metas:
            tensor = state[name].to(device=self.device, dtype=getattr(torch, dtype)).contiguous()
            self.comm.broadcast(tensor, src=0)
        torch.cuda.current_stream().synchronize()


class NcclReceiverMixin:
    """Engine-worker side (mixed into the vLLM worker through ``WeightLoaderExtension``)."""

    device: Any
    _ragen_comm: Any = None

    def ragen_init_weight_group(self, host: str, port: int, rank_offset: int, world_size: int) -> None:
        """Join the sync group as rank ``rank_offset + tensor-parallel rank`` (the sender is rank 0)."""
        from vllm.distributed import get_tensor_model_parallel_rank
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
        from vllm.distributed.utils import StatelessProcessGroup

        rank = rank_offset + get_tensor_model_parallel_rank()
        group = StatelessProcessGroup.create(host=host, port=port, rank=rank, world_size=world_size)
        self._ragen_comm = PyNcclCommunicator(group, device=self.device)

    def ragen_receive_bucket(self, metas: list[TensorMeta]) -> int:
        """Receive one bucket's broadcasts into fresh tensors and load them (between begin / finish)."""
        if self._ragen_comm is None:
            raise RuntimeError("ragen_init_weight_group must run before ragen_receive_bucket")
        tensors = []
        for name, dtype, shape in metas:
            t = torch.empty(tuple(shape), dtype=getattr(torch, dtype), device=self.device)
            self._ragen_comm.broadcast(t, src=0)
            tensors.append((name, t))
        torch.cuda.current_stream().synchronize()
        self._ragen_model().load_weights(weights=iter(tensors))  # type: ignore[attr-defined]
        return len(tensors)
