"""Code that runs inside vLLM's worker processes: the weight-loading extension of the ``vllm`` engine.

vLLM (written against 0.32.0) builds its workers from ``LLM(worker_extension_cls="<module>.<class>")``: the class
is mixed into every worker, so ``LLM.collective_rpc("<method>", args=...)`` runs its methods there, next to the
model. This replaces passing a lambda to ``LLM.apply_model``, which vLLM's multiprocess engine refuses to serialise
(and, where allowed, pickles the whole state dict through ZMQ).

Wire format: a *bucket* is a list of ``(name, dtype, shape, payload)`` where ``payload`` is the tensor's raw bytes
(``bytes``) or, in-process, the tensor itself. Plain bytes travel through vLLM's msgpack transport unchanged
(its decoder only rebuilds tensors where a type annotation asks for one, which untyped RPC arguments lack), so the
same code serves the multiprocess engine, the in-process one (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) and a Ray actor.
Names are transformers names (``model.layers.0.self_attn.q_proj.weight``); vLLM's ``model.load_weights`` maps them
onto its fused layers (qkv_proj, gate_up_proj) and skips a tied ``lm_head``.

This module must import without vLLM (``ragen`` stays importable everywhere); it only needs torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from ragen.rollout.vllm_nccl import NcclReceiverMixin

EXTENSION_CLS = "ragen.rollout.vllm_worker.WeightLoaderExtension"
BucketItem = tuple[str, str, tuple[int, ...], Any]


def encode_tensor(name: str, tensor: torch.Tensor, *, as_bytes: bool = True) -> BucketItem:
    """One bucket item: ``(name, dtype name, shape, raw bytes | tensor)`` of a plain CPU/GPU tensor."""
    t = tensor.detach().contiguous()
    dtype = str(t.dtype).removeprefix("torch.")
    payload: Any = t.cpu().view(torch.uint8).numpy().tobytes() if as_bytes else t
    return name, dtype, tuple(t.shape), payload


def decode_item(item: BucketItem) -> tuple[str, torch.Tensor]:
    """Inverse of ``encode_tensor``: ``(name, tensor)`` on the CPU (or the tensor as sent)."""
    name, dtype, shape, payload = item
    if isinstance(payload, torch.Tensor):
        return name, payload
    raw = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    return name, raw.view(getattr(torch, dtype)).reshape(tuple(shape))


def decode_bucket(bucket: Iterable[BucketItem]) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` pairs of a bucket, lazily (``load_weights`` consumes an iterator)."""
    for item in bucket:
        yield decode_item(item)


class WeightLoaderExtension(NcclReceiverMixin):
    """Mixed into each vLLM worker (``self`` is the worker; ``self.model_runner`` holds the model).

    One update = ``ragen_begin_weight_update``, one ``ragen_load_weights`` per bucket, ``ragen_finish_weight_update``.
    vLLM 0.32 repacks some layers into kernel formats after loading (the CPU build empties the checkpoint-shaped
    linear weights), so a plain second ``load_weights`` fails; its layerwise reload (``initialize_layerwise_reload``
    / ``finalize_layerwise_reload``, what ``Worker.reload_weights`` uses for one iterator) restores checkpoint-shaped
    parameters, processes each layer as soon as all of its weights have arrived, and lets the buckets span several
    calls. Every weight of the model must be sent (the trainer sends the full state dict). Methods are prefixed
    ``ragen_`` so they never clash with vLLM's own worker methods (vLLM checks that). The NCCL receive path of a
    separately placed engine comes from ``vllm_nccl.NcclReceiverMixin``.
    """

    model_runner: Any  # provided by the vLLM worker this class is mixed into
    vllm_config: Any

    def _ragen_model(self) -> Any:
        return self.model_runner.get_model()  # unwraps CUDA-graph wrappers (same as model_runner.model on CPU)

    def ragen_begin_weight_update(self) -> None:
        """Start an in-place reload: checkpoint-format parameters, per-layer processing deferred."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload.layerwise import initialize_layerwise_reload

        with set_current_vllm_config(self.vllm_config):
            initialize_layerwise_reload(self._ragen_model())

    def ragen_load_weights(self, bucket: list[BucketItem]) -> int:
        """Load one bucket with the model's ``load_weights`` (maps names onto fused layers; each tensor-parallel
        worker keeps its own shard of the full tensors); returns the number of tensors received."""
        from vllm.config import set_current_vllm_config

        with set_current_vllm_config(self.vllm_config):
            self._ragen_model().load_weights(weights=decode_bucket(bucket))
        return len(bucket)

    def ragen_finish_weight_update(self) -> None:
        """Process the layers still pending and put the kernel-format tensors back in place."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_reload

        with set_current_vllm_config(self.vllm_config):
            finalize_layerwise_reload(self._ragen_model(), self.vllm_config.model_config)
