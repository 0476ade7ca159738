"""The ``vllm`` engine (GPU): vLLM's offline ``LLM`` behind the ``Engine`` protocol (DESIGN.md, "Rollout engines").

``vllm`` is imported in the constructor only, so this module imports fine on CPU-only machines. The GPU-free parts
-- our ``SamplingParams`` -> vLLM keyword arguments, and vLLM outputs -> ``Sample`` -- are pure functions, unit
tested with fake objects.

Log-probs: vLLM returns raw (pre-temperature) log-probs unless the engine runs with
``logprobs_mode="processed_logprobs"`` (vLLM >= 0.10.2), which we pass by default so the returned log-probs are
those of the distribution sampled from, as the protocol requires. On older vLLM pass ``logprobs_mode=None`` and
only use temperature 1.0 for training rollouts.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ragen.models.loader import DEFAULT_MODEL, resolve_model_path
from ragen.rollout.base import Sample, SamplingParams


def vllm_sampling_kwargs(sampling: SamplingParams, extra_stop_token_ids: Iterable[int] = ()) -> dict[str, Any]:
    """Keyword arguments for ``vllm.SamplingParams`` equivalent to ``sampling``.

    Asks for the sampled token's log-prob only (``logprobs=0``), keeps stop strings in the output, keeps special
    tokens when detokenising, and adds ``extra_stop_token_ids`` (e.g. the end-of-turn id) to the stop ids.
    """
    stop_ids = sorted(set(sampling.stop_token_ids) | set(extra_stop_token_ids))
    return {
        "n": 1,
        "temperature": float(sampling.temperature),
        "top_p": float(sampling.top_p),
        "top_k": int(sampling.top_k) if sampling.top_k > 0 else -1,
        "max_tokens": int(sampling.max_new_tokens),
        "stop": list(sampling.stop) or None,
        "stop_token_ids": stop_ids or None,
        "include_stop_str_in_output": True,
        "skip_special_tokens": False,
        "seed": sampling.seed,
        "logprobs": 0,
    }


def sample_from_vllm_output(request_output: Any) -> Sample:
    """Convert one ``vllm.RequestOutput`` (first completion) to a ``Sample``.

    ``completion.logprobs`` is a list (one per generated token) of ``{token_id: Logprob}``; the sampled id is
    always present. vLLM's ``finish_reason`` is "stop" or "length" ("abort" is reported as "length").
    """
    completion = request_output.outputs[0]
    token_ids = [int(t) for t in completion.token_ids]
    if completion.logprobs is None:
        raise ValueError("vLLM output has no logprobs; request them with SamplingParams(logprobs=0)")
    log_probs = []
    for tok, candidates in zip(token_ids, completion.logprobs, strict=True):
        entry = candidates[tok]
        log_probs.append(float(getattr(entry, "logprob", entry)))
    reason = "stop" if completion.finish_reason == "stop" else "length"
    extra = {"stop_reason": completion.stop_reason} if getattr(completion, "stop_reason", None) is not None else {}
    return Sample(token_ids, log_probs, reason, extra)


def weight_items(state_dict: dict[str, Any] | Iterable[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """(name, tensor) pairs from a state dict or an iterable of pairs; DTensors are gathered to full tensors."""
    items = state_dict.items() if isinstance(state_dict, dict) else state_dict
    out = []
    for name, tensor in items:
        if hasattr(tensor, "full_tensor"):
            tensor = tensor.full_tensor()
        out.append((name, tensor))
    return out


class VLLMEngine:
    """``Engine`` over ``vllm.LLM``; ``model`` accepts the same names as ``ragen.models.load_model``.

    ``tokenizer`` (e.g. from ``load_tokenizer``) only supplies the end-of-turn id added to the stop ids; vLLM
    tokenises with the files beside the resolved model. ``device`` exists for call compatibility with ``HFEngine``
    (vLLM places the model on the GPUs itself; "cpu" is refused). ``llm_kwargs`` go to ``vllm.LLM`` unchanged
    (e.g. ``max_model_len``, ``enforce_eager``).
    Weight updates run ``model.load_weights`` inside each worker through ``LLM.apply_model``; with vLLM's V1
    multiprocessing this pickles the weights, so for large models prefer running in-process
    (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) as RL frameworks colocating trainer and engine do.
    """

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        tokenizer: Any = None,
        *,
        device: str = "cuda",
        dtype: str = "bfloat16",
        gpu_memory_utilization: float = 0.5,
        tensor_parallel_size: int = 1,
        enable_sleep_mode: bool = True,
        logprobs_mode: str | None = "processed_logprobs",
        seed: int = 0,
        cache_dir: str | None = None,
        **llm_kwargs: Any,
    ):
        try:
            import vllm
        except ImportError as exc:
            raise ImportError(
                "engine 'vllm' needs the vllm package (GPU only): pip install 'ragen[gpu]', or use engine 'hf'"
            ) from exc
        if str(device).startswith("cpu"):
            raise ValueError("engine 'vllm' runs on GPU only; use engine 'hf' with device='cpu'")
        path = resolve_model_path(model, cache_dir)
        if logprobs_mode is not None:
            llm_kwargs["logprobs_mode"] = logprobs_mode
        self._vllm = vllm
        self._sleep_enabled = enable_sleep_mode
        self.llm = vllm.LLM(
            model=path, tokenizer=path, dtype=dtype, gpu_memory_utilization=gpu_memory_utilization,
            tensor_parallel_size=tensor_parallel_size, enable_sleep_mode=enable_sleep_mode, seed=seed, **llm_kwargs,
        )
        tokenizer = tokenizer if tokenizer is not None else self.llm.get_tokenizer()  # ours has eos fixed
        self.eos_ids = frozenset({tokenizer.eos_token_id} - {None})

    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingParams) -> list[Sample]:
        """Sample one continuation per prompt (vLLM schedules the whole list with continuous batching)."""
        params = self._vllm.SamplingParams(**vllm_sampling_kwargs(sampling, self.eos_ids))
        prompts = [{"prompt_token_ids": list(p)} for p in prompt_token_ids]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return [sample_from_vllm_output(o) for o in outputs]

    def update_weights(self, state_dict: dict[str, Any] | Iterable[tuple[str, Any]]) -> None:
        """Load (name, tensor) pairs into every worker's model with vLLM's ``load_weights`` (handles fused QKV)."""
        items = weight_items(state_dict)
        if hasattr(self.llm, "apply_model"):
            self.llm.apply_model(lambda model: model.load_weights(weights=items))
            return
        worker = self.llm.llm_engine.model_executor.driver_worker  # older vLLM (V0), single process
        runner = getattr(worker, "model_runner", None) or worker.worker.model_runner
        runner.model.load_weights(weights=items)

    def sleep(self) -> None:
        """Offload weights and drop the KV cache (vLLM sleep level 1); requires ``enable_sleep_mode``."""
        if self._sleep_enabled:
            self.llm.sleep(level=1)

    def wake(self) -> None:
        """Reload what ``sleep`` offloaded."""
        if self._sleep_enabled:
            self.llm.wake_up()
