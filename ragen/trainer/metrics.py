"""The PPO step's metrics: rollout, advantage, return and value statistics, the sampler-vs-trainer log-prob gap,
throughput. Pure functions of tensors and batches.
"""

from __future__ import annotations

import torch

from ragen.agent.batch import RolloutBatch
from ragen.trainer.credit import trajectory_rewards


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
        ev = explained_variance(values, ret, resp)
        if ev is not None:
            out["critic/vf_explained_var"] = ev
    return out


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float | None:
    """1 - Var(returns - values) / Var(returns) over ``mask`` (population variances): 1 for a perfect critic, 0
    for one that predicts the mean, negative for one worse than that (None when the returns are constant)."""
    m = mask.bool()
    r, v = returns[m].double(), values[m].double()
    var = r.var(unbiased=False) if r.numel() else torch.tensor(0.0)
    if float(var) == 0.0:
        return None
    return float(1.0 - (r - v).var(unbiased=False) / var)


def logprob_gap_metrics(engine_log_probs: torch.Tensor, old_log_probs: torch.Tensor,
                        response_mask: torch.Tensor) -> dict[str, float]:
    """Sampler-vs-trainer gap: mean and max of |engine log-prob - trainer log-prob| over response tokens.

    ``engine_log_probs`` (B, T) = ``RolloutBatch.sample_log_probs`` (what the engine sampled with),
    ``old_log_probs`` (B, T) = the actor's log-probs of the same tokens before the update. PPO's ratio assumes the
    two agree; a large gap means an engine / trainer mismatch (precision, temperature, top-p/k, stale weights).
    """
    m = response_mask.bool()
    if not m.any():
        return {"rollout/logprob_diff_mean": 0.0, "rollout/logprob_diff_max": 0.0}
    diff = (engine_log_probs.float() - old_log_probs.float()).abs()[m]
    return {"rollout/logprob_diff_mean": float(diff.mean()), "rollout/logprob_diff_max": float(diff.max())}


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
