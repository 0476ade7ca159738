"""Template-collapse metrics: does the policy's response depend on its prompt?

Method from RAGEN-2 (arXiv 2604.06268): a policy in *template collapse* answers every prompt with the same kind of
response, so its responses carry no information about the prompt although their entropy can stay high (entropy does
not reveal it). The in-batch estimate of the mutual information I(prompt; response) does: score every sampled
response under every sampled prompt and compare the matched score with the average over prompts.

Input, the cross matrix ``cross`` (P, M) float: ``cross[i, j] = log p(response_j | prompt_i)``, summed over response
j's tokens, for P *distinct* prompts and M responses; ``owner`` (M,) long gives response j's own prompt (default:
``arange``, the square case P = M where response i answers prompt i). Outputs, per response j:

* pointwise MI ``cross[owner_j, j] - log((1/P) * sum_i exp(cross[i, j]))`` (nats). Its mean over responses is the
  estimate ``mi``: at most log P (the matched term is one of the P terms of the mean), 0 when a column is constant
  (the response is as likely under every prompt), and it can be negative for a column whose own prompt scores below
  the average (a sample value, not a bug; a column whose own prompt scores highest is never negative). Averaged over
  responses sampled from the policy that scores them, it is exactly I(X; Z) with X uniform over the P prompts
  (column j's expectation is KL(p(. | x_j) || mean_i p(. | x_i)) >= 0), so the scores must be the sampling
  distribution's: the rollout's weights and temperature. A clearly negative mean says the scorer is not the sampler.
* retrieval credit: 1 when the own prompt scores strictly highest in the column, 0 when another prompt scores
  higher, 1/k when the own prompt ties with k - 1 others at the top (the expected hit rate of a uniform tie-break).
  Its mean ``retrieval_acc`` is at chance, 1/P, for a policy that ignores its prompt (every column constant), and
  1 for one whose response identifies its prompt.

Distinct prompts matter: two identical prompts score every response identically, which caps both numbers whatever
the policy does. :func:`distinct_prompts` picks one row per distinct prompt (deterministically, or with an explicit
``torch.Generator``). Multi-turn rows: :func:`turn_pairs` cuts each row into (prompt, response) pairs per turn (the
prompt of turn k is everything before turn k's first model token) and :func:`collapse_metrics_by_turn` scores the
responses of each turn against the prompts of the same turn only.

The model-facing part (filling ``cross`` with the policy's forward) is ``ragen.workers.collapse_probe``; this module
only does tensor arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class CollapseMetrics:
    """The collapse estimates over ``n_responses`` responses (all nats except the accuracies).

    ``mi``: mean pointwise in-batch MI (sequence log-probs); ``mi_per_token``: the same estimator applied to per-token
    mean log-probs (``cross[:, j] / length_j``; None without lengths; also at most log P, and it saturates later than
    ``mi`` for long responses, whose sequence scores differ by many nats); ``retrieval_acc``: mean retrieval credit;
    ``chance_acc`` and ``mi_bound``: what a prompt-blind policy's accuracy and a perfectly prompt-identifying policy's
    MI would be (1/P and log P, averaged over responses when prompt counts differ, e.g. per turn).
    """

    mi: float
    retrieval_acc: float
    chance_acc: float
    mi_bound: float
    n_responses: int
    mi_per_token: float | None = None

    def as_metrics(self, prefix: str = "collapse") -> dict[str, float]:
        """Flat ``{prefix}/name: value`` entries for metrics.jsonl (``mi_per_token`` only when computed)."""
        out = {f"{prefix}/mi": self.mi, f"{prefix}/retrieval_acc": self.retrieval_acc,
               f"{prefix}/chance_acc": self.chance_acc, f"{prefix}/mi_bound": self.mi_bound,
               f"{prefix}/n_responses": float(self.n_responses)}
        if self.mi_per_token is not None:
            out[f"{prefix}/mi_per_token"] = self.mi_per_token
        return out


@dataclass(frozen=True)
class TurnCollapse:
    """Collapse estimates of multi-turn pairs: ``overall`` over every response (each scored against the prompts of
    its own turn), ``per_turn[k]`` over turn k's responses. Turns with fewer than two distinct prompts are left out
    of both (nothing to compare)."""

    overall: CollapseMetrics
    per_turn: dict[int, CollapseMetrics]

    def as_metrics(self, prefix: str = "collapse") -> dict[str, float]:
        """``{prefix}/mi`` etc. for ``overall``, ``{prefix}/turn_{k}/mi`` etc. per turn."""
        out = self.overall.as_metrics(prefix)
        for k, m in sorted(self.per_turn.items()):
            out.update(m.as_metrics(f"{prefix}/turn_{k}"))
        return out


@dataclass(frozen=True)
class TurnPair:
    """One response of a rollout row and the prompt it answered: ``row`` of the batch, ``turn`` k, ``prompt`` (every
    real token before turn k's first model token: initial prompt, earlier turns, observations) and ``response`` (turn
    k's model tokens), both token-id lists."""

    row: int
    turn: int
    prompt: list[int]
    response: list[int]


def _owner(cross: Tensor, owner: Tensor | None) -> Tensor:
    """Validated (M,) long owner index; the square default is ``arange``."""
    if cross.dim() != 2:
        raise ValueError(f"cross must be (P, M), got shape {tuple(cross.shape)}")
    P, M = cross.shape
    if owner is None:
        if P != M:
            raise ValueError(f"cross is {P} x {M}: pass owner (M,), the prompt of each response")
        return torch.arange(M, device=cross.device)
    if owner.shape != (M,) or bool((owner < 0).any()) or bool((owner >= P).any()):
        raise ValueError(f"owner must be (M,) = ({M},) with values in [0, {P}), got {owner.tolist()}")
    return owner.to(device=cross.device, dtype=torch.long)


def _check(cross: Tensor) -> None:
    """Reject what the estimates cannot use: fewer than two prompts, NaN, +inf (-inf, zero probability, is fine)."""
    if cross.shape[0] < 2:
        raise ValueError(f"collapse metrics need at least 2 distinct prompts, got {cross.shape[0]}")
    if bool(torch.isnan(cross).any()) or bool(torch.isposinf(cross).any()):
        raise ValueError("cross holds NaN or +inf: every (prompt, response) pair needs a finite log-prob (or -inf)")


def pointwise_mi(cross: Tensor, owner: Tensor | None = None) -> Tensor:
    """(M,) float64: ``cross[owner_j, j] - logmeanexp_i cross[i, j]`` per response j (see the module docstring)."""
    own = _owner(cross, owner)
    _check(cross)
    c = cross.double()
    matched = c.gather(0, own[None, :]).squeeze(0)
    return matched - (torch.logsumexp(c, dim=0) - math.log(c.shape[0]))


def retrieval_credit(cross: Tensor, owner: Tensor | None = None) -> Tensor:
    """(M,) float64 in [0, 1]: 1 if response j's own prompt scores strictly highest in column j, 1/k if it ties with
    k - 1 other prompts at the maximum, 0 otherwise (exact float comparison)."""
    own = _owner(cross, owner)
    _check(cross)
    c = cross.double()
    top = c.max(dim=0).values
    at_top = c == top[None, :]
    own_top = at_top.gather(0, own[None, :]).squeeze(0)
    return torch.where(own_top, 1.0 / at_top.sum(dim=0).double(), torch.zeros_like(top))


def collapse_metrics(cross: Tensor, owner: Tensor | None = None,
                     response_lengths: Tensor | None = None) -> CollapseMetrics:
    """The collapse estimates of one cross matrix ``cross`` (P, M) (module docstring), with ``owner`` (M,) long
    (default ``arange``, square) and optionally ``response_lengths`` (M,) (token counts, > 0) for ``mi_per_token``."""
    mi = pointwise_mi(cross, owner)
    per_token = None
    if response_lengths is not None:
        lengths = response_lengths.to(device=cross.device, dtype=torch.float64)
        if lengths.shape != (cross.shape[1],) or bool((lengths <= 0).any()):
            raise ValueError(f"response_lengths must be (M,) = ({cross.shape[1]},) positive token counts")
        per_token = float(pointwise_mi(cross.double() / lengths[None, :], owner).mean())
    P = cross.shape[0]
    return CollapseMetrics(mi=float(mi.mean()), retrieval_acc=float(retrieval_credit(cross, owner).mean()),
                           chance_acc=1.0 / P, mi_bound=math.log(P), n_responses=int(cross.shape[1]),
                           mi_per_token=per_token)


def _pooled(parts: list[tuple[CollapseMetrics, int]]) -> CollapseMetrics:
    """Response-weighted mean of per-turn estimates (``parts``: (metrics, prompt count))."""
    w = [m.n_responses for m, _ in parts]
    n = sum(w)

    def avg(values: list[float]) -> float:
        return sum(v * wi for v, wi in zip(values, w, strict=True)) / n

    ms = [m for m, _ in parts]
    per_token = None if ms[0].mi_per_token is None else avg([m.mi_per_token for m in ms])
    return CollapseMetrics(mi=avg([m.mi for m in ms]), retrieval_acc=avg([m.retrieval_acc for m in ms]),
                           chance_acc=avg([1.0 / p for _, p in parts]), mi_bound=avg([math.log(p) for _, p in parts]),
                           n_responses=n, mi_per_token=per_token)


def collapse_metrics_by_turn(cross: Tensor, turn: Tensor, response_lengths: Tensor | None = None) -> TurnCollapse:
    """Per-turn collapse estimates of a square ``cross`` (N, N) whose prompt i and response i belong to turn
    ``turn[i]`` ((N,) long): each response is scored against the prompts of its own turn only (the block
    ``turn[i] == turn[j] == k``; entries outside those blocks are never read, so they may be NaN: unscored).
    ``overall`` is the response-weighted mean of the turns. Turns with one prompt are skipped; none left: ValueError.
    """
    if cross.dim() != 2 or cross.shape[0] != cross.shape[1] or turn.shape != (cross.shape[0],):
        raise ValueError(f"cross must be square (N, N) and turn (N,), got {tuple(cross.shape)}, {tuple(turn.shape)}")
    per_turn: dict[int, CollapseMetrics] = {}
    counts: dict[int, int] = {}
    for k in torch.unique(turn, sorted=True).tolist():
        idx = torch.nonzero(turn == k).flatten().to(cross.device)
        if idx.numel() < 2:
            continue
        lengths = None if response_lengths is None else response_lengths[idx.to(response_lengths.device)]
        per_turn[int(k)] = collapse_metrics(cross[idx][:, idx], response_lengths=lengths)
        counts[int(k)] = idx.numel()
    if not per_turn:
        raise ValueError(f"no turn has 2 or more prompts to compare (turns {turn.tolist()})")
    return TurnCollapse(overall=_pooled([(m, counts[k]) for k, m in per_turn.items()]), per_turn=per_turn)


def distinct_prompts(prompts: Sequence[Sequence[int]], limit: int | None = None,
                     generator: torch.Generator | None = None) -> list[int]:
    """Ascending row indices of at most ``limit`` rows with pairwise distinct ``prompts`` (token-id lists).

    Each distinct prompt is represented by its first row. When more than ``limit`` prompts are distinct, the pick is
    spread evenly over them in row order (no randomness), or uniformly at random through ``generator`` when given.
    """
    first: dict[tuple[int, ...], int] = {}
    for r, p in enumerate(prompts):
        first.setdefault(tuple(int(t) for t in p), r)
    rows = sorted(first.values())
    if limit is None or limit >= len(rows):
        return rows
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    if generator is None:
        return [rows[(i * len(rows)) // limit] for i in range(limit)]
    pick = torch.randperm(len(rows), generator=generator)[:limit]
    return sorted(rows[int(i)] for i in pick)


def turn_pairs(input_ids: Tensor, attention_mask: Tensor, turn_ids: Tensor,
               rows: Sequence[int] | None = None) -> list[TurnPair]:
    """The (prompt, response) pairs of rollout rows, ordered by (row, turn).

    input_ids, attention_mask, turn_ids: (B, T), right-padded, ``turn_ids`` k on turn k's model tokens and -1
    elsewhere (``RolloutBatch``'s layout; both the trajectory and the turn layout). ``rows`` limits the rows read.
    Turn k's prompt is the row's real tokens before turn k's first model token, as the policy saw them unless the
    episode's history was cut for the context window (``RolloutBatch.context_cut``: leave those rows out).
    """
    pairs = []
    for r in range(input_ids.shape[0]) if rows is None else rows:
        real = attention_mask[r].bool()
        for k in torch.unique(turn_ids[r][real & (turn_ids[r] >= 0)], sorted=True).tolist():
            at = torch.nonzero((turn_ids[r] == k) & real).flatten()
            start = int(at[0])
            prompt = input_ids[r, :start][real[:start]].tolist()
            pairs.append(TurnPair(row=int(r), turn=int(k), prompt=prompt, response=input_ids[r, at].tolist()))
    return pairs


def pick_pairs(pairs: Sequence[TurnPair], limit: int | None = None,
               generator: torch.Generator | None = None) -> list[TurnPair]:
    """Per turn, at most ``limit`` pairs with distinct prompts and non-empty responses (:func:`distinct_prompts`
    within each turn), ordered by (turn, row): the sample :func:`collapse_metrics_by_turn` expects."""
    out: list[TurnPair] = []
    for k in sorted({p.turn for p in pairs}):
        cand = [p for p in pairs if p.turn == k and p.response]
        out += [cand[i] for i in distinct_prompts([p.prompt for p in cand], limit, generator)]
    return out
