"""Pure helpers of the PPO step: rollout filtering, advantage inputs, metrics, validation dumps.

Each function takes tensors / batches plus explicit scalars (never the whole config), so it is unit-testable.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from ragen.agent.batch import RolloutBatch
from ragen.algorithms import AdvantageInputs, compute_advantage
from ragen.workers.data import TrainBatch


def trajectory_rewards(batch: RolloutBatch) -> torch.Tensor:
    """(B,) total reward of each row's episode (sum of its turn rewards)."""
    return batch.turn_rewards.float().sum(dim=-1)


def filter_groups_by_std(batch: RolloutBatch, ratio: float) -> tuple[RolloutBatch, dict[str, float]]:
    """RAGEN rollout filtering: keep the ``ceil(ratio * n_groups)`` groups with the highest in-group reward std.

    Groups whose rewards all agree carry no learning signal for group-relative estimators (and little for
    the others); ties keep the lower group id first, so the choice is deterministic. Row order is kept.
    """
    gids = batch.group_ids
    unique = torch.unique(gids, sorted=True)
    n_keep = max(1, math.ceil(ratio * len(unique) - 1e-9))
    rewards = trajectory_rewards(batch)
    stds = torch.stack([rewards[gids == g].std(unbiased=False) for g in unique])
    metrics = {"rollout/group_reward_std_mean": float(stds.mean()), "rollout/kept_groups": float(n_keep),
               "rollout/total_groups": float(len(unique))}
    if n_keep >= len(unique):
        return batch, metrics
    order = sorted(range(len(unique)), key=lambda i: (-float(stds[i]), int(unique[i])))
    kept = unique[torch.tensor(sorted(order[:n_keep]))]
    rows = torch.nonzero(torch.isin(gids, kept)).flatten()
    metrics["rollout/kept_group_reward_std_mean"] = float(stds[torch.isin(unique, kept)].mean())
    return batch.select(rows), metrics


def to_train_batch(batch: RolloutBatch) -> TrainBatch:
    """The worker-side view of a rollout batch (ids, attention and response masks)."""
    return TrainBatch(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                      response_mask=batch.response_mask)


def advantages(
    estimator: str,
    batch: RolloutBatch,
    token_rewards: torch.Tensor,
    values: torch.Tensor | None,
    **scalars,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``compute_advantage`` on a trajectory-layout batch; ``token_rewards`` (B, T) may include a KL penalty.

    ``values`` (B, T) or None for critic-free estimators. Returns (advantages, returns), (B, T), 0 off the
    response.
    """
    inputs = AdvantageInputs(
        token_rewards=token_rewards.float(), response_mask=batch.response_mask, turn_ids=batch.turn_ids,
        values=None if values is None else values.float(), group_ids=batch.group_ids, truncated=batch.truncated,
        step_rewards=batch.step_rewards, outcome_rewards=batch.outcome_rewards, turn_obs_keys=batch.turn_obs_keys,
        attention_mask=batch.attention_mask,
    )
    return compute_advantage(estimator, inputs, **scalars)


def masked_stats(prefix: str, x: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """mean / max / min of ``x`` over ``mask`` as ``{prefix}/mean`` ... (empty mask: nothing)."""
    m = mask.bool()
    if not m.any():
        return {}
    vals = x[m].float()
    return {f"{prefix}/mean": float(vals.mean()), f"{prefix}/max": float(vals.max()),
            f"{prefix}/min": float(vals.min())}


def batch_metrics(batch: RolloutBatch, adv: torch.Tensor, ret: torch.Tensor,
                  values: torch.Tensor | None) -> dict[str, float]:
    """Reward, length, advantage / return / value statistics of one training batch."""
    rewards = trajectory_rewards(batch)
    resp = batch.response_mask
    out = {
        "reward/mean": float(rewards.mean()), "reward/max": float(rewards.max()), "reward/min": float(rewards.min()),
        "rollout/response_tokens_mean": float(resp.sum(-1).float().mean()),
        "rollout/seq_len_mean": float(batch.attention_mask.sum(-1).float().mean()),
        "rollout/num_turns_mean": float(batch.num_turns.float().mean()),
        "rollout/truncated_ratio": float(batch.truncated.float().mean()),
        "rollout/batch_size": float(batch.batch_size),
    }
    out.update(masked_stats("critic/advantages", adv, resp))
    out.update(masked_stats("critic/returns", ret, resp))
    if values is not None:
        out.update(masked_stats("critic/values", values, resp))
    return out


def perf_metrics(batch: RolloutBatch, step_seconds: float, timings: dict[str, float]) -> dict[str, float]:
    """Throughput: real tokens and generated tokens per second of the step, per phase shares."""
    total = float(batch.attention_mask.sum())
    gen = float(batch.response_mask.sum())
    out = {"perf/total_tokens": total, "perf/response_tokens": gen,
           "perf/tokens_per_s": total / max(step_seconds, 1e-9)}
    if timings.get("rollout"):
        out["perf/rollout_tokens_per_s"] = gen / timings["rollout"]
    if timings.get("actor_update"):
        out["perf/actor_update_tokens_per_s"] = total / timings["actor_update"]
    return out


def episode_records(batch: RolloutBatch) -> list[dict]:
    """JSON-ready episodes: env, seed, group, success and per turn prompt / response / actions / reward."""
    out = []
    for ep in batch.episodes:
        out.append({
            "env": ep.env_name, "seed": ep.seed, "group_id": ep.group_id, "success": bool(ep.success),
            "failed": bool(ep.failed), "error": ep.error, "truncated": bool(ep.truncated),
            "turns": [{"prompt": t.prompt_text, "response": t.response_text, "actions": list(t.actions),
                       "reward": float(t.reward), "success": bool(t.success), "format_ok": bool(t.format_ok)}
                      for t in ep.turns],
        })
    return out


def write_jsonl(path: str | Path, records: list[dict]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps(rec) + "\n")
    return path
