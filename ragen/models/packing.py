"""Shared-prefix packing: one forward pass in which the prefix all rows of a batch share is computed once.

The rows of a training batch usually start with the same tokens (chat template, system prompt, env
instructions: ~120 of ~190 tokens per bandit row). Run as a (B, T) batch, every row recomputes that prefix, in
the forward pass and again in the backward pass. Packed, the batch becomes one row of length
``L = P + sum_i (n_i - P)``: the shared prefix (length P) once, then each row's own tokens, with

- a block attention mask: a token of row i sees the prefix and the earlier tokens of row i, nothing else;
- position ids that continue from the prefix, so every token keeps the position it has in its own row.

Each real token's hidden state is then exactly what the unpacked forward pass gives (same inputs to every
attention and MLP; only float summation order differs), and autograd sums the prefix's gradient over the rows.
``unpack`` gathers the packed hidden states back to the (B, T) layout the callers use.

Used only where it pays and is exact: right-padded rows, a shared prefix of at least ``MIN_SHARED`` tokens, a
packed row at least ``MIN_SAVING`` shorter than the batch's real tokens and at most ``MAX_PACKED`` long (the
explicit mask costs attention O(L^2) work), and an attention implementation that takes a 4D mask (``sdpa``,
``eager``; FlashAttention-2 on GPUs does not).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MIN_SHARED = 16  # tokens
MIN_SAVING = 0.2  # the packed row must be at least this fraction shorter than the real tokens of the batch
MAX_PACKED = 4096  # tokens in the packed row
MASKED_ATTENTION = ("sdpa", "eager")


@dataclass(frozen=True)
class PackPlan:
    """Where each token of a (B, T) batch lives in the packed row.

    ids: (1, L) packed token ids; positions: (1, L) their position ids; mask: (1, 1, L, L) bool, True where query
    q may attend to key k; index: (B, T) long, ``index[b, t]`` = packed position of token t of row b (0 for
    padding, whose hidden state no caller reads); shared: P.
    """

    ids: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor
    index: torch.Tensor
    shared: int


def shared_prefix_len(input_ids: torch.Tensor, lengths: torch.Tensor) -> int:
    """Tokens all rows share from position 0, at most ``min(lengths) - 1`` (every row keeps a token of its own).

    input_ids: (B, T); lengths: (B,) real tokens per row (right-padded rows).
    """
    limit = int(lengths.min()) - 1
    if limit <= 0:
        return 0
    same = (input_ids[:, :limit] == input_ids[:1, :limit]).all(dim=0)
    return int(same.long().cumprod(0).sum())


def plan_packing(input_ids: torch.Tensor, attention_mask: torch.Tensor, attn_implementation: str | None
                 ) -> PackPlan | None:
    """The packing of a right-padded batch, or None when it would not pay or not be exact (module docstring).

    input_ids, attention_mask: (B, T); attention_mask 1 on real tokens, which must come first in every row.
    """
    if input_ids.shape[0] < 2 or attn_implementation not in MASKED_ATTENTION:
        return None
    m = attention_mask.long()
    if not bool((m[:, 1:] <= m[:, :-1]).all()):
        return None
    lengths = m.sum(dim=1)
    shared = shared_prefix_len(input_ids, lengths)
    total = int(lengths.sum())
    packed_len = shared + total - shared * input_ids.shape[0]
    if shared < MIN_SHARED or packed_len > MAX_PACKED or packed_len > (1 - MIN_SAVING) * total:
        return None
    device = input_ids.device
    B, T = input_ids.shape
    own = (lengths - shared).clamp(min=0)  # each row's tokens after the prefix
    offsets = shared + torch.cumsum(own, 0) - own  # packed start of each row's own tokens
    t = torch.arange(T, device=device).expand(B, T)
    real = t < lengths[:, None]
    index = torch.where(t < shared, t, offsets[:, None] + t - shared)
    index = torch.where(real, index, torch.zeros_like(index))
    ids = input_ids.new_zeros(packed_len)
    positions = torch.zeros(packed_len, dtype=torch.long, device=device)
    segment = torch.full((packed_len,), -1, dtype=torch.long, device=device)  # -1: the shared prefix
    ids[index[real]] = input_ids[real]
    positions[index[real]] = t[real]
    rows = torch.arange(B, device=device)[:, None].expand(B, T)
    own_tok = real & (t >= shared)
    segment[index[own_tok]] = rows[own_tok]
    q = torch.arange(packed_len, device=device)
    causal = q[None, :] <= q[:, None]
    visible = (segment[None, :] == -1) | (segment[None, :] == segment[:, None])
    return PackPlan(ids=ids[None], positions=positions[None], mask=(causal & visible)[None, None], index=index,
                    shared=shared)


def attention_mask_for(plan: PackPlan, implementation: str, dtype: torch.dtype) -> torch.Tensor:
    """The 4D mask in the form the attention implementation reads: bool for ``sdpa``, additive for ``eager``."""
    if implementation == "sdpa":
        return plan.mask
    zero = torch.zeros((), dtype=dtype, device=plan.mask.device)
    return torch.where(plan.mask, zero, torch.finfo(dtype).min)


def unpack(packed: torch.Tensor, plan: PackPlan) -> torch.Tensor:
    """Packed hidden states (1, L, H) -> (B, T, H) in the batch's layout (padding rows hold position 0's state)."""
    return packed[0][plan.index]
