"""The actor's rank-0 side of the NCCL weight sync to a separately placed vLLM engine (``ragen.rollout.vllm_nccl``).

Composed into ``PolicyWorker`` (``init_weight_sender`` / ``plan_weight_buckets`` / ``broadcast_bucket``): the plan
step gathers the full weights (all ranks call; a collective) and keeps them on rank 0 until the last bucket is
broadcast, so one sync holds one full copy at most. GPU only; tested through fakes.
"""

from __future__ import annotations

import socket
from typing import Any

import torch

from ragen.rollout.vllm_nccl import BucketPlan, plan_buckets


def free_address() -> tuple[str, int]:
    """(this node's IP, a currently free TCP port) for the sync group's rendezvous (rank 0 hosts it)."""
    import ray

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return ray.util.get_node_ip_address(), s.getsockname()[1]


class WeightBroadcaster:
    """Plans buckets over a full state dict and broadcasts them one at a time with ``sender.broadcast_bucket``."""

    def __init__(self, sender: Any):
        self.sender = sender
        self.state: dict[str, torch.Tensor] | None = None
        self.plan: BucketPlan | None = None

    def make_plan(self, state: dict[str, torch.Tensor], dtype: str, bucket_bytes: int) -> BucketPlan:
        """Floating tensors travel as ``dtype`` (the engine's), others as they are."""
        def meta(name: str, t: torch.Tensor) -> tuple[str, str, tuple[int, ...]]:
            kind = dtype if t.is_floating_point() else str(t.dtype).removeprefix("torch.")
            return name, kind, tuple(t.shape)

        self.state = state
        self.plan = plan_buckets((meta(k, v) for k, v in state.items()), bucket_bytes)
        return self.plan

    def send(self, index: int) -> int:
        """Broadcast bucket ``index``; after the last one the kept weights are released."""
        if self.state is None or self.plan is None:
            raise RuntimeError("plan_weight_buckets must run before broadcast_bucket")
        metas = self.plan.buckets[index]
        self.sender.broadcast_bucket(self.state, metas)
        if index == len(self.plan.buckets) - 1:
            self.state = None
        return len(metas)
