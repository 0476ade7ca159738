"""Critic-free turn-level credit: MS-GRPO, MS-PO ("turn-level credit assignment") and GiGPO.

Token tensors are (B, T); ``turn_ids`` is k on the model tokens of turn k (-1 elsewhere); ``group_ids`` (B,)
marks trajectories that share an env seed; ``failed`` (B,) bool marks rows whose env raised, which take no part
in any group statistic and get 0. Ahat is group normalisation (:func:`group_normalize`: unbiased std,
eps outside the sqrt, 0 for constant groups) over the group's valid trajectories. Every model token of turn k
gets its turn's advantage; outputs (adv, ret) are 0 off model tokens and ``ret`` equals ``adv`` (no critic).

MS-GRPO and MS-PO (Zeng et al. 2025, "Reinforcing Multi-Turn Reasoning in LLM Agents via Turn-Level Credit
Assignment") read the outcome reward R^O (B,), the step reward R^T_k of each turn (B, K) and the flag G_k (B, K)
"turn k received a tool result", which the env sets (``tool_result`` in its step info); it is never inferred from
R^T_k, which may be nonzero on other turns (e.g. the agent proxy's format penalty). The paper's turn structure is
"tool call, tool result, answer": the tokens up to the first tool result earn the step reward. Here:

    MS-GRPO: A_k = Ahat(R^O) + c * Ahat_k(R^T_k)   where G_k
             A_k = Ahat(R^O)                        elsewhere (every turn of a trajectory without a tool result)
             Ahat_k normalises column k over all the group's valid rows; a row without a turn k counts R^T_k = 0.
    MS-PO:   A_k = Ahat(R^T + d * R^O)   for the turns up to and including the first one with G_k
             A_k = Ahat(R^O)             for the turns after it
             (a trajectory without a tool result gets Ahat(R^T + d * R^O) on every turn), R^T = sum_k R^T_k.

c = ``step_advantage_coef``, d = ``discount_factor``. MS-PO's R^T is the trajectory's total step reward: the
authors score the step reward once per trajectory with functions that read all of its tool calls (the execution
reward is the success rate over every call), not the first call alone; with one tool call, as in their runs, it is
that call's reward.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ragen.algorithms.group import total_rewards, valid_rows
from ragen.algorithms.masked import group_normalize
from ragen.algorithms.scan import TurnView, discounted_suffix_sum, turn_view


def _column_normalize(x: Tensor, group_ids: Tensor, valid: Tensor, *, eps: float, norm_by_std: bool) -> Tensor:
    """(B, K) -> (B, K): Ahat_k, normalising column k over the group's valid rows (all of them, whatever their
    number of turns: ``x`` is 0 past a row's last turn)."""
    B, K = x.shape
    _, inv = torch.unique(group_ids, return_inverse=True)
    key = inv[:, None] * K + torch.arange(K, device=x.device)[None, :]
    part = valid[:, None].expand(B, K).reshape(-1)
    out = group_normalize(x.reshape(-1), key.reshape(-1), part, eps=eps, norm_by_std=norm_by_std)
    return out.view(B, K)


def _per_turn(step_rewards: Tensor, tool_results: Tensor, tv: TurnView, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """(R^T, G), both (B, K): step rewards (0 past a row's last turn) and tool-result flags (False there)."""
    rt = step_rewards[:, : tv.K].to(dtype)
    got = tool_results[:, : tv.K].bool() & tv.exists
    return torch.where(tv.exists, rt, torch.zeros_like(rt)), got


def ms_grpo(
    step_rewards: Tensor,
    outcome_rewards: Tensor,
    tool_results: Tensor,
    response_mask: Tensor,
    turn_ids: Tensor,
    group_ids: Tensor,
    *,
    step_advantage_coef: float = 1.0,
    eps: float = 1e-6,
    norm_by_std: bool = True,
    failed: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """MS-GRPO: turn k gets ``Ahat(R^O) + step_advantage_coef * Ahat_k(R^T_k)`` if it received a tool result,
    else ``Ahat(R^O)`` (module docstring).

    step_rewards: (B, K) float R^T_k; outcome_rewards: (B,) float R^O; tool_results: (B, K) bool G_k, turn k
    received a tool result (K >= each row's number of turns; entries past a row's last turn are not read).
    Ahat(R^O) normalises over the group's valid rows; Ahat_k over the same rows, with R^T_k = 0 for rows that
    have no turn k.
    """
    dtype = torch.promote_types(outcome_rewards.dtype, torch.float32)
    tv = turn_view(turn_ids, response_mask)
    valid = valid_rows(failed, outcome_rewards.shape[0], outcome_rewards.device)
    rt, got = _per_turn(step_rewards, tool_results, tv, dtype)
    a_out = group_normalize(outcome_rewards.to(dtype), group_ids, valid, eps=eps, norm_by_std=norm_by_std)
    a_step = _column_normalize(rt, group_ids, valid, eps=eps, norm_by_std=norm_by_std)
    step_term = torch.where(got, a_step, torch.zeros_like(a_step))
    adv = tv.broadcast(a_out[:, None] + step_advantage_coef * step_term)
    return adv, adv.clone()


def ms_po(
    step_rewards: Tensor,
    outcome_rewards: Tensor,
    tool_results: Tensor,
    response_mask: Tensor,
    turn_ids: Tensor,
    group_ids: Tensor,
    *,
    discount_factor: float = 1.0,
    eps: float = 1e-6,
    norm_by_std: bool = True,
    failed: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """MS-PO: turns up to and including the first one that received a tool result get
    ``Ahat(R^T + discount_factor * R^O)`` with R^T = sum_k R^T_k, later turns ``Ahat(R^O)`` (module docstring).

    step_rewards: (B, K) float R^T_k; outcome_rewards: (B,) float R^O; tool_results: (B, K) bool G_k (entries past
    a row's last turn are not read). Both Ahat normalise over the group's valid rows.
    """
    dtype = torch.promote_types(outcome_rewards.dtype, torch.float32)
    tv = turn_view(turn_ids, response_mask)
    valid = valid_rows(failed, outcome_rewards.shape[0], outcome_rewards.device)
    rt, got = _per_turn(step_rewards, tool_results, tv, dtype)
    ro = outcome_rewards.to(dtype)
    a_total = group_normalize(rt.sum(dim=1) + discount_factor * ro, group_ids, valid, eps=eps,
                              norm_by_std=norm_by_std)
    a_out = group_normalize(ro, group_ids, valid, eps=eps, norm_by_std=norm_by_std)
    after_result = (got.long().cumsum(dim=1) - got.long()) > 0  # an earlier turn received a tool result
    adv = tv.broadcast(torch.where(after_result, a_out[:, None], a_total[:, None]))
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
