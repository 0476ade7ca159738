"""The ``hf`` engine: batched sampling with a transformers causal LM on CPU or GPU (docs/design.md, engines).

Our own decode loop over ``model.forward`` with a KV cache instead of ``model.generate``, so the returned ids are
exactly the sampled ones and their log-probs are those of the distribution actually sampled from:

- prompts are left-padded into one batch (attention mask + position ids), prefilled once, then decoded one token
  per step; rows that finish are dropped from the batch and the KV cache, so short answers cost nothing;
- the prefix every prompt of a batch shares (system prompt, env instructions) is prefilled once and its KV cache
  shared, and the prefill keeps logits for the last position only: together ~3x less prefill on the bandit;
- ``temperature > 0``: log-probs of ``softmax(logits / T)``, restricted to the top-k / nucleus (top-p) set and
  renormalised when ``top_k > 0`` or ``top_p < 1`` (keep ``top_p=1, top_k=0`` for training, see ``base.py``);
- ``temperature == 0``: greedy argmax; the point mass has log-prob 0, so we report the untempered ``T = 1``
  log-probs instead (what vLLM reports too), which is what an evaluator wants to see;
- with ``prefix_cache`` (the trainer turns it on for multi-turn envs) each sequence's KV cache is kept until the
  next call, whose prompts that extend one (the next turn of the same episode) prefill only their new tokens
  (``ragen.rollout.hf_prefix``);
- a sample ends at the first stop id (``stop_token_ids``, the tokenizer's eos = end-of-turn token, the model's
  generation eos ids) or at the first token whose decoded text completes a stop string; that token is kept.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ragen.models.loader import DEFAULT_MODEL, load_model, load_tokenizer
from ragen.rollout.base import Sample, SamplingParams, SleepState
from ragen.rollout.hf_prefix import PrefixStore, cached_prefill
from ragen.rollout.offload import HostOffload

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16}
MIN_SHARED_PREFIX = 16  # tokens; a shorter common prefix is not worth a separate forward pass
_NAME_PREFIXES = ("module.", "_orig_mod.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``"float32"``/``"bfloat16"``/``"float16"`` (or short forms, or a torch dtype) -> torch dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(_DTYPES)}")
    return _DTYPES[dtype]


def sampling_log_probs(logits: torch.Tensor, temperature: float, top_p: float = 1.0, top_k: int = 0) -> torch.Tensor:
    """Log-probs of the distribution sampled from, given raw ``logits: (B, V)``; returns ``(B, V)`` in fp32.

    ``log_softmax(logits / T)``; tokens outside the top-k and outside the smallest set whose probability reaches
    ``top_p`` get ``-inf`` and the rest is renormalised. ``temperature == 0`` (greedy) gives ``log_softmax(logits)``.
    """
    scaled = logits.float() / temperature if temperature > 0 else logits.float()
    logp = torch.log_softmax(scaled, dim=-1)
    if temperature <= 0 or (top_p >= 1.0 and top_k <= 0):
        return logp
    if 0 < top_k < logp.shape[-1]:
        kth = torch.topk(logp, top_k, dim=-1).values[..., -1:]
        logp = logp.masked_fill(logp < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logp, order = torch.sort(logp, dim=-1, descending=True)
        probs = sorted_logp.exp()
        mass_before = probs.cumsum(-1) - probs  # probability of strictly better tokens
        drop_sorted = mass_before >= top_p  # the first token is always kept (mass_before = 0)
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logp = logp.masked_fill(drop, float("-inf"))
    return torch.log_softmax(logp, dim=-1)


def _shared_prefix_len(prompts: list[list[int]]) -> int:
    """Length of the longest prefix common to all prompts, at most ``min(len) - 1`` (every row keeps one token)."""
    limit = min(len(p) for p in prompts) - 1
    first = prompts[0]
    n = 0
    while n < limit and all(p[n] == first[n] for p in prompts):
        n += 1
    return n


def _check_sampling(sampling: SamplingParams) -> None:
    if sampling.temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {sampling.temperature}")
    if not 0 < sampling.top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {sampling.top_p}")
    if sampling.top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 = off), got {sampling.top_k}")
    if sampling.max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {sampling.max_new_tokens}")


class HFEngine:
    """Engine over a transformers causal LM; implements ``ragen.rollout.base.Engine``.

    ``model`` is a name/path for ``load_model`` or a model object; the engine casts it to ``device``/``dtype`` in
    place (an object passed in is shared, not copied, so a trainer's updates are visible without a sync).
    ``tokenizer`` defaults to ``load_tokenizer`` of the model name (of ``model.name_or_path`` for an object, or
    the default model's). ``batch_size`` bounds the rows decoded together (prompts are grouped by length).
    ``prefix_cache``: keep the last call's KV caches for prompts that extend them (module docstring).
    """

    def __init__(
        self,
        model: str | PreTrainedModel = DEFAULT_MODEL,
        tokenizer: PreTrainedTokenizerBase | None = None,
        *,
        device: str = "cpu",
        dtype: str | torch.dtype = "float32",
        batch_size: int = 32,
        cache_dir: str | None = None,
        prefix_cache: bool = False,
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.device = torch.device(device)
        self.dtype = parse_dtype(dtype)
        self.batch_size = batch_size
        if isinstance(model, str):
            name = model
            model = load_model(model, dtype=self.dtype, cache_dir=cache_dir)
        else:
            name = model.name_or_path or DEFAULT_MODEL
        self.model: PreTrainedModel = model.to(device=self.device, dtype=self.dtype)
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(name, cache_dir=cache_dir)
        self.pad_id = self._pad_id()
        self.eos_ids = self._eos_ids()
        self.prefix_store = PrefixStore() if prefix_cache else None
        self._offload = HostOffload(self.model)
        self.sleep_state = SleepState()  # what is asleep (ragen.rollout.base); the engine starts awake

    def _pad_id(self) -> int:
        for candidate in (self.tokenizer.pad_token_id, self.model.config.pad_token_id, self.tokenizer.eos_token_id):
            if candidate is not None:
                return int(candidate)
        return 0

    def _eos_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        for source in (self.tokenizer.eos_token_id, getattr(self.model.generation_config, "eos_token_id", None)):
            if isinstance(source, int):
                ids.add(source)
            elif source is not None:
                ids.update(int(i) for i in source)
        return frozenset(ids)

    # ------------------------------------------------------------------ generation
    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingParams) -> list[Sample]:
        """Sample one continuation per prompt; results are in prompt order (see module docstring)."""
        _check_sampling(sampling)
        vocab = self.model.get_input_embeddings().weight.shape[0]
        for i, prompt in enumerate(prompt_token_ids):
            if len(prompt) == 0:
                raise ValueError(f"prompt {i} is empty; every prompt needs at least one token")
            if min(prompt) < 0 or max(prompt) >= vocab:
                raise ValueError(f"prompt {i} has token ids outside [0, {vocab}): min {min(prompt)}, max {max(prompt)}")
        if self.prefix_store is not None:
            self.prefix_store.begin(prompt_token_ids)
        if sampling.max_new_tokens == 0:
            return [Sample([], [], "length") for _ in prompt_token_ids]
        generator = None
        if sampling.seed is not None and sampling.temperature > 0:
            generator = torch.Generator(device=self.device).manual_seed(sampling.seed)
        order = sorted(range(len(prompt_token_ids)), key=lambda i: len(prompt_token_ids[i]))
        results: list[Sample | None] = [None] * len(order)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                for start in range(0, len(order), self.batch_size):
                    chunk = order[start : start + self.batch_size]
                    samples = self._generate_chunk([prompt_token_ids[i] for i in chunk], sampling, generator)
                    for i, sample in zip(chunk, samples, strict=True):
                        results[i] = sample
        finally:
            self.model.train(was_training)
        return results  # type: ignore[return-value]

    def _prefill(self, prompts: list[list[int]]) -> tuple[torch.Tensor, Any, torch.Tensor, torch.Tensor]:
        """Run the prompts: returns last logits (B, V), KV cache, attention mask (B, L), next position (B,).

        The prefix all prompts share (the system prompt and instructions of one env, often most of the prompt)
        is run once for one row and its KV cache repeated over the batch; then each prompt's own suffix is
        left-padded after it (mask ``[1]*P + [0]*pad + [1]*suffix``, positions continuing from P). Logits are
        kept for the last position only.
        """
        shared = _shared_prefix_len(prompts) if len(prompts) > 1 else 0
        cache = None
        if shared >= MIN_SHARED_PREFIX:
            pre = torch.tensor([prompts[0][:shared]], dtype=torch.long, device=self.device)
            out = self.model(input_ids=pre, position_ids=torch.arange(shared, device=self.device)[None],
                             use_cache=True, logits_to_keep=1)
            cache = out.past_key_values
            cache.batch_repeat_interleave(len(prompts))
        else:
            shared = 0
        suffixes = [p[shared:] for p in prompts]
        width = max(len(p) for p in suffixes)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        own = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, suffix in enumerate(suffixes):
            ids[row, width - len(suffix) :] = torch.tensor(suffix, dtype=torch.long)
            own[row, width - len(suffix) :] = 1
        ids, own = ids.to(self.device), own.to(self.device)
        positions = shared + (own.cumsum(-1) - 1).clamp(min=0)
        mask = torch.cat([own.new_ones((len(prompts), shared)), own], dim=1)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                         use_cache=True, logits_to_keep=1)
        return out.logits[:, -1, :], out.past_key_values, mask, positions[:, -1] + 1

    def _generate_chunk(
        self, prompts: list[list[int]], sampling: SamplingParams, generator: torch.Generator | None
    ) -> list[Sample]:
        store = self.prefix_store
        hits = [store.match(p) for p in prompts] if store is not None else [None]
        if any(h is not None for h in hits):
            logits, cache, mask, next_pos = cached_prefill(self.model, prompts, hits, self.pad_id, self.device)
        else:
            logits, cache, mask, next_pos = self._prefill(prompts)
        stop_ids = self.eos_ids | frozenset(sampling.stop_token_ids)
        window = max((len(s) for s in sampling.stop), default=0) + 8  # tokens decoded to look for stop strings
        tokens: list[list[int]] = [[] for _ in prompts]
        log_probs: list[list[float]] = [[] for _ in prompts]
        reasons = ["length"] * len(prompts)
        active = list(range(len(prompts)))  # original row of each current batch row
        for step in range(sampling.max_new_tokens):
            logp = sampling_log_probs(logits, sampling.temperature, sampling.top_p, sampling.top_k)
            if sampling.temperature > 0:
                chosen = torch.multinomial(logp.exp(), 1, generator=generator)  # (b, 1)
            else:
                chosen = logp.argmax(-1, keepdim=True)
            chosen_logp = logp.gather(-1, chosen).squeeze(-1).tolist()
            keep: list[int] = []
            for j, (row, tok) in enumerate(zip(active, chosen.squeeze(-1).tolist(), strict=True)):
                tokens[row].append(tok)
                log_probs[row].append(chosen_logp[j])
                if tok in stop_ids or self._hits_stop(tokens[row], sampling.stop, window):
                    reasons[row] = "stop"
                else:
                    keep.append(j)
            last = not keep or step == sampling.max_new_tokens - 1
            if store is not None:  # rows leaving the batch; their cache holds the prompt and all tokens but the last
                kept = set(keep)
                rows = list(range(len(active))) if last else [j for j in range(len(active)) if j not in kept]
                store.save(cache, mask, rows, [prompts[active[j]] + tokens[active[j]][:-1] for j in rows])
            if last:
                break
            if len(keep) < len(active):  # drop finished rows from the batch and the KV cache
                index = torch.tensor(keep, device=self.device)
                cache.batch_select_indices(index)
                mask, next_pos, chosen = mask[index], next_pos[index], chosen[index]
                active = [active[j] for j in keep]
            mask = torch.cat([mask, mask.new_ones((len(active), 1))], dim=1)
            out = self.model(
                input_ids=chosen, attention_mask=mask, position_ids=next_pos[:, None], past_key_values=cache,
                use_cache=True,
            )
            logits, cache, next_pos = out.logits[:, -1, :], out.past_key_values, next_pos + 1
        return [Sample(t, lp, r) for t, lp, r in zip(tokens, log_probs, reasons, strict=True)]

    def _hits_stop(self, generated: list[int], stop: tuple[str, ...], window: int) -> bool:
        """True if the newest tokens complete a stop string (checked each step, so a short tail suffices)."""
        stop = tuple(s for s in stop if s)  # an empty stop string would match everything; ignore it
        if not stop:
            return False
        text = self.tokenizer.decode(generated[-window:], skip_special_tokens=False)
        return any(s in text for s in stop)

    # ------------------------------------------------------------------ weights and memory
    def update_weights(self, state_dict: dict[str, Any] | Iterable[tuple[str, Any]]) -> None:
        """Copy tensors into the engine's model by name (full or partial state dict, or (name, tensor) pairs).

        Wrapper prefixes (``module.``, ``_orig_mod.``, FSDP/checkpoint wrappers) are stripped; DTensors are
        gathered with ``full_tensor()``. Unknown names or shape mismatches raise ``ValueError``.
        """
        targets = self.model.state_dict(keep_vars=True)
        items = state_dict.items() if isinstance(state_dict, dict) else state_dict
        with torch.no_grad():
            for raw_name, tensor in items:
                name = raw_name
                for prefix in _NAME_PREFIXES:
                    name = name.replace(prefix, "")
                if name not in targets:
                    known = ", ".join(list(targets)[:3])
                    raise ValueError(f"update_weights: unknown parameter {raw_name!r}; expected names like {known}")
                if hasattr(tensor, "full_tensor"):
                    tensor = tensor.full_tensor()
                target = targets[name]
                if tuple(tensor.shape) != tuple(target.shape):
                    raise ValueError(
                        f"update_weights: {raw_name!r} has shape {tuple(tensor.shape)}, model has {tuple(target.shape)}"
                    )
                target.copy_(tensor.to(device=target.device, dtype=target.dtype))
        if self.prefix_store is not None:
            self.prefix_store.clear()  # cached keys and values belong to the old weights

    @contextmanager
    def prefix_cache_paused(self) -> Iterator[None]:
        """Within: ``generate`` neither looks up nor keeps KV caches, and the kept ones stay for after. For one-off
        samplings that no later call extends (e.g. ArCHer's fresh actions on replay-buffer states), whose caches
        would only take memory: 46 KB a token for the default model, ~7 GB for 320 rows of ~470 tokens."""
        store, self.prefix_store = self.prefix_store, None
        try:
            yield
        finally:
            self.prefix_store = store

    def retain_prefixes(self, sequences: list[list[int]]) -> None:
        """With ``prefix_cache``: keep the last call's KV caches only for sequences that are a prefix of one of
        ``sequences`` (the prompts' continuations the caller will extend); a no-op without it."""
        if self.prefix_store is not None:
            self.prefix_store.retain(sequences)

    @property
    def asleep(self) -> frozenset[str]:
        """The parts (``ENGINE_PARTS``) asleep now."""
        return self.sleep_state.asleep

    def sleep(self) -> None:
        """Free accelerator memory between rollouts: on CUDA the weights go to pinned host buffers allocated once
        (``ragen.rollout.offload.HostOffload``, asynchronous copies) and the KV caches kept for the next turn are
        dropped; on CPU only the kept KV caches go. Asleep already: nothing happens."""
        self.sleep_state.sleep(self._free)

    def wake(self, tags: tuple[str, ...] | None = None) -> None:
        """Undo ``sleep`` for the parts of ``tags`` (None = all) still asleep: the weights back on the device when
        they are among them (the KV cache is built per call, so ``("kv_cache",)`` has nothing to bring back); no
        memory moves on CPU."""
        self.sleep_state.wake(tags, self._restore)

    def _free(self) -> None:
        if self.prefix_store is not None:
            self.prefix_store.clear()
        if self.device.type == "cuda":
            self._offload.offload()
            torch.cuda.empty_cache()

    def _restore(self, parts: tuple[str, ...] | None) -> None:
        if self.device.type == "cuda" and (parts is None or "weights" in parts):
            self._offload.restore()
