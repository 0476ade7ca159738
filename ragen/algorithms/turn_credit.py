"""Critic-free turn-level credit: MS-GRPO, MS-PO ("turn-level credit assignment") and GiGPO.

Token tensors are (B, T); ``turn_ids`` is k on the model tokens of turn k (-1 elsewhere); ``group_ids`` (B,)
marks trajectories that share an env seed; ``failed`` (B,) bool marks rows whose env raised, which take no part
in any group statistic and get 0. Ahat is group normalisation (:func:`group_normalize`: unbiased std,
eps outside the sqrt, 0 for constant groups). Every model token of turn k gets its turn's advantage; outputs
(adv, ret) are 0 off model tokens and ``ret`` equals ``adv`` (no critic).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ragen.algorithms.group import total_rewards, valid_rows
from ragen.algorithms.masked import group_normalize
from ragen.algorithms.scan import TurnView, discounted_suffix_sum, turn_view


def _per_turn_normalize(
    x: Tensor, tv: TurnView, group_ids: Tensor, valid: Tensor, *, eps: float, norm_by_std: bool
) -> Tensor:
    """(B, K) -> (B, K): Ahat_k, normalising column k over the group's valid trajectories that have a turn k."""
    B, K = x.shape
    _, inv = torch.unique(group_ids, return_inverse=True)
    key = inv[:, None] * K + torch.arange(K, device=x.device)[None, :]
    part = (tv.exists & valid[:, None]).reshape(-1)
    out = group_normalize(x.reshape(-1), key.reshape(-1), part, eps=eps, norm_by_std=norm_by_std)
    return out.view(B, K)


def _step_rewards(step_rewards: Tensor, tv: TurnView, dtype: torch.dtype) -> Tensor:
    rt = step_rewards[:, : tv.K].to(dtype)
    return torch.where(tv.exists, rt, torch.zeros_like(rt))


def ms_grpo(
    step_rewards: Tensor,
    outcome_rewards: Tensor,
    response_mask: Tensor,
    turn_ids: Tensor,
    group_ids: Tensor,
    *,
    step_advantage_coef: float = 1.0,
    eps: float = 1e-6,
    norm_by_std: bool = True,
    failed: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """MS-GRPO: tokens of turn k get ``Ahat(R^O) + step_advantage_coef * Ahat_k(R^T[:, k])``.

    step_rewards: (B, K) R^T; outcome_rewards: (B,) R^O. Ahat(R^O) normalises over the whole group, Ahat_k over
    the group's trajectories that have a turn k.
    """
    dtype = torch.promote_types(outcome_rewards.dtype, torch.float32)
    tv = turn_view(turn_ids, response_mask)
    valid = valid_rows(failed, outcome_rewards.shape[0], outcome_rewards.device)
    a_out = group_normalize(outcome_rewards.to(dtype), group_ids, valid, eps=eps, norm_by_std=norm_by_std)
    a_step = _per_turn_normalize(
        _step_rewards(step_rewards, tv, dtype), tv, group_ids, valid, eps=eps, norm_by_std=norm_by_std
    )
    adv = tv.broadcast(a_out[:, None] + step_advantage_coef * a_step)
    return adv, adv.clone()


def ms_po(
    step_rewards: Tensor,
    outcome_rewards: Tensor,
    response_mask: Tensor,
    turn_ids: Tensor,
    group_ids: Tensor,
    *,
    discount_factor: float = 1.0,
    eps: float = 1e-6,
    norm_by_std: bool = True,
    failed: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """MS-PO: tokens of turn k get ``Ahat_k(R^T[:, k] + discount_factor * R^O)`` (per-turn group norm)."""
    dtype = torch.promote_types(outcome_rewards.dtype, torch.float32)
    tv = turn_view(turn_ids, response_mask)
    mixed = _step_rewards(step_rewards, tv, dtype) + discount_factor * outcome_rewards.to(dtype)[:, None]
    valid = valid_rows(failed, mixed.shape[0], mixed.device)
    adv = tv.broadcast(_per_turn_normalize(mixed, tv, group_ids, valid, eps=eps, norm_by_std=norm_by_std))
    return adv, adv.clone()


def step_group_ids(group_ids: Tensor, turn_obs_keys: list[list[str]], tv: TurnView) -> Tensor:
    """(B, K) long id of each turn's step group: same trajectory group and identical observation text.

    -1 where the turn does not exist. Python over (trajectory, turn) pairs only, never over tokens.
    """
    B, K = tv.exists.shape
    groups = group_ids.tolist()
    counts = tv.num_turns.tolist()
    table: dict[tuple[int, str], int] = {}
    ids = [[-1] * K for _ in range(B)]
    for b in range(B):
        for k in range(counts[b]):
            ids[b][k] = table.setdefault((groups[b], turn_obs_keys[b][k]), len(table))
    return torch.tensor(ids, dtype=torch.long, device=tv.exists.device).view(B, K)


def gigpo(
    token_rewards: Tensor,
    response_mask: Tensor,
    turn_ids: Tensor,
    group_ids: Tensor,
    turn_obs_keys: list[list[str]],
    *,
    gamma: float = 1.0,
    step_advantage_weight: float = 1.0,
    eps: float = 1e-6,
    norm_by_std: bool = True,
    failed: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """GiGPO (Feng et al. 2025, "Group-in-Group Policy Optimization for LLM Agent Training").

    Episode term: Ahat of each trajectory's total reward within its group. Step term: turns of one group whose
    observation texts are identical form a step group (an "anchor state"); each turn's discounted return
    sum_{j >= k} gamma^(j-k) r_j (r_j = reward of turn j) is normalised within its step group (a singleton
    step group gives 0). Tokens of turn k get ``A_episode + step_advantage_weight * A_step_k``.
    """
    rewards = token_rewards.to(torch.promote_types(token_rewards.dtype, torch.float32))
    tv = turn_view(turn_ids, response_mask)
    valid = valid_rows(failed, rewards.shape[0], rewards.device)
    a_ep = group_normalize(total_rewards(rewards, response_mask), group_ids, valid, eps=eps, norm_by_std=norm_by_std)
    disc = discounted_suffix_sum(tv.sum_tokens(rewards), gamma).to(rewards.dtype)
    sid = step_group_ids(group_ids, turn_obs_keys, tv)
    part = (tv.exists & valid[:, None]).reshape(-1)
    a_step = group_normalize(disc.reshape(-1), sid.reshape(-1), part, eps=eps, norm_by_std=norm_by_std).view(disc.shape)
    adv = tv.broadcast(a_ep[:, None] + step_advantage_weight * a_step)
    return adv, adv.clone()
