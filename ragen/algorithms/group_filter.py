"""Reward-variance (SNR) adaptive group filtering, in the style of RAGEN-2 (arXiv 2604.06268).

A group of episodes that replay one env seed and all get the same reward gives group-relative estimators nothing to
learn from: its advantages are 0, and the update it contributes is regularisation and noise. The filter ranks the
groups of a batch by their in-group reward variance and keeps the highest-variance groups, in descending order, until
the kept groups hold at least ``keep_variance_share`` of the batch's total variance (the sum over groups). Unlike a
fixed keep-ratio, the number of groups kept follows the batch: many when the signal is spread, few when a handful of
groups carry it.

Rules (all deterministic):

* order: variance descending, ties by ascending group position (the order of ``variances``, or of the sorted group
  ids in :func:`variance_share_filter`);
* the kept set is the shortest prefix of that order whose variance reaches ``keep_variance_share * total``; groups
  with zero variance (at most ``min_variance``) are never kept, so ``keep_variance_share = 1.0`` keeps exactly the
  groups with some reward spread;
* a batch whose every group has zero variance keeps **no** group: there is no reward signal to select, and the caller
  skips the policy update for the step (an update on nothing) rather than train on signal-free groups;
* groups of one episode are refused: a variance needs two episodes (ValueError; group size must be > 1).

Variances are population variances (divide by the group's episode count), in float64.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class VarianceShareSelection:
    """The groups the filter keeps and how much of the batch they hold.

    ``kept`` (K,) long: positions of the kept groups among the G groups, ascending. ``kept_group_share``: K / G.
    ``kept_variance_share``: the kept groups' variance over the total (0 when the total is 0). ``threshold``: the
    smallest kept variance (groups above it are all kept; 0.0 when nothing is kept). ``total_variance``: the sum of
    the G groups' variances.
    """

    kept: Tensor
    kept_group_share: float
    kept_variance_share: float
    threshold: float
    total_variance: float

    def as_metrics(self, prefix: str = "rollout/snr_filter") -> dict[str, float]:
        """Flat metrics for metrics.jsonl."""
        return {f"{prefix}/kept_groups": float(self.kept.numel()),
                f"{prefix}/kept_group_share": self.kept_group_share,
                f"{prefix}/kept_variance_share": self.kept_variance_share,
                f"{prefix}/threshold": self.threshold, f"{prefix}/total_variance": self.total_variance}


@dataclass(frozen=True)
class GroupFilterResult:
    """:func:`variance_share_filter`'s answer: ``selection`` over the sorted group ids ``group_ids`` (G,),
    ``kept_group_ids`` (K,) (ascending), ``keep`` (E,) bool over the input episodes (True: the episode's group is
    kept) and the per-group ``variances`` (G,) float64."""

    selection: VarianceShareSelection
    group_ids: Tensor
    kept_group_ids: Tensor
    keep: Tensor
    variances: Tensor


def select_by_variance_share(variances: Tensor, keep_variance_share: float, *,
                             min_variance: float = 1e-12) -> VarianceShareSelection:
    """Keep the highest-variance groups until they hold ``keep_variance_share`` of the total (module docstring).

    variances: (G,) in-group reward variances, >= 0. keep_variance_share in (0, 1]. Variances at most
    ``min_variance`` count as zero (rounding of equal rewards).
    """
    if not 0.0 < keep_variance_share <= 1.0:
        raise ValueError(f"keep_variance_share must be in (0, 1], got {keep_variance_share}")
    if variances.dim() != 1 or variances.numel() == 0:
        raise ValueError(f"variances must be a non-empty (G,) tensor, got shape {tuple(variances.shape)}")
    v = variances.detach().double().cpu()
    if bool(torch.isnan(v).any()) or bool((v < 0).any()):
        raise ValueError(f"variances must be >= 0 (no NaN), got {v.tolist()}")
    v = torch.where(v <= min_variance, torch.zeros_like(v), v)
    G = v.numel()
    order = sorted(range(G), key=lambda g: (-float(v[g]), g))
    ranked = v[order]
    cum = torch.cumsum(ranked, dim=0)
    total = float(cum[-1])  # summed in the same order as the prefix sums, so share 1.0 is reached exactly
    n_keep = 0
    if total > 0.0:
        target = keep_variance_share * total
        n_keep = int(torch.searchsorted(cum, torch.tensor([target], dtype=torch.float64), side="left")) + 1
        n_keep = min(n_keep, int((ranked > 0).sum()))
    kept = torch.tensor(sorted(order[:n_keep]), dtype=torch.long)
    return VarianceShareSelection(kept=kept, kept_group_share=n_keep / G,
                                  kept_variance_share=float(cum[n_keep - 1]) / total if n_keep else 0.0,
                                  threshold=float(ranked[n_keep - 1]) if n_keep else 0.0, total_variance=total)


def group_reward_variances(rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor]:
    """``(group_ids, variances)``: the sorted distinct group ids (G,) and each group's population reward variance
    (G,) float64. rewards, group_ids: (E,), one entry per episode (not per turn row). A group of one episode:
    ValueError (group size must be > 1)."""
    if rewards.shape != group_ids.shape or rewards.dim() != 1:
        raise ValueError(f"rewards and group_ids must both be (E,), got {tuple(rewards.shape)}, "
                         f"{tuple(group_ids.shape)}")
    ids, inv, counts = torch.unique(group_ids, sorted=True, return_inverse=True, return_counts=True)
    if bool((counts < 2).any()):
        lonely = ids[counts < 2].tolist()
        raise ValueError(f"reward-variance filtering needs groups of more than one episode; groups {lonely} have "
                         f"one: group size must be > 1 (set rollout.group_size > 1: episodes that replay one seed)")
    r = rewards.detach().double().cpu()
    inv = inv.cpu()
    n = counts.double().cpu()
    mean = torch.zeros(ids.numel(), dtype=torch.float64).index_add_(0, inv, r) / n
    var = torch.zeros_like(mean).index_add_(0, inv, (r - mean[inv]).square()) / n
    return ids, var


def variance_share_filter(rewards: Tensor, group_ids: Tensor, keep_variance_share: float, *,
                          min_variance: float = 1e-12) -> GroupFilterResult:
    """The filter over episodes: rewards, group_ids (E,) (one entry per training episode; leave failed episodes out
    first). Returns the kept groups and ``keep`` (E,) bool, True on the episodes of kept groups."""
    ids, var = group_reward_variances(rewards, group_ids)
    sel = select_by_variance_share(var, keep_variance_share, min_variance=min_variance)
    kept_ids = ids[sel.kept.to(ids.device)]
    return GroupFilterResult(selection=sel, group_ids=ids, kept_group_ids=kept_ids,
                             keep=torch.isin(group_ids, kept_ids), variances=var)
