"""Prefix caching for the ``hf`` engine: keep each sequence's KV cache from one ``generate`` call to the next.

A multi-turn episode's context is append-only: turn k+1's prompt is turn k's prompt, its sampled tokens, the
end-of-turn token and the next observation. Without a cache the engine prefills that whole history again every
turn (what vLLM's automatic prefix caching avoids). :class:`PrefixStore` keeps, for every sequence of the last call,
the keys and values of the tokens the model has run (the prompt and the sampled tokens but the last, which was
never fed back); the next call looks each prompt up and :func:`cached_prefill` runs only the tokens past the
longest stored sequence it extends.

Layout of the batch :func:`cached_prefill` builds, for row i with ``c_i`` cached tokens and suffix ``s_i``
(``W = max c_i``, ``S = max len(s_i)``)::

    cache:  [0]*(W - c_i) + [K/V of its c_i tokens]          attention mask [0]*(W - c_i) + [1]*c_i
    input:  [pad]*(S - len(s_i)) + s_i                      attention mask [0]*(S - len(s_i)) + [1]*len(s_i)

with position ids ``c_i, c_i + 1, ...`` on the suffix, so every token keeps the position (and the rotary phase of
its cached keys) it has in its own sequence. Rows without a stored prefix have ``c_i = 0``.

The store holds one call's sequences (entries the next call does not extend are dropped as it starts, before its
prefill) and is cleared when the weights change. A caller that plays one of several samples per prompt keeps only
the played ones (``HFEngine.retain_prefixes``, CHAI's best of k); a one-off sampling that no call extends runs with
the store paused (``HFEngine.prefix_cache_paused``). Memory: 2 x layers x kv_heads x head_dim values per token,
46 KB a token in fp32 for the default 135M model (30 layers, 3 KV heads of 64), e.g. ~0.9 GB for 32 episodes of 600
tokens.
"""

from __future__ import annotations

from typing import Any

import torch

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values of one sequence, each (kv_heads, L, head_dim)


def cache_layers(cache: Any) -> list[Any] | None:
    """The per-layer key/value holders of a transformers ``DynamicCache`` (None for any other cache kind, e.g.
    sliding-window or state-space caches, which this module does not handle)."""
    from transformers import DynamicCache

    layers = getattr(cache, "layers", None)
    if type(cache) is not DynamicCache or not layers or not all(hasattr(x, "keys") for x in layers):
        return None
    if any(getattr(x, "is_sliding", False) for x in layers):
        return None
    return list(layers)


class PrefixStore:
    """KV caches of the last call's sequences, keyed by their token ids (module docstring)."""

    def __init__(self) -> None:
        self.entries: list[tuple[list[int], KV]] = []  # looked up by this call
        self.fresh: list[tuple[list[int], KV]] = []  # saved during this call, looked up by the next one
        self.hits = self.reused_tokens = 0

    def begin(self, prompts: list[list[int]]) -> None:
        """Start a call on ``prompts``: the sequences saved by the previous call that one of them extends become the
        ones to look up; the others are dropped now, before this call's prefill adds its own caches."""
        self.entries = [(ids, kv) for ids, kv in self.fresh if _extended(ids, prompts, proper=True)]
        self.fresh = []

    def retain(self, sequences: list[list[int]]) -> None:
        """Keep only the saved sequences that are a prefix of one of ``sequences`` (a caller that plays one of
        several samples per prompt, e.g. CHAI's best of k, drops the caches of the samples it discarded)."""
        self.fresh = [(ids, kv) for ids, kv in self.fresh if _extended(ids, sequences, proper=False)]

    def clear(self) -> None:
        self.entries, self.fresh = [], []

    def match(self, prompt: list[int]) -> tuple[list[int], KV] | None:
        """The longest stored sequence that is a proper prefix of ``prompt`` (at least one new token is left)."""
        best = None
        for ids, kv in self.entries:
            n = len(ids)
            if n < len(prompt) and (best is None or n > len(best[0])) and prompt[:n] == ids:
                best = (ids, kv)
        if best is not None:
            self.hits += 1
            self.reused_tokens += len(best[0])
        return best

    def save(self, cache: Any, mask: torch.Tensor, rows: list[int], ids: list[list[int]]) -> None:
        """Keep batch rows ``rows`` of ``cache`` (their real columns: ``mask[row] == 1``) as the sequences ``ids``
        (one list per row, the tokens the cache holds). A row whose real columns do not match its ids is skipped."""
        layers = cache_layers(cache)
        if layers is None:
            return
        for row, seq in zip(rows, ids, strict=True):
            real = mask[row].bool()
            if int(real.sum()) != len(seq) or layers[0].keys.shape[-2] != mask.shape[1]:
                continue
            kv = [(x.keys[row][:, real].clone(), x.values[row][:, real].clone()) for x in layers]
            self.fresh.append((list(seq), kv))


def _extended(ids: list[int], sequences: list[list[int]], proper: bool) -> bool:
    """Whether some sequence starts with ``ids`` (and, if ``proper``, has at least one token more)."""
    n = len(ids) + (1 if proper else 0)
    return any(len(seq) >= n and seq[: len(ids)] == ids for seq in sequences)


def cached_prefill(model: Any, prompts: list[list[int]], hits: list[tuple[list[int], KV] | None], pad_id: int,
                   device: torch.device) -> tuple[torch.Tensor, Any, torch.Tensor, torch.Tensor]:
    """Prefill ``prompts`` on top of their stored prefixes ``hits`` (None: no stored prefix); returns what
    ``HFEngine._prefill`` returns: last logits (B, V), KV cache, attention mask (B, W + S), next position (B,)."""
    from transformers import DynamicCache

    cached = [len(h[0]) if h is not None else 0 for h in hits]
    width_c = max(cached)
    ref = next(h[1] for h in hits if h is not None)
    cache = DynamicCache()
    for layer, (k_ref, v_ref) in enumerate(ref):
        keys = k_ref.new_zeros((len(prompts), k_ref.shape[0], width_c, k_ref.shape[-1]))
        values = v_ref.new_zeros((len(prompts), v_ref.shape[0], width_c, v_ref.shape[-1]))
        for row, hit in enumerate(hits):
            if hit is not None:
                keys[row, :, width_c - cached[row]:] = hit[1][layer][0]
                values[row, :, width_c - cached[row]:] = hit[1][layer][1]
        cache.update(keys.to(device), values.to(device), layer)
    suffixes = [p[c:] for p, c in zip(prompts, cached, strict=True)]
    width = max(len(s) for s in suffixes)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    own = torch.zeros((len(prompts), width), dtype=torch.long)
    old = torch.zeros((len(prompts), width_c), dtype=torch.long)
    for row, (suffix, c) in enumerate(zip(suffixes, cached, strict=True)):
        ids[row, width - len(suffix):] = torch.tensor(suffix, dtype=torch.long)
        own[row, width - len(suffix):] = 1
        old[row, width_c - c:] = 1
    ids, own, old = ids.to(device), own.to(device), old.to(device)
    offset = torch.tensor(cached, dtype=torch.long, device=device)[:, None]
    positions = offset + (own.cumsum(-1) - 1).clamp(min=0)
    mask = torch.cat([old, own], dim=1)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True,
                logits_to_keep=1)
    return out.logits[:, -1, :], out.past_key_values, mask, positions[:, -1] + 1
