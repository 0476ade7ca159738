"""From a rollout to what the PPO update reads: the group filters, the estimators' inputs and outputs (advantages,
returns, KL in the reward), the worker batch and the rollout correction.

Each function takes tensors / batches plus explicit scalars or one config section (never the whole config), so it
is unit-testable.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from ragen.agent.batch import RolloutBatch
from ragen.algorithms import AdvantageInputs, compute_advantage
from ragen.algorithms.group_filter import select_by_variance_share
from ragen.algorithms.losses import kl_penalties
from ragen.algorithms.rollout_correction import RolloutCorrectionConfig, rollout_correction_weights
from ragen.workers.data import TrainBatch

if TYPE_CHECKING:
    from ragen.trainer.config.schema import AlgorithmSection


def trajectory_rewards(batch: RolloutBatch) -> torch.Tensor:
    """(B,) total reward of each row's episode (sum of its turn rewards)."""
    return batch.turn_rewards.float().sum(dim=-1)


def filter_groups_by_std(batch: RolloutBatch, ratio: float) -> tuple[RolloutBatch, dict[str, float]]:
    """RAGEN rollout filtering: keep the ``ceil(ratio * n_groups)`` groups with the highest in-group reward std.

    Groups whose rewards all agree carry no learning signal for group-relative estimators (and little for
    the others); ties keep the lower group id first, so the choice is deterministic. Row order is kept.
    The std is over the group's *episodes* (each once, whatever its number of turn rows: the two layouts give the
    same choice) that train: failed episodes and trajectory rows masked for a cut history are left out
    (:func:`excluded_rows`), their partial rewards say nothing about the policy.
    """
    gids = batch.group_ids
    unique = torch.unique(gids, sorted=True)
    n_keep = max(1, math.ceil(ratio * len(unique) - 1e-9))
    episodes = episode_first_rows(batch)
    excluded = excluded_rows(batch)
    counted = [r for r in episodes if excluded is None or not bool(excluded[r])]
    rewards, ep_groups = trajectory_rewards(batch)[counted], gids[counted]
    stds = torch.stack([rewards[ep_groups == g].std(unbiased=False) if bool((ep_groups == g).any())
                        else torch.zeros(()) for g in unique])
    metrics = {"rollout/group_reward_std_mean": float(stds.mean()), "rollout/kept_groups": float(n_keep),
               "rollout/total_groups": float(len(unique))}
    if n_keep >= len(unique):
        return batch, metrics
    order = sorted(range(len(unique)), key=lambda i: (-float(stds[i]), int(unique[i])))
    kept = unique[torch.tensor(sorted(order[:n_keep]))]
    rows = torch.nonzero(torch.isin(gids, kept)).flatten()
    metrics["rollout/kept_group_reward_std_mean"] = float(stds[torch.isin(unique, kept)].mean())
    return batch.select(rows), metrics


def filter_groups(batch: RolloutBatch, alg: AlgorithmSection) -> tuple[RolloutBatch, dict[str, float]]:
    """The group filter ``alg.rollout_filter`` chooses: :func:`filter_groups_by_std` (``std_ratio``, at
    ``alg.rollout_filter_ratio``) or :func:`filter_groups_by_variance_share` (``variance_share``, at
    ``alg.rollout_filter_variance_share``). Returns the kept rows (row order kept) and the filter's metrics."""
    if alg.rollout_filter == "variance_share":
        return filter_groups_by_variance_share(batch, alg.rollout_filter_variance_share)
    return filter_groups_by_std(batch, alg.rollout_filter_ratio)


def group_variances(batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """``(group_ids, variances)``: the batch's sorted group ids (G,) and each group's population variance (G,)
    float64 of its training episodes' rewards (each episode once, failed and cut-history rows left out as in
    :func:`filter_groups_by_std`); a group with fewer than two such episodes has variance 0."""
    gids = batch.group_ids
    unique = torch.unique(gids, sorted=True)
    excluded = excluded_rows(batch)
    counted = [r for r in episode_first_rows(batch) if excluded is None or not bool(excluded[r])]
    rewards, ep_groups = trajectory_rewards(batch)[counted].double(), gids[counted]
    var = torch.zeros(len(unique), dtype=torch.float64)
    for i, g in enumerate(unique.tolist()):
        r = rewards[ep_groups == g]
        if r.numel() >= 2:
            var[i] = (r - r.mean()).square().mean()
    return unique, var


def filter_groups_by_variance_share(batch: RolloutBatch, share: float) -> tuple[RolloutBatch, dict[str, float]]:
    """Reward-variance (SNR) filtering after RAGEN-2 (``ragen.algorithms.group_filter.select_by_variance_share``):
    keep the groups with the highest in-group reward variance until they hold ``share`` of the batch's total.
    Groups without variance are never kept; a batch without any variance keeps no row (the trainer then skips the
    update). Metrics ``rollout/snr_filter/*`` and, as the ratio filter's, ``rollout/kept_groups`` /
    ``rollout/total_groups``."""
    unique, var = group_variances(batch)
    sel = select_by_variance_share(var, share)
    kept = unique[sel.kept]
    metrics = {**sel.as_metrics("rollout/snr_filter"), "rollout/kept_groups": float(kept.numel()),
               "rollout/total_groups": float(len(unique)),
               "rollout/snr_filter/no_signal": float(kept.numel() == 0)}
    rows = torch.nonzero(torch.isin(batch.group_ids, kept)).flatten()
    return (batch, metrics) if rows.numel() == batch.batch_size else (batch.select(rows), metrics)


def episode_first_rows(batch: RolloutBatch) -> list[int]:
    """The first row of each episode, in row order (every row in the ``trajectory`` layout; one per episode's turn
    rows in the ``turn`` layout, through ``RolloutBatch.episode_index``)."""
    index = batch.episode_index
    if index is None:
        return list(range(batch.batch_size))
    seen: dict[int, int] = {}
    for r, e in enumerate(index.tolist()):
        seen.setdefault(e, r)
    return sorted(seen.values())


def to_train_batch(batch: RolloutBatch, seq_ids: torch.Tensor | None = None) -> TrainBatch:
    """The worker-side view of a rollout batch: ids, attention and response masks, and ``seq_ids`` (B,) long, the
    sequence each row belongs to (None = every row is its own). The layout chooses them
    (``ragen.trainer.layout``): the ``turn`` layout passes each turn row's episode, so the ``seq-mean-*`` losses
    average over episodes as in the ``trajectory`` layout."""
    return TrainBatch(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                      response_mask=batch.response_mask, seq_ids=seq_ids)


def without_step_rewards(batch: RolloutBatch) -> RolloutBatch:
    """The batch with each turn's step reward taken off its last model token (outcome-only rewards).

    ``token_rewards`` holds each turn's whole reward (step + outcome) on the turn's last model token; envs with a
    step / outcome split report ``step_rewards`` (B, K). Works for both layouts (a turn row holds one turn).
    """
    if batch.step_rewards is None:
        raise ValueError("algorithm.use_step_reward=false needs an env that reports step rewards (e.g. search_qa)")
    tid, steps = batch.turn_ids, batch.step_rewards.float()
    B, T = tid.shape
    K = steps.shape[1]
    pos = torch.arange(T).expand(B, T)
    last = torch.full((B, K + 1), -1).scatter_reduce(1, torch.where(tid >= 0, tid, K), pos, "amax")[:, :K]
    rows, ks = (last >= 0).nonzero(as_tuple=True)
    rewards = batch.token_rewards.float().clone()
    rewards[rows, last[rows, ks]] -= steps[rows, ks]
    return dataclasses.replace(batch, token_rewards=rewards)


def advantage_inputs(
    batch: RolloutBatch, values: torch.Tensor | None, bootstrap_values: torch.Tensor | None,
    token_penalties: torch.Tensor | None,
) -> AdvantageInputs:
    """The estimators' view of a trajectory-layout batch.

    values: (B, T) or None, ``values[:, t]`` = V of the context before token t (``ValueModel``'s convention);
    bootstrap_values: (B,) V of each row's bootstrap prompt (``ragen.ppo.truncation``), read for
    ``batch.truncated`` rows (episodes cut by a length budget); token_penalties: (B, T) per-token reward terms (KL
    in the reward) or None.
    """
    return AdvantageInputs(
        token_rewards=batch.token_rewards.float(), response_mask=batch.response_mask, turn_ids=batch.turn_ids,
        values=None if values is None else values.float(), group_ids=batch.group_ids, truncated=batch.truncated,
        step_rewards=batch.step_rewards, outcome_rewards=batch.outcome_rewards, tool_results=batch.tool_results,
        turn_obs_keys=batch.turn_obs_keys, attention_mask=batch.attention_mask,
        bootstrap_values=None if bootstrap_values is None else bootstrap_values.float(),
        token_penalties=token_penalties, failed=excluded_rows(batch),
    )


def excluded_rows(batch: RolloutBatch) -> torch.Tensor | None:
    """(B,) bool rows that train nothing and stay out of group statistics: failed episodes (the env raised) and
    trajectory rows whose history was cut (``context_cut``: masked out in the trajectory layout)."""
    failed, cut = batch.failed, batch.context_cut
    if failed is None or cut is None or cut.shape != failed.shape:
        return failed
    return failed | (cut & (batch.response_mask.sum(dim=1) == 0))


def advantages(
    estimator: str,
    batch: RolloutBatch,
    values: torch.Tensor | None,
    bootstrap_values: torch.Tensor | None = None,
    token_penalties: torch.Tensor | None = None,
    **scalars,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``compute_advantage`` on a trajectory-layout batch (inputs as in :func:`advantage_inputs`).

    Returns (advantages, returns), (B, T), 0 off the response.
    """
    return compute_advantage(estimator, advantage_inputs(batch, values, bootstrap_values, token_penalties), **scalars)


def step_credit(
    alg: AlgorithmSection, estimate: Callable[..., tuple[torch.Tensor, torch.Tensor]], batch: RolloutBatch,
    values: torch.Tensor | None, bootstrap_values: torch.Tensor | None, old_log_probs: torch.Tensor | None,
    ref_log_probs: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """The PPO step's credit: (advantages, returns, KL metrics) of ``batch`` under the ``algorithm`` section.

    The reward shaping of the section, then its estimator: with ``alg.kl_in_reward`` the per-token penalties
    ``-kl_coef * KL_kind(pi_old || pi_ref)`` (``kl_penalties``); with ``alg.use_step_reward=false`` the turns'
    step rewards taken out of the token rewards (:func:`without_step_rewards`); then the estimator with
    ``alg.advantage_kwargs()`` through ``estimate``, the layout's advantages (``Layout.advantages`` of
    ``ragen.trainer.layout``: :func:`advantages` on trajectory rows, each episode's compact view on turn rows).
    values / old_log_probs / ref_log_probs: (B, T) over ``batch``'s rows (old and ref only read with
    ``kl_in_reward``; old is None where the step skipped its pass, :func:`old_log_probs_reader`);
    bootstrap_values: (B,) (see :func:`advantage_inputs`). Returns (B, T) tensors, 0 off the response.
    """
    penalties, metrics = None, {}
    if alg.kl_in_reward:
        if ref_log_probs is None:
            raise ValueError("algorithm.kl_in_reward needs the reference policy's log-probs")
        penalties, metrics = kl_penalties(old_log_probs, ref_log_probs, batch.response_mask, coef=alg.kl_coef,
                                          kind=alg.kl_kind)
    scored = batch if alg.use_step_reward else without_step_rewards(batch)
    adv, ret = estimate(alg.estimator, scored, values, bootstrap_values, penalties, **alg.advantage_kwargs())
    return adv, ret, metrics


@dataclasses.dataclass(frozen=True)
class Correction:
    """Rollout correction of one batch (``ragen.algorithms.rollout_correction``), as the actor's update reads it.

    ``is_weights``: (B, T) the ``*_tis`` modes' weights on the policy-gradient loss, else None; ``keep_mask``:
    (B, T) the ``*_mask`` modes' 0/1 acceptance (0 = rejected: out of the actor's loss and its normaliser,
    ``TrainBatch.actor_mask``), else None; ``metrics``: ``rollout_correction/*``."""

    is_weights: torch.Tensor | None
    keep_mask: torch.Tensor | None
    metrics: dict[str, float]


def rollout_correction(rc: RolloutCorrectionConfig, batch: RolloutBatch, old_log_probs: torch.Tensor) -> Correction:
    """The rollout correction of ``batch`` (``ragen.algorithms.rollout_correction``): weights or a rejection mask.

    ``rc``: the ``algorithm.rollout_correction`` section; old_log_probs: (B, T) the actor's log-probs before the
    update, over ``batch``'s rows. The engine's log-probs are ``batch.sample_log_probs``, the tokens its model
    tokens (``response_mask``), a sequence an episode (``RolloutBatch.episode_index``: a turn-layout episode's turn rows
    share one ratio). Mode ``none`` gives neither weights nor a mask.
    """
    weights, metrics = rollout_correction_weights(
        old_log_probs, batch.sample_log_probs, batch.response_mask, mode=rc.mode, clip=rc.clip, low=rc.low,
        high=rc.high, seq_agg=rc.seq_agg, seq_ids=batch.episode_index)
    if weights is not None and rc.mode.endswith("_mask"):
        return Correction(None, weights, metrics)
    return Correction(weights, None, metrics)


def old_log_probs_reader(*, ppo_epochs: int, mini_batch_size: int, rows: int, correction_mode: str,
                         kl_in_reward: bool, shared_value_head: bool) -> str | None:
    """What needs the step's separate old-log-prob pass, or None where the actor's update is exactly on-policy.

    On-policy: one epoch over one mini-batch (``rows``, the padded worker batch, fit in ``mini_batch_size``: every
    row in one optimizer step, so the weights the update's forward sees are those the pass would see), and nothing
    reads the old log-probs before the update: rollout correction ``none``, no KL in the reward (its penalty is
    KL(pi_old || pi_ref)), no shared value head (its values come from the same forward as the pass's log-probs).
    The report's training samples need the old log-probs of their few rows only (``ragen.ppo.report.rows_log_probs``
    runs those). Then the update's own detached log-probs serve as the old
    ones (``ragen.workers.actor.policy_objective``): the ratio is exactly 1, and the loss and its gradient are the
    clipped objective's at ratio 1, which the pass would reproduce up to float rounding.
    """
    reasons = ((ppo_epochs != 1, f"actor.ppo_epochs={ppo_epochs}"),
               (rows > mini_batch_size, f"{rows} rows in mini-batches of {mini_batch_size}"),
               (correction_mode != "none", f"algorithm.rollout_correction.mode={correction_mode}"),
               (kl_in_reward, "algorithm.kl_in_reward"),
               (shared_value_head, "the shared value head's values"))
    return next((why for needed, why in reasons if needed), None)
