"""The cross log-prob matrix of the template-collapse metrics, from the policy's own forward.

``cross[i, j] = log p(response_j | prompt_i)`` (summed over response j's tokens) for every pair of P prompts and M
responses: ``ragen.algorithms.collapse`` turns it into the in-batch MI and the retrieval accuracy (RAGEN-2, arXiv
2604.06268). Cost: one forward of ``prompt_i + response_j`` per scored pair, P * M sequences (N^2 for N sampled
prompts with their own responses), ``batch_size`` of them per forward; no backward. The number of forwards depends
only on the pairs and ``batch_size``, so every rank of a sharded model that scores the same pairs runs the same
collectives.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from ragen.algorithms.collapse import TurnCollapse, TurnPair, collapse_metrics_by_turn
from ragen.workers.logprob import token_log_probs

# (input_ids (B, T), attention_mask (B, T), target_mask (B, T)) -> (B, T) float log-probs of the tokens at the
# positions of target_mask (0 elsewhere); right padding.
LogProbFn = Callable[[Tensor, Tensor, Tensor], Tensor]


def lm_log_prob_fn(model: nn.Module, *, temperature: float = 1.0, chunk_size: int = 1024) -> LogProbFn:
    """A :data:`LogProbFn` from a causal LM (``token_log_probs``; ``temperature`` as the rollout sampled with, so the
    scores are the sampling distribution's)."""

    def score(ids: Tensor, attn: Tensor, target: Tensor) -> Tensor:
        lp, _ = token_log_probs(model, ids, attn, temperature=temperature, chunk_size=chunk_size, target_mask=target,
                                checkpoint=False)
        return lp

    return score


def _pair_batch(pairs: list[tuple[int, int]], prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]],
                pad_id: int, device: torch.device | str) -> tuple[Tensor, Tensor, Tensor]:
    """``(input_ids, attention_mask, target_mask)`` (B, T) long, right-padded with ``pad_id``: row b is
    ``prompts[i] + responses[j]`` for ``pairs[b] = (i, j)``; target_mask 1 on the response tokens."""
    width = max(len(prompts[i]) + len(responses[j]) for i, j in pairs)
    ids = torch.full((len(pairs), width), pad_id, dtype=torch.long)
    attn = torch.zeros(len(pairs), width, dtype=torch.long)
    target = torch.zeros(len(pairs), width, dtype=torch.long)
    for b, (i, j) in enumerate(pairs):
        p, r = list(prompts[i]), list(responses[j])
        ids[b, :len(p) + len(r)] = torch.tensor(p + r, dtype=torch.long)
        attn[b, :len(p) + len(r)] = 1
        target[b, len(p):len(p) + len(r)] = 1
    return ids.to(device), attn.to(device), target.to(device)


@torch.no_grad()
def cross_log_probs(log_prob_fn: LogProbFn, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], *,
                    batch_size: int = 32, pad_id: int = 0, pair_mask: Tensor | None = None,
                    device: torch.device | str = "cpu") -> Tensor:
    """``cross`` (P, M) float32: the summed log-prob of ``responses[j]`` after ``prompts[i]`` (token-id lists; every
    prompt non-empty: its last token predicts the response's first).

    ``pair_mask`` (P, M) bool scores only the pairs where it is True (NaN elsewhere), e.g. prompts and responses of
    the same turn. Pairs are sorted by length before batching (less padding); ``batch_size`` sequences per call of
    ``log_prob_fn``, each at most the longest prompt + response long.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token (it predicts the response's first token)")
    P, M = len(prompts), len(responses)
    mask = torch.ones(P, M, dtype=torch.bool) if pair_mask is None else pair_mask.bool().cpu()
    if mask.shape != (P, M):
        raise ValueError(f"pair_mask must be (P, M) = ({P}, {M}), got {tuple(mask.shape)}")
    pairs = sorted(((int(i), int(j)) for i, j in torch.nonzero(mask).tolist()),
                   key=lambda ij: (len(prompts[ij[0]]) + len(responses[ij[1]]), ij))
    cross = torch.full((P, M), float("nan"), dtype=torch.float32)
    for s in range(0, len(pairs), batch_size):
        chunk = pairs[s:s + batch_size]
        ids, attn, target = _pair_batch(chunk, prompts, responses, pad_id, device)
        sums = (log_prob_fn(ids, attn, target).float() * target).sum(dim=1).cpu()
        for b, (i, j) in enumerate(chunk):
            cross[i, j] = sums[b]
    return cross


def probe_turn_pairs(log_prob_fn: LogProbFn, pairs: Sequence[TurnPair], *, batch_size: int = 32, pad_id: int = 0,
                     device: torch.device | str = "cpu") -> TurnCollapse:
    """Collapse estimates of sampled multi-turn pairs (``ragen.algorithms.collapse.pick_pairs``: distinct prompts
    per turn): each response is scored under the prompts of its own turn only (sum over turns of n_k^2 forwards)."""
    turn = torch.tensor([p.turn for p in pairs], dtype=torch.long)
    cross = cross_log_probs(log_prob_fn, [p.prompt for p in pairs], [p.response for p in pairs],
                            batch_size=batch_size, pad_id=pad_id, pair_mask=turn[:, None] == turn[None, :],
                            device=device)
    lengths = torch.tensor([len(p.response) for p in pairs], dtype=torch.long)
    return collapse_metrics_by_turn(cross, turn, response_lengths=lengths)
