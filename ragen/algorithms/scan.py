"""Vectorisation primitives for the estimators: discounted suffix sums and the per-turn view.

Sequences reach 16k tokens, so nothing here loops over tokens in Python, and nothing gathers the model tokens
into a compacted copy (advanced indexing over a 64 x 16k batch costs more than the whole estimator):
- :func:`suffix_scan` computes ``x_j = u_j + a_j * x_{j+1}`` on the (B, T) layout, where ``a_j`` is the
  discount c on step tokens, 1 on pass-through tokens (env/pad: neither discount steps nor bootstraps) and 0
  after the end of a segment (a turn). Fast path: with E_j the number of steps before j,
  ``x_j = c^-E_j * sum_{s >= j, same segment} c^E_s u_s``, i.e. one reverse cumsum in float64 (stable: every
  term after j is at most c^E_j, so the rounding error stays relative to the result). When c^E would
  underflow (small c on very long rows) it falls back to :func:`reverse_linear_scan`.
- :func:`reverse_linear_scan` solves the same recursion by recursive doubling (Hillis & Steele 1986),
  ceil(log2 N) elementwise passes; it serves the small (B, K) turn-level problems and the fallback.
- :class:`TurnView` locates each turn's first/last model token with a sorted key and ``searchsorted``.
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
    ``x_j`` holds the sum over the window [j, j + 2d) and ``p_j`` the product of the coefficients over it, so
    log2(N) passes finish; the loop stops early once every window product is 0.
    """
    x = b
    p = torch.as_tensor(a, dtype=b.dtype, device=b.device).expand_as(b)
    n = b.shape[-1]
    d = 1
    while d < n:
        x = x + p * F.pad(x[..., d:], (0, d))
        p = p * F.pad(p[..., d:], (0, d))
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


@dataclass
class TurnView:
    """Turn-level (B, K) view of a batch whose turns are contiguous runs of model tokens, in order.

    exists: (B, K) bool; first_pos / last_pos: (B, K) long positions of each turn's first and last model token
    (0 where the turn does not exist); num_turns: (B,) long; tid: (B, T) long turn id clamped to >= 0;
    model: (B, T) bool response mask.
    """

    exists: Tensor
    first_pos: Tensor
    last_pos: Tensor
    num_turns: Tensor
    tid: Tensor
    model: Tensor

    @property
    def K(self) -> int:
        return int(self.exists.shape[1])

    @property
    def segments(self) -> Segments:
        return Segments(seg_of=self.tid, seg_last=self.last_pos, seg_exists=self.exists)

    def sum_tokens(self, x: Tensor) -> Tensor:
        """(B, T) -> (B, K) float64: sum of ``x`` over the model tokens of each turn."""
        vals = x.to(torch.float64) * self.model
        csum = F.pad(vals.cumsum(dim=1), (1, 0))  # csum[:, j] = sum of vals[:, :j]
        out = csum.gather(1, self.last_pos + 1) - csum.gather(1, self.first_pos)
        return out * self.exists

    def at_turn_end(self, x: Tensor) -> Tensor:
        """(B, T) -> (B, K): ``x`` at the last model token of each turn (0 where the turn does not exist)."""
        return x.gather(1, self.last_pos) * self.exists

    def broadcast(self, y: Tensor) -> Tensor:
        """(B, K) -> (B, T): every model token of turn k gets ``y[:, k]``; 0 elsewhere."""
        if self.K == 0:
            return y.new_zeros(self.tid.shape)
        return y.gather(1, self.tid) * self.model

    def set_last_turn(self, y: Tensor, row_values: Tensor) -> Tensor:
        """Add ``row_values`` (B,) to ``y`` (B, K) at each row's last turn (rows without turns unchanged)."""
        if self.K == 0:
            return y
        idx = (self.num_turns - 1).clamp(min=0)[:, None]
        return y.scatter_add(1, idx, (row_values.to(y.dtype) * (self.num_turns > 0))[:, None])


def turn_view(turn_ids: Tensor, response_mask: Tensor) -> TurnView:
    """Build the :class:`TurnView`; raises ValueError unless each row's turns are contiguous and numbered 0..n-1.

    Sorted key: with rho_j the running max turn id, kappa_j = 2 rho_j + 1 on model tokens and 2 rho_j + 2 on
    other tokens. Valid turns make kappa non-decreasing, turn k's model tokens are exactly the positions with
    kappa = 2k + 1, and ``searchsorted`` finds their first and last position.
    """
    model = response_mask > 0
    B, T = model.shape
    tid_f = torch.where(model, turn_ids, -1).to(torch.float32)
    running = tid_f.cummax(dim=1).values if T else tid_f
    kappa = 2.0 * running + 2.0 - model.to(torch.float32)
    num_turns = (running[:, -1] + 1).long() if T else torch.zeros(B, dtype=torch.long, device=model.device)
    K = int(num_turns.max()) if B else 0
    queries = (2.0 * torch.arange(K, device=model.device, dtype=torch.float32) + 1.0).expand(B, K).contiguous()
    first = torch.searchsorted(kappa, queries, right=False)
    last = torch.searchsorted(kappa, queries, right=True) - 1
    exists = torch.arange(K, device=model.device).expand(B, K) < num_turns[:, None]
    bad_order = bool((kappa[:, 1:] < kappa[:, :-1]).any()) or bool((model & (tid_f < running)).any())
    if bad_order or bool((exists & (last < first)).any()):
        raise ValueError(
            "turn_ids must number each row's turns 0, 1, 2, ... in sequence order, each turn one contiguous run "
            "of model tokens (turn k on its model tokens, -1 elsewhere); renumber the turns of each row"
        )
    tid = torch.where(model, turn_ids, 0).long()
    zero = torch.zeros_like(first)
    return TurnView(
        exists=exists, first_pos=torch.where(exists, first, zero), last_pos=torch.where(exists, last, zero),
        num_turns=num_turns, tid=tid, model=model,
    )


def run_ids(response_mask: Tensor) -> Tensor:
    """(B, T) long: index of the contiguous run of model tokens each model token belongs to, -1 elsewhere."""
    model = response_mask > 0
    start = model & ~F.pad(model[:, :-1], (1, 0), value=False)
    rid = start.to(torch.int32).cumsum(dim=1) - 1
    return torch.where(model, rid, -1).long()
