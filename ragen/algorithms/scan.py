"""Building blocks of the estimators: discounted suffix sums, model-token compaction and the per-turn view.

Sequences reach 16k tokens, so nothing here loops over tokens in Python. The estimators work on *compacted*
rows: each row's model tokens p_1 < ... < p_n gathered in order into a (B, N) tensor (N = the longest row's
n), so "the next model token" is simply the next column and env / pad tokens cannot leak into any recursion.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

CHUNK = 64  # columns per block of discounted_suffix_sum: c^CHUNK stays far from float64 underflow for c >= 1e-4


def discounted_suffix_sum(u: Tensor, c: float) -> Tensor:
    """``x_j = sum_{s >= j} c^(s - j) u_s`` along the last dim of ``u`` (B, N), i.e. ``x_j = u_j + c x_{j+1}``.

    Computed in float64 in blocks of ``CHUNK`` columns: recursive doubling inside each block (after the pass with
    stride d, x_j sums the window [j, j + 2d) of its block; Hillis & Steele 1986), then a loop over the N / CHUNK
    blocks carries each block's total into the blocks before it. Exponents never exceed CHUNK, so any c in
    [0, 1] is exact to rounding, and float64 keeps undiscounted sums over 16k tokens exact to ~1e-12.
    """
    x = u.to(torch.float64)
    B, N = x.shape
    if N == 0 or c == 0.0:
        return x.clone()
    L = min(CHUNK, N)
    M = -(-N // L)
    blocks = F.pad(x, (0, M * L - N)).view(B, M, L).clone()
    d = 1
    while d < L:
        blocks[..., :-d] += c**d * blocks[..., d:]
        d *= 2
    heads = blocks[:, :, 0].T.contiguous()  # (M, B): each block's sum from its first column
    carry = torch.zeros(M + 1, B, dtype=torch.float64, device=x.device)  # carry[m]: x at the start of block m
    for m in range(M - 1, -1, -1):
        torch.add(heads[m], carry[m + 1], alpha=c**L, out=carry[m])
    blocks += powers(c, L, x.device)[1:].flip(0) * carry[1:].T[:, :, None]  # c^(L - i) times the next block
    return blocks.view(B, M * L)[:, :N]


def powers(c: float, n: int, device: torch.device | None = None) -> Tensor:
    """(n + 1,) float64: c^0, c^1, ..., c^n (gather by exponent instead of a (B, N) pow)."""
    return torch.tensor(c, dtype=torch.float64, device=device).pow(torch.arange(n + 1, dtype=torch.float64,
                                                                                 device=device))


def compact(steps: Tensor) -> tuple[Tensor, Tensor]:
    """Positions of each row's step tokens, in order: (pos (B, N) long, valid (B, N) bool).

    steps: (B, T) bool. ``pos[b, i]`` is the position of row b's i-th step token for ``i < n_b`` (``valid``), 0
    past it. N = max_b n_b.
    """
    B, T = steps.shape
    counts = steps.sum(dim=1)
    N = int(counts.max()) if B and T else 0
    rows, cols = steps.nonzero(as_tuple=True)  # row-major: each row's step positions in order
    rank = torch.arange(rows.numel(), device=steps.device) - (counts.cumsum(0) - counts)[rows]
    pos = torch.zeros(B, N, dtype=torch.long, device=steps.device)
    pos[rows, rank] = cols
    return pos, torch.arange(N, device=steps.device)[None, :] < counts[:, None]


def scatter_back(x: Tensor, pos: Tensor, valid: Tensor, T: int) -> Tensor:
    """Inverse of a gather through :func:`compact`: (B, N) -> (B, T), 0 wherever ``valid`` put nothing."""
    out = torch.zeros(x.shape[0], T + 1, dtype=x.dtype, device=x.device)
    out.scatter_(1, torch.where(valid, pos, T), x)  # invalid entries land in the spare column T
    return out[:, :T]


TURN_ORDER_ERROR = (
    "turn_ids must number each row's turns 0, 1, 2, ... in sequence order (turn k on its model tokens, -1 "
    "elsewhere); renumber the turns of row {row} (model token {index} has turn id {got}, expected {want})"
)


@dataclass
class TurnView:
    """Where the turns of a batch are.

    model: (B, T) bool response mask. pos / valid: :func:`compact` of ``model``; tid: (B, N) long turn id of each
    compacted model token (0 past the row's end). num_turns: (B,) long. exists: (B, K) bool. first: (B, K) long
    index into the compacted row of each turn's first model token s_k (0 where the turn does not exist).
    """

    model: Tensor
    pos: Tensor
    valid: Tensor
    tid: Tensor
    num_turns: Tensor
    exists: Tensor
    first: Tensor

    @property
    def K(self) -> int:
        return int(self.exists.shape[1])

    def gather(self, x: Tensor) -> Tensor:
        """(B, T) -> (B, N): ``x`` at each row's model tokens in order (0 past the row's end)."""
        g = x.gather(1, self.pos)
        return torch.where(self.valid, g, torch.zeros((), dtype=g.dtype, device=g.device))

    def scatter(self, x: Tensor) -> Tensor:
        """(B, N) -> (B, T), exactly 0 off the model tokens."""
        return scatter_back(x, self.pos, self.valid, self.model.shape[1])

    def sum_tokens(self, x: Tensor) -> Tensor:
        """(B, T) -> (B, K) float64: the sum of ``x`` over the model tokens of each turn."""
        return self.sum_per_turn(self.gather(x))

    def sum_per_turn(self, xc: Tensor) -> Tensor:
        """(B, N) compacted (0 past each row's end) -> (B, K) float64: the sum over each turn's tokens."""
        out = torch.zeros(self.exists.shape, dtype=torch.float64, device=xc.device)
        return out.scatter_add_(1, self.tid, xc.to(torch.float64))

    def at_first(self, x: Tensor) -> Tensor:
        """(B, T) -> (B, K) float64: ``x`` at the first model token of each turn, 0 where the turn does not exist."""
        return torch.where(self.exists, self.gather(x).to(torch.float64).gather(1, self.first), 0.0)

    def per_token(self, y: Tensor) -> Tensor:
        """(B, K) -> (B, N): each compacted model token gets its turn's entry (0 past the row's end)."""
        g = y.gather(1, self.tid)
        return torch.where(self.valid, g, torch.zeros((), dtype=g.dtype, device=g.device))

    def broadcast(self, y: Tensor) -> Tensor:
        """(B, K) -> (B, T): every model token of turn k gets ``y[:, k]``; exactly 0 elsewhere."""
        return self.scatter(self.per_token(y))


def turn_view(turn_ids: Tensor, response_mask: Tensor) -> TurnView:
    """Build the :class:`TurnView`; raises ValueError unless each row's model tokens, in order, carry turn ids
    0, 0, ..., 1, 1, ..., n - 1 (every turn present, numbered in sequence order).

    Needs the turn-id contract ``turn_ids >= 0`` exactly on ``response_mask`` tokens (checked by
    :meth:`AdvantageInputs.validate`).
    """
    model = response_mask if response_mask.dtype == torch.bool else response_mask > 0
    pos, valid = compact(model)
    tid = torch.where(valid, turn_ids.gather(1, pos), 0)
    # in order, each model token's id equals the previous one's or exceeds it by 1; the first is 0
    prev = F.pad(tid[:, :-1], (1, 0), value=0)
    later = torch.arange(tid.shape[1], device=tid.device)[None, :] > 0
    bad = valid & ~((tid == prev) | ((tid == prev + 1) & later))
    if bool(bad.any()):
        b, i = (int(v) for v in bad.nonzero()[0])
        want = f"{int(prev[b, i])} or {int(prev[b, i]) + 1}" if i else "0"
        raise ValueError(TURN_ORDER_ERROR.format(row=b, index=i, got=int(tid[b, i]), want=want))
    B, N = tid.shape
    num_turns = torch.where(valid, tid + 1, 0).amax(dim=1) if N else torch.zeros(B, dtype=torch.long)
    K = int(num_turns.max()) if B else 0
    exists = torch.arange(K, device=tid.device)[None, :] < num_turns[:, None]
    # first model token of turn k: the number of model tokens of turns < k
    counts = torch.zeros(B, K, dtype=torch.long, device=tid.device).scatter_add_(1, tid, valid.long())
    first = torch.where(exists, counts.cumsum(dim=1) - counts, 0)
    return TurnView(model=model, pos=pos, valid=valid, tid=tid, num_turns=num_turns, exists=exists, first=first)
