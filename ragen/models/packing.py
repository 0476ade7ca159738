"""Packed micro-batches: the rows of a (B, T) batch run as one row, in the layout the attention implementation needs.

Two packings, chosen by the model's attention implementation (:data:`PACKING_BY_ATTENTION`):

**Shared-prefix packing with a 4D mask** (``sdpa``, ``eager``). The rows of a training batch usually start with the
same tokens (chat template, system prompt, env instructions: ~120 of ~190 tokens per bandit row; a whole prompt for
the rows of one episode group). Run as a (B, T) batch, every row recomputes that prefix, in the forward pass and
again in the backward pass. Packed, the batch becomes one row of length ``L = P + sum_i (n_i - P)``: the shared
prefix (length P) once, then each row's own tokens, with

- a block attention mask (1, 1, L, L): a token of row i sees the prefix and the earlier tokens of row i, nothing else;
- position ids that continue from the prefix: the prefix has 0..P-1 and row i's own tokens P..n_i-1, the positions
  they have in their own row.

Used only where it pays and is exact: right-padded rows, a shared prefix of at least ``MIN_SHARED`` tokens, a packed
row at least ``MIN_SAVING`` shorter than the batch's real tokens and at most ``MAX_PACKED`` long (the explicit mask
costs attention O(L^2) work and memory).

**Position-id packing** (``flash_attention_2``). The real tokens of every row, concatenated in row order without
padding: ``L = sum_i n_i``. Row i's real tokens (``attention_mask`` 1, in order) get positions 0..n_i-1, restarting
at 0 for every row, whether the row is left- or right-padded (the positions ``forward.position_ids_from_mask`` gives
them unpacked); padding is dropped and a row without real tokens contributes nothing. No mask is built: the
varlen kernel reads the rows' boundaries from ``cu_seqlens`` (passed as transformers' ``cu_seq_lens_q`` /
``cu_seq_lens_k``), and transformers' ``sdpa`` / ``eager`` masks (5.x ``masking_utils``) find the same boundaries
where a position does not follow its predecessor by one (0 after anything is a new row). Every row is its own
sequence, so a prefix the rows share is computed once per row; what it saves is the padding. Used whenever the
batch has padding to drop.

Either way each real token's hidden state is what the unpacked forward pass gives (same inputs to every attention
and MLP; only float summation order differs), autograd sums a shared prefix's gradient over the rows, and ``unpack``
gathers the packed hidden states back to the (B, T) layout the callers use.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MIN_SHARED = 16  # tokens
MIN_SAVING = 0.2  # the packed row must be at least this fraction shorter than the real tokens of the batch
MAX_PACKED = 4096  # tokens in the packed row
MASK = "4D-mask"
POSITION_IDS = "position-id"
# The packing each attention implementation takes; one that is absent runs batches unpacked.
PACKING_BY_ATTENTION = {"sdpa": MASK, "eager": MASK, "flash_attention_2": POSITION_IDS}
MASKED_ATTENTION = tuple(impl for impl, kind in PACKING_BY_ATTENTION.items() if kind == MASK)


@dataclass(frozen=True)
class PackPlan:
    """Where each token of a (B, T) batch lives in the packed row.

    ids: (1, L) packed token ids; positions: (1, L) their position ids; index: (B, T) long, ``index[b, t]`` = packed
    position of token t of row b (0 for padding, whose hidden state no caller reads).
    Shared-prefix packing: mask (1, 1, L, L) bool, True where query q may attend to key k; shared: P.
    Position-id packing: mask None; shared 0; cu_seqlens (S + 1,) int32, the packed start of each of the S non-empty
    rows and L; max_len the longest row.
    """

    ids: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor | None
    index: torch.Tensor
    shared: int
    cu_seqlens: torch.Tensor | None = None
    max_len: int = 0


def packing_for(attn_implementation: str | None) -> str | None:
    """The packing (:data:`MASK` / :data:`POSITION_IDS`) an attention implementation takes, None for none."""
    return PACKING_BY_ATTENTION.get(attn_implementation or "")


def plan_packing(input_ids: torch.Tensor, attention_mask: torch.Tensor, attn_implementation: str | None
                 ) -> PackPlan | None:
    """The packing of a batch for ``attn_implementation``, or None when the batch runs unpacked (module docstring).

    input_ids, attention_mask: (B, T); attention_mask 1 on real tokens.
    """
    kind = packing_for(attn_implementation)
    if kind == POSITION_IDS:
        return plan_position_packing(input_ids, attention_mask)
    if kind == MASK:
        return plan_prefix_packing(input_ids, attention_mask)
    return None


def shared_prefix_len(input_ids: torch.Tensor, lengths: torch.Tensor) -> int:
    """Tokens all rows share from position 0, at most ``min(lengths) - 1`` (every row keeps a token of its own).

    input_ids: (B, T); lengths: (B,) real tokens per row (right-padded rows).
    """
    limit = int(lengths.min()) - 1
    if limit <= 0:
        return 0
    same = (input_ids[:, :limit] == input_ids[:1, :limit]).all(dim=0)
    return int(same.long().cumprod(0).sum())


def plan_prefix_packing(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> PackPlan | None:
    """Shared-prefix packing with a 4D mask, or None when it would not pay or not be exact (module docstring).

    input_ids, attention_mask: (B, T); real tokens must come first in every row.
    """
    if input_ids.shape[0] < 2:
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


def plan_position_packing(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> PackPlan | None:
    """Position-id packing: every row's real tokens concatenated, positions restarting at 0 per row (module
    docstring); None when the batch has no padding to drop or no real token.

    input_ids, attention_mask: (B, T), any padding (left, right, or holes: a row's real tokens are taken in order).
    """
    real = attention_mask.bool()
    lengths = real.long().sum(dim=1)
    total = int(lengths.sum())
    if total == 0 or total == real.numel():
        return None
    positions = real.long().cumsum(dim=1) - 1  # 0, 1, ... over each row's real tokens
    starts = torch.cumsum(lengths, 0) - lengths  # packed start of each row
    index = torch.where(real, starts[:, None] + positions, torch.zeros_like(positions))
    nonempty = lengths[lengths > 0]
    cu_seqlens = torch.zeros(nonempty.numel() + 1, dtype=torch.int32, device=input_ids.device)
    cu_seqlens[1:] = torch.cumsum(nonempty, 0)
    return PackPlan(ids=input_ids[real][None], positions=positions[real][None], mask=None, index=index, shared=0,
                    cu_seqlens=cu_seqlens, max_len=int(nonempty.max()))


def attention_mask_for(plan: PackPlan, implementation: str, dtype: torch.dtype) -> torch.Tensor | None:
    """The 4D mask in the form the attention implementation reads: bool for ``sdpa``, additive for ``eager``; None
    for position-id packing (the implementation separates the rows by their positions / ``cu_seqlens``)."""
    if plan.mask is None or implementation == "sdpa":
        return plan.mask
    zero = torch.zeros((), dtype=dtype, device=plan.mask.device)
    return torch.where(plan.mask, zero, torch.finfo(dtype).min)


def varlen_kwargs(plan: PackPlan, implementation: str) -> dict:
    """Keyword arguments of the base model's forward that hand a flash implementation the rows' boundaries, so it
    need not infer them from the positions in every layer (transformers' ``FlashAttentionKwargs``); {} otherwise."""
    if plan.cu_seqlens is None or not implementation.startswith("flash_attention"):
        return {}
    return {"cu_seq_lens_q": plan.cu_seqlens, "cu_seq_lens_k": plan.cu_seqlens, "max_length_q": plan.max_len,
            "max_length_k": plan.max_len}


def unpack(packed: torch.Tensor, plan: PackPlan) -> torch.Tensor:
    """Packed hidden states (1, L, H) -> (B, T, H) in the batch's layout (padding rows hold position 0's state)."""
    return packed[0][plan.index]
