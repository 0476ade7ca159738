"""Vectorisation primitives for the estimators: discounted suffix sums and the per-turn view.

Sequences reach 16k tokens, so nothing here loops over tokens in Python, and nothing gathers the model tokens
into a compacted copy. On CPU the GAE family is memory-bound, so the fast paths also avoid (B, T) int64 and
float64 temporaries and use as few (B, T) passes as they can:
- :func:`chunked_scan` (used by the GAE family) solves ``x_j = u_j + a_j * x_{j+1}`` with ``a_j`` = c on
  steps, 1 on pass-through tokens (env/pad: neither discount steps nor bootstraps), 0 at cuts (a turn's end):
  one (CHUNK-token chunk) x (CHUNK x CHUNK decay matrix) product, exact recomputation of the few chunks holding a cut
  or a step/pass-through border, and a (B, T / CHUNK) carry between chunks. No c^-E rescaling, so any c works
  in float32.
- :func:`suffix_scan` solves the same recursion with the c^-E reverse-cumsum trick in float64 (stable: every
  term after j is at most c^E_j) and falls back to doubling when c^E would underflow; kept for
  :func:`ragen.algorithms.group.reinforce_pp` and as an independent check of :func:`chunked_scan`.
- :func:`reverse_linear_scan` solves it by recursive doubling (Hillis & Steele 1986), ceil(log2 N) passes; it
  serves small problems (chunk carries, cut chunks). :func:`discounted_suffix_sum` handles a small (B, K)
  problem with one scalar discount as one matrix product.
- :class:`TurnView` locates each turn's first/last model token from a sorted int16 key (kappa) with
  ``searchsorted`` and offers chunk-wise broadcast, masking and per-turn sums.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

_TINY_LOG10 = -280.0  # c^E below 1e-280 risks float64 underflow: use the doubling scan instead


def shift_left(x: Tensor, fill: float = 0.0) -> Tensor:
    """``out[..., j] = x[..., j + 1]``, last entry ``fill``."""
    return F.pad(x[..., 1:], (0, 1), value=fill)


def reverse_linear_scan(b: Tensor, a: Tensor | float) -> Tensor:
    """Solve ``x_j = b_j + a_j * x_{j+1}`` along the last dim with ``x_N = 0``.

    b: (..., N); a: same shape or a scalar. ``a_j = 0`` ends a segment after j. After the pass with stride d,
    ``x_j`` holds the sum over the window [j, j + 2d) and ``p_j`` the product of the coefficients over it (0 once
    the window runs past the end), so log2(N) passes finish; the loop stops early once every product is 0.
    """
    x = b.clone()
    p = torch.as_tensor(a, dtype=b.dtype, device=b.device).expand_as(b).clone()
    n = b.shape[-1]
    d = 1
    while d < n:
        x[..., :-d] += p[..., :-d] * x[..., d:]
        p[..., :-d] = p[..., :-d] * p[..., d:]
        p[..., -d:] = 0.0
        d *= 2
        if d < n and not bool(p.any()):
            break
    return x


@dataclass
class Segments:
    """Segments that cut a suffix scan: token j belongs to segment ``seg_of[b, j]`` (B, T) long, which ends at
    position ``seg_last[b, k]`` (B, K) long; ``seg_exists`` (B, K) bool marks real segments."""

    seg_of: Tensor
    seg_last: Tensor
    seg_exists: Tensor


def suffix_scan(u: Tensor, steps: Tensor | None, c: float, segments: Segments | None = None) -> Tensor:
    """Discounted suffix sums over the (B, T) layout, computed in float64.

    u: (B, T), 0 off step tokens. steps: (B, T) bool/0-1, tokens that count as one discount step (None: all).
    Returns x with ``x_j = u_j + a_j x_{j+1}``, ``a_j`` = c on steps, 1 elsewhere, 0 at each segment's last
    position; only entries at step tokens are meaningful.
    """
    u = u.to(torch.float64)
    if c == 0.0:
        return u
    B, T = u.shape
    if steps is None:
        exps = torch.arange(T, device=u.device).expand(B, T)
    else:
        s = steps.to(torch.int32)
        exps = (s.cumsum(dim=1, dtype=torch.int32) - s).long()
    max_exp = int(exps[:, -1].max()) if u.numel() else 0
    if c != 1.0 and not (c > 0.0 and max_exp * math.log10(c) > _TINY_LOG10):
        return _suffix_scan_doubling(u, steps, c, segments)
    w = inv_w = None
    if c != 1.0:  # c^E and c^-E by table lookup (cheaper than exp over B x T)
        table = torch.arange(max_exp + 1, dtype=torch.float64, device=u.device) * math.log(c)
        w, inv_w = torch.take(table.exp(), exps), torch.take((-table).exp(), exps)
    y = u if w is None else u * w
    R = y.flip(1).cumsum(dim=1).flip(1)
    if segments is not None and segments.seg_last.shape[1]:
        after = shift_left(R).gather(1, segments.seg_last)
        R = R - after.gather(1, segments.seg_of)
    return R if inv_w is None else R * inv_w


def _suffix_scan_doubling(u: Tensor, steps: Tensor | None, c: float, segments: Segments | None) -> Tensor:
    a = torch.full_like(u, c)
    if steps is not None:
        a = torch.where(steps.bool(), a, torch.ones_like(a))
    if segments is not None and segments.seg_last.shape[1]:
        kept = a.gather(1, segments.seg_last)
        cut = torch.where(segments.seg_exists, torch.zeros_like(kept), kept)
        a = a.scatter(1, segments.seg_last, cut)
    return reverse_linear_scan(u, a)


# ---- chunked suffix scan: the fast path of the GAE family ----------------------------------------------------

CHUNK = 16  # tokens per chunk: one (16 x 16) matrix product per chunk, a (B, T / 16) carry scan between chunks


def _decay_matrix(c: float, L: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """(L, L) with ``M[s, i] = c^(s - i)`` for s >= i, else 0, so that ``(u @ M)_i = sum_{s >= i} c^(s-i) u_s``."""
    idx = torch.arange(L, device=device)
    diff = idx[:, None] - idx[None, :]
    powers = torch.tensor(c, dtype=torch.float64, device=device).pow(diff.clamp(min=0))
    return torch.where(diff >= 0, powers, 0.0).to(dtype)


def discounted_suffix_sum(x: Tensor, c: float) -> Tensor:
    """``y_k = sum_{j >= k} c^(j-k) x_j`` along the last dim of a small (B, K) tensor: one matrix product."""
    return x @ _decay_matrix(c, x.shape[-1], x.dtype, x.device)


def _marked_chunks(positions: list[Tensor], Q: int, L: int) -> Tensor:
    """Sorted flat ids ``b * Q + j // L`` of the chunks holding the given (B, M) positions (entries < 0 ignored)."""
    ids = []
    for pos in positions:
        rows = torch.arange(pos.shape[0], device=pos.device)[:, None].expand_as(pos)
        ok = pos >= 0
        ids.append(rows[ok] * Q + pos[ok].div(L, rounding_mode="floor"))
    flat = torch.cat(ids) if ids else torch.zeros(0, dtype=torch.long)
    if flat.numel() > 1 and bool((flat[1:] >= flat[:-1]).all()):  # row-wise sorted positions: no sort needed
        return torch.unique_consecutive(flat)
    return torch.unique(flat)


def chunk_rows(x: Tensor, chunks: Tensor, Q: int, L: int) -> Tensor:
    """(n, L) copy of the chunks ``chunks`` (flat ids b * Q + q) of x (B, T); positions >= T repeat x[:, T - 1]."""
    B, T = x.shape
    if Q * L == T and x.is_contiguous():
        return x.view(B * Q, L).index_select(0, chunks)
    pos = ((chunks % Q)[:, None] * L + torch.arange(L, device=x.device)).clamp(max=T - 1)
    return x.reshape(-1)[(chunks // Q * T)[:, None] + pos]


def _exact_chunks(
    U: Tensor, c: float, steps: Tensor | None, cut_pos: Tensor | None, chunks: Tensor, Q: int, L: int
) -> tuple[Tensor, Tensor]:
    """In-chunk solution and decay of the listed chunks with their true coefficients (doubling on (n, L)).

    Returns (loc, P), each (n, L): ``x_i = loc_i + P_i * x_(first token of the next chunk)``.
    """
    dtype, device = U.dtype, U.device
    a = torch.full((chunks.numel(), L), c, dtype=dtype, device=device)
    if steps is not None:  # padding positions (>= T) may get any coefficient: nothing follows them
        a = torch.where(chunk_rows(steps, chunks, Q, L), a, 1.0)
    if cut_pos is not None:
        rows = torch.arange(cut_pos.shape[0], device=device)[:, None].expand_as(cut_pos)
        ok = cut_pos >= 0
        p = cut_pos[ok]
        a[torch.searchsorted(chunks, rows[ok] * Q + p.div(L, rounding_mode="floor")), p % L] = 0.0
    loc = reverse_linear_scan(U[chunks], a)
    return loc, a.flip(-1).cumprod(-1).flip(-1)


def chunked_scan(
    u: Tensor, c: float, *, steps: Tensor | None = None, cut_pos: Tensor | None = None,
    mark_pos: Tensor | None = None,
) -> Tensor:
    """Solve ``x_j = u_j + a_j x_{j+1}`` (x_T = 0) along dim 1 of u (B, T) in u's dtype.

    ``a_j`` is c on steps (``steps`` (B, T) bool; None: every position), 1 on other positions (pass-through:
    neither discount step nor bootstrap; u must be 0 there) and 0 at the cut positions ``cut_pos`` (B, M) long
    (entries < 0 ignored). ``mark_pos`` (B, M') must include a position in every chunk of ``CHUNK`` tokens where
    steps and pass-through positions meet (e.g. each turn's first and last model token); unused with no ``steps``.

    Method: tokens are cut into chunks of L = ``CHUNK``. Chunks that are all steps (or all pass-through) and hold
    no cut share one coefficient pattern, so their in-chunk suffix sums are one (N, L) x (L, L) matrix product
    with the decay matrix c^(s - i) (exact for any c, no c^-E rescaling that could over/underflow). The few
    chunks with a cut or a step boundary are redone exactly by :func:`reverse_linear_scan` on (n, L). A
    (B, T / L) scan then carries each chunk's start value backwards, and one fused multiply-add adds the carry.
    """
    B, T = u.shape
    if c == 0.0 or u.numel() == 0:
        return u.clone()
    L = CHUNK
    Q = -(-T // L)
    pad = Q * L - T
    U = (F.pad(u, (0, pad)) if pad else u).reshape(B * Q, L)
    loc = U @ _decay_matrix(c, L, u.dtype, u.device)  # (B * Q, L) in-chunk sums as if the chunk were regular
    start = loc[:, 0].clone()  # chunk start value given x = 0 after the chunk
    trans = torch.full_like(start, c**L)  # coefficient of x after the chunk in its start value
    step_chunk = None
    if steps is not None:
        step_chunk = steps[:, ::L].reshape(B * Q)  # a regular chunk is all steps or all pass-through
        trans = torch.where(step_chunk, trans, 1.0)
    marks = [p for p in (cut_pos, mark_pos if steps is not None else None) if p is not None]
    chunks = _marked_chunks(marks, Q, L) if marks else torch.zeros(0, dtype=torch.long, device=u.device)
    if chunks.numel():
        loc_x, decay_x = _exact_chunks(U, c, steps, cut_pos, chunks, Q, L)
        start[chunks] = loc_x[:, 0]
        trans[chunks] = decay_x[:, 0]
    after = shift_left(reverse_linear_scan(start.view(B, Q), trans.view(B, Q)))  # x after each chunk
    decay = torch.tensor(c, dtype=torch.float64).pow(torch.arange(L, 0, -1, dtype=torch.float64)).to(u.dtype)
    out = loc.view(B, Q, L)
    if step_chunk is None:
        out.addcmul_(decay, after[..., None])
    else:
        is_step = step_chunk.view(B, Q)
        out.add_(torch.where(is_step, 0.0, after)[..., None])  # pass-through chunks: x = x after the chunk
        out.addcmul_(decay, torch.where(is_step, after, 0.0)[..., None])
    if chunks.numel():
        out.view(B * Q, L)[chunks] = loc_x + decay_x * after.reshape(B * Q)[chunks][:, None]
    out = out.view(B, Q * L)
    return out[:, :T] if pad else out


# ---- turn view ----------------------------------------------------------------------------------------------


@dataclass
class TurnView:
    """Turn-level (B, K) view of a batch whose turns are contiguous runs of model tokens, in order.

    exists: (B, K) bool; first_pos / last_pos: (B, K) long positions of each turn's first and last model token
    (0 where the turn does not exist); num_turns: (B,) long; model: (B, T) bool response mask; kappa: (B, T) int16
    (int32 for T >= 32000) sorted key, 2k + 1 on the model tokens of turn k, 2k + 2 on the other tokens after
    turn k, 0 before turn 0.
    Token-level helpers work chunk-wise (``CHUNK`` tokens): only chunks holding a turn's first or last token
    (``edge_chunks``, flat ids b * Q + q) can see kappa change, so no (B, T) int64 index is ever built.
    """

    exists: Tensor
    first_pos: Tensor
    last_pos: Tensor
    num_turns: Tensor
    model: Tensor
    kappa: Tensor

    def __post_init__(self) -> None:
        self._masks: dict[torch.dtype, Tensor] = {}
        self._chunks: dict[torch.dtype, tuple[Tensor, Tensor, Tensor]] = {}
        T = self.model.shape[1]
        self.Q = max(1, -(-T // CHUNK))
        edges = torch.stack([self.firsts_or_neg(), self.ends_or_neg()], dim=2)  # f_0 <= e_0 < f_1 <= ...: sorted
        self.edge_chunks = _marked_chunks([edges.view(edges.shape[0], 2 * self.K)], self.Q, CHUNK)

    @property
    def K(self) -> int:
        return int(self.exists.shape[1])

    @property
    def tid(self) -> Tensor:
        """(B, T) long turn id on model tokens (>= 0 elsewhere: the previous turn, or 0)."""
        return (self.kappa.long() - 1).div(2, rounding_mode="floor").clamp(min=0)

    @property
    def segments(self) -> Segments:
        return Segments(seg_of=self.tid, seg_last=self.last_pos, seg_exists=self.exists)

    def mask_as(self, dtype: torch.dtype) -> Tensor:
        """(B, T) response mask as 0/1 floats, made once per dtype: masking is then one multiply (off-mask values
        must be finite). ``bool.view(uint8).to(float)`` is several times faster than a bool cast, and a mixed-dtype
        multiply would hide the same conversion in a temporary anyway."""
        if dtype not in self._masks:
            self._masks[dtype] = self.model.view(torch.uint8).to(dtype)
        return self._masks[dtype]

    def ends_or_neg(self) -> Tensor:
        """(B, K) last model token of each turn, -1 where the turn does not exist (cut / mark positions)."""
        return torch.where(self.exists, self.last_pos, -1)

    def firsts_or_neg(self) -> Tensor:
        """(B, K) first model token of each turn, -1 where the turn does not exist."""
        return torch.where(self.exists, self.first_pos, -1)

    def _chunk_info(self, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
        """Cached (interior (B, Q) bool: chunk lies inside one turn; keep (B, Q) dtype: 1 on chunks that are all
        model tokens or hold a turn edge; edge_model (n, CHUNK) dtype: the response mask on the edge chunks)."""
        if dtype not in self._chunks:
            B, Q = self.model.shape[0], self.Q
            edge = torch.zeros(B * Q, dtype=torch.bool, device=self.model.device)
            edge[self.edge_chunks] = True
            odd = (self.kappa[:, ::CHUNK] & 1).bool().view(B * Q)  # a chunk without an edge has one kappa
            interior = (odd & ~edge).view(B, Q)
            keep = (odd | edge).view(B, Q).to(dtype)
            edge_model = chunk_rows(self.model, self.edge_chunks, Q, CHUNK).to(dtype)
            self._chunks[dtype] = (interior, keep, edge_model)
        return self._chunks[dtype]

    def mask_(self, x: Tensor, out: Tensor | None = None) -> Tensor:
        """``x`` times the 0/1 response mask, written into ``out`` (default: in place); x (B, T), finite off-mask.

        Chunk-wise: one broadcast multiply by a per-chunk 0/1 flag, then the edge chunks token by token, so no
        (B, T) mask tensor is read or made.
        """
        out = x if out is None else out
        B, T = x.shape
        Q, L = self.Q, CHUNK
        if Q * L != T or not (x.is_contiguous() and out.is_contiguous()):
            return torch.mul(x, self.mask_as(x.dtype), out=out)
        _, keep, edge_model = self._chunk_info(x.dtype)
        torch.mul(x.view(B, Q, L), keep[..., None], out=out.view(B, Q, L))
        if self.edge_chunks.numel():
            flat = out.view(B * Q, L)
            flat[self.edge_chunks] = flat[self.edge_chunks] * edge_model
        return out

    def sum_tokens(self, x: Tensor) -> Tensor:
        """(B, T) -> (B, K) float64: sum of ``x`` over the model tokens of each turn.

        A turn's tokens are contiguous: its sum is the partial sums of the chunks holding its first and last token
        plus the sums of the whole chunks between them, which lie inside the turn. Those chunk sums come from one
        read of x; only chunks inside a turn enter the prefix sums, so off-mask values never mix in.
        """
        B, T = x.shape
        Q, L = self.Q, CHUNK
        padded = (F.pad(x, (0, Q * L - T)) if Q * L != T else x).reshape(B, Q, L)
        interior, _, _ = self._chunk_info(x.dtype)
        # per-chunk sums as a matrix-vector product (a faster read of x than a last-dim sum on CPU)
        chunk_sums = torch.mv(padded.reshape(B * Q, L), padded.new_ones(L)).view(B, Q)
        inner = F.pad(torch.where(interior, chunk_sums, 0.0).to(torch.float64).cumsum(dim=1), (1, 0))  # (B, Q + 1)
        f, e = self.first_pos, self.last_pos
        qf, qe = f.div(L, rounding_mode="floor"), e.div(L, rounding_mode="floor")
        K = f.shape[1]
        idx = torch.arange(L, device=x.device)
        rows_f = padded.gather(1, qf[..., None].expand(B, K, L))
        rows_e = padded.gather(1, qe[..., None].expand(B, K, L))
        same = qf == qe
        upto = torch.where(same, e - qf * L, L - 1)  # the first chunk's part ends at e or at the chunk end
        head = torch.where((idx >= (f - qf * L)[..., None]) & (idx <= upto[..., None]), rows_f, 0.0)
        tail = torch.where(~same[..., None] & (idx <= (e - qe * L)[..., None]), rows_e, 0.0)
        middle = torch.where(same, 0.0, inner.gather(1, qe) - inner.gather(1, (qf + 1).clamp(max=Q)))
        out = head.sum(dim=-1).to(torch.float64) + tail.sum(dim=-1).to(torch.float64) + middle
        return out * self.exists

    def at_turn_end(self, x: Tensor) -> Tensor:
        """(B, T) -> (B, K): ``x`` at the last model token of each turn (0 where the turn does not exist)."""
        return x.gather(1, self.last_pos) * self.exists

    def broadcast(self, y: Tensor) -> Tensor:
        """(B, K) -> (B, T): every model token of turn k gets ``y[:, k]``; exactly 0 elsewhere.

        A chunk without a turn edge has one kappa: it is filled from the value at its first token; edge chunks
        are then written token by token.
        """
        B, T = self.model.shape
        Q, L = self.Q, CHUNK
        table = y.new_zeros(B, 2 * self.K + 1)  # table[:, kappa]: y_k at 2k + 1, 0 at even keys
        table[:, 1::2] = y[:, : self.K]
        out = table.gather(1, self.kappa[:, ::L].long())[:, :, None].expand(B, Q, L).contiguous().view(B * Q, L)
        if self.edge_chunks.numel():
            keys = chunk_rows(self.kappa, self.edge_chunks, Q, L).long()
            out[self.edge_chunks] = table[self.edge_chunks // Q].gather(1, keys)
        out = out.view(B, Q * L)
        return out[:, :T] if Q * L != T else out

    def broadcast_add_(self, x: Tensor, y: Tensor, alpha: float = 1.0) -> Tensor:
        """In place ``x += alpha * broadcast(y)`` (x (B, T), y (B, K)), chunk-wise with no (B, T) temporary."""
        B, T = x.shape
        Q, L = self.Q, CHUNK
        if Q * L != T or not x.is_contiguous():
            return x.add_(self.broadcast(y.to(x.dtype)), alpha=alpha)
        table = x.new_zeros(B, 2 * self.K + 1)
        table[:, 1::2] = alpha * y[:, : self.K].to(x.dtype)
        flat = x.view(B * Q, L)
        saved = flat[self.edge_chunks]
        x.view(B, Q, L).add_(table.gather(1, self.kappa[:, ::L].long())[..., None])
        if self.edge_chunks.numel():
            keys = chunk_rows(self.kappa, self.edge_chunks, Q, L).long()
            flat[self.edge_chunks] = saved + table[self.edge_chunks // Q].gather(1, keys)
        return x

    def set_last_turn(self, y: Tensor, row_values: Tensor) -> Tensor:
        """Add ``row_values`` (B,) to ``y`` (B, K) at each row's last turn (rows without turns unchanged)."""
        if self.K == 0:
            return y
        idx = (self.num_turns - 1).clamp(min=0)[:, None]
        return y.scatter_add(1, idx, (row_values.to(y.dtype) * (self.num_turns > 0))[:, None])


def _view_from_changes(change: Tensor, model: Tensor) -> TurnView:
    """Locate runs from ``change`` (B, T - 1) bool (the unit id differs between j and j + 1).

    kappa_j = 2 (number of run starts up to j) - model_j. Its increment from j - 1 to j is
    ``model_j + model_(j-1)`` where a run starts or ends there (2 between adjacent turns, 1 at a model/other
    border) and 0 elsewhere, so kappa is one int16 cumsum (int32 for T >= 32000) of 1-byte steps; no (B, T)
    int64 tensor is made.
    """
    B, T = model.shape
    m8 = model.view(torch.int8)
    inc = torch.empty(B, T, dtype=torch.int8, device=model.device)
    inc[:, :1] = m8[:, :1]
    torch.add(m8[:, 1:], m8[:, :-1], out=inc[:, 1:]).bitwise_and_(change.view(torch.int8).neg())  # & 0 or & -1
    kappa = inc.cumsum(dim=1, dtype=torch.int16 if T < 32000 else torch.int32)  # kappa <= T + 1
    if T:
        num_turns = (kappa[:, -1] + m8[:, -1]).div(2, rounding_mode="floor").long()
    else:
        num_turns = torch.zeros(B, dtype=torch.long, device=model.device)
    K = int(num_turns.max()) if B else 0
    queries = (2 * torch.arange(K, device=model.device, dtype=kappa.dtype) + 1).expand(B, K).contiguous()
    first = torch.searchsorted(kappa, queries, right=False)
    last = torch.searchsorted(kappa, queries, right=True) - 1
    exists = torch.arange(K, device=model.device).expand(B, K) < num_turns[:, None]
    zero = torch.zeros_like(first)
    return TurnView(
        exists=exists, first_pos=torch.where(exists, first, zero), last_pos=torch.where(exists, last, zero),
        num_turns=num_turns, model=model, kappa=kappa,
    )


TURN_ORDER_ERROR = (
    "turn_ids must number each row's turns 0, 1, 2, ... in sequence order, each turn one contiguous run "
    "of model tokens (turn k on its model tokens, -1 elsewhere); renumber the turns of each row"
)


def turn_view(turn_ids: Tensor, response_mask: Tensor) -> TurnView:
    """Build the :class:`TurnView`; raises ValueError unless each row's turns are contiguous and numbered 0..n-1.

    Needs the turn-id contract ``turn_ids >= 0`` exactly on ``response_mask`` tokens (checked by
    :meth:`AdvantageInputs.validate`). A run starts at a model token whose turn id differs from the previous
    token's, so runs are maximal stretches of one turn id; the turns are valid iff run r has turn id r, which
    is checked on the (B, K) run starts only.
    """
    model = response_mask if response_mask.dtype == torch.bool else response_mask > 0
    tv = _view_from_changes(turn_ids[:, 1:] != turn_ids[:, :-1], model)  # model/other borders change the id too
    ids = turn_ids.gather(1, tv.first_pos)
    expected = torch.arange(tv.K, device=ids.device).expand_as(ids)
    if not torch.equal(torch.where(tv.exists, ids, expected), expected):
        raise ValueError(TURN_ORDER_ERROR)
    return tv


def run_view(response_mask: Tensor) -> TurnView:
    """:class:`TurnView` whose "turns" are the maximal runs of consecutive model tokens."""
    model = response_mask if response_mask.dtype == torch.bool else response_mask > 0
    return _view_from_changes(model[:, 1:] != model[:, :-1], model)


def run_ids(response_mask: Tensor) -> Tensor:
    """(B, T) long: index of the contiguous run of model tokens each model token belongs to, -1 elsewhere."""
    model = response_mask > 0
    start = model & ~F.pad(model[:, :-1], (1, 0), value=False)
    rid = start.to(torch.int32).cumsum(dim=1) - 1
    return torch.where(model, rid, -1).long()
