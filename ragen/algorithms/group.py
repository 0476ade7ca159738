"""Critic-free trajectory-level estimators: GRPO, RLOO and REINFORCE++.

Token tensors are (B, T); ``response_mask`` is 1 on model tokens; ``group_ids`` (B,) marks trajectories that
share an env seed. A trajectory's total reward is the sum of ``token_rewards`` over its model tokens.
Outputs (adv, ret) are 0 off model tokens; with no critic to train, ``ret`` is the quantity the advantage was
built from (the normalised score for GRPO/RLOO, the discounted reward-to-go for REINFORCE++).
``failed`` (B,) bool marks rows whose env raised: they take no part in their group's statistics and get 0.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ragen.algorithms.masked import group_normalize, masked_sum, masked_whiten
from ragen.algorithms.scan import compact, discounted_suffix_sum, scatter_back


def _float(x: Tensor) -> Tensor:
    return x.to(torch.promote_types(x.dtype, torch.float32))


def total_rewards(token_rewards: Tensor, response_mask: Tensor) -> Tensor:
    """(B,) sum of each trajectory's rewards on its model tokens."""
    return masked_sum(_float(token_rewards), response_mask > 0, dim=1)


def broadcast_rows(x: Tensor, response_mask: Tensor) -> Tensor:
    """(B,) -> (B, T): each row's scalar on its model tokens, 0 elsewhere."""
    m = response_mask > 0
    return torch.where(m, x[:, None].expand(m.shape), torch.zeros((), dtype=x.dtype, device=x.device))


def valid_rows(failed: Tensor | None, B: int, device: torch.device) -> Tensor:
    """(B,) bool: rows that take part in group statistics (all but ``failed``)."""
    return torch.ones(B, dtype=torch.bool, device=device) if failed is None else ~failed.bool()


def grpo(
    token_rewards: Tensor, response_mask: Tensor, group_ids: Tensor, *, eps: float = 1e-6, norm_by_std: bool = True,
    failed: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """GRPO (Shao et al. 2024, DeepSeekMath sec. 4.1.2): Ahat of the total reward within each group.

    ``(R - mean) / (std + eps)`` with the unbiased group std (``R - mean`` if not ``norm_by_std``), on every
    model token of the trajectory.
    """
    R = total_rewards(token_rewards, response_mask)
    score = group_normalize(R, group_ids, valid_rows(failed, R.shape[0], R.device), eps=eps, norm_by_std=norm_by_std)
    adv = broadcast_rows(score, response_mask)
    return adv, adv.clone()


def rloo(
    token_rewards: Tensor, response_mask: Tensor, group_ids: Tensor, *, failed: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """RLOO (Ahmadian et al. 2024): total reward minus the mean total reward of the *other* group members.

    Equals n / (n - 1) * (R - group mean); a trajectory alone in its group (among valid rows) gets 0.
    """
    R = total_rewards(token_rewards, response_mask)
    w = valid_rows(failed, R.shape[0], R.device).to(R.dtype)
    _, inv = torch.unique(group_ids, return_inverse=True)
    G = int(inv.max()) + 1 if R.numel() else 0
    count = torch.zeros(G, dtype=R.dtype, device=R.device).index_add_(0, inv, w)
    total = torch.zeros_like(count).index_add_(0, inv, R * w)
    n = count[inv]
    others_mean = (total[inv] - R) / (n - 1).clamp(min=1)
    score = torch.where((n > 1) & (w > 0), R - others_mean, torch.zeros_like(R))
    adv = broadcast_rows(score, response_mask)
    return adv, adv.clone()


def reinforce_pp(
    token_rewards: Tensor, response_mask: Tensor, *, gamma: float = 1.0, eps: float = 1e-6
) -> tuple[Tensor, Tensor]:
    """REINFORCE++ (Hu 2025): discounted reward-to-go over model tokens, whitened across the whole batch.

    G_{p_i} = r_{p_i} + gamma * G_{p_{i+1}} over model tokens only (env tokens are not discount steps).
    adv = masked_whiten(G) (population std, see :mod:`ragen.algorithms.masked`); ret = G.
    """
    rewards = _float(token_rewards)
    model = response_mask > 0
    pos, valid = compact(model)
    r = torch.where(valid, rewards.to(torch.float64).gather(1, pos), 0.0)
    ret = scatter_back(discounted_suffix_sum(r, gamma).to(rewards.dtype), pos, valid, model.shape[1])
    return masked_whiten(ret, model, eps=eps), ret
