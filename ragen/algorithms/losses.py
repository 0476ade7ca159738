"""PPO-family losses: clipped policy surrogate, clipped value loss, KL estimators, entropy bonus.

All per-token tensors are (B, T); ``mask`` is 1 on the tokens that count (the response mask: model tokens,
so env observation tokens never enter a loss by default).

Gradient-accumulation invariance: when a mini-batch is split into micro-batches, pass ``num_tokens`` (the
number of masked tokens) and ``num_seqs`` (the number of sequences with at least one masked token), both
counted over the WHOLE mini-batch. Each micro-batch loss is then its share of the mini-batch loss, so the sum
of the micro-batch losses (and of their gradients) equals the loss (and gradient) of the whole mini-batch,
whatever the split. Without them the micro-batch itself is the normaliser.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ragen.algorithms.masked import masked_mean

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")
# |log pi - log pi_old| is clamped to this before exp in the PPO ratio (as verl does): exp(89) already overflows
# float32, and one inf ratio would make the loss and every gradient of its mini-batch non-finite, which skips the
# whole optimizer step. Within the bound the ratio is exact; beyond it the token sits far outside the clip range,
# where the clipped surrogate takes no gradient from it anyway (except through the dual clip's cap, which is flat).
LOG_RATIO_CLAMP = 20.0
KL_KINDS = ("k1", "k2", "k3", "low_var_kl")


def aggregate_loss(
    loss_mat: Tensor,
    mask: Tensor,
    mode: str = "token-mean",
    *,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    seq_tokens: Tensor | None = None,
) -> Tensor:
    """Reduce a (B, T) per-token loss to a scalar over ``mask``.

    token-mean: sum over masked tokens / num_tokens (default: masked tokens here).
    seq-mean-token-sum: sum over sequences of each sequence's token sum / num_seqs.
    seq-mean-token-mean: sum over sequences of each sequence's token mean / num_seqs.
    A sequence is an episode: one row in the ``trajectory`` layout, several turn rows in the ``turn`` layout.
    ``seq_tokens`` (B,): the masked-token count of each row's whole sequence (None: the row's own count, every row
    its own sequence); a row's token sum is divided by it for seq-mean-token-mean, so the rows of one episode add
    up to the episode's token mean, or to their share of it when the episode's other rows are in another
    mini-batch (``ragen.workers.trainable.mini_batch_counts``). num_seqs defaults to the number of sequences here,
    sum over rows of (row tokens / seq_tokens) (rows without a masked token count 0).
    """
    if mode not in AGG_MODES:
        raise ValueError(f"loss aggregation mode {mode!r} is not one of {AGG_MODES}")
    m = mask.bool()
    vals = torch.where(m, loss_mat, torch.zeros_like(loss_mat))
    if mode == "token-mean":
        denom = num_tokens if num_tokens is not None else m.sum().clamp(min=1).to(vals.dtype)
        return vals.sum() / denom
    per_seq = vals.sum(dim=-1)
    row_tokens = m.sum(dim=-1).to(vals.dtype)
    seq_len = row_tokens if seq_tokens is None else seq_tokens.to(vals.dtype)
    seq_len = torch.where(row_tokens > 0, seq_len.clamp(min=1), torch.ones_like(seq_len))
    if mode == "seq-mean-token-mean":
        per_seq = per_seq / seq_len
    denom = num_seqs if num_seqs is not None else (row_tokens / seq_len).sum().clamp(min=1)
    return per_seq.sum() / denom


def policy_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    agg: str = "token-mean",
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    seq_tokens: Tensor | None = None,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate (Schulman et al. 2017, eq. 7) with clip-higher and optional dual clip.

    Per token: ratio = exp(clamp(log_probs - old_log_probs, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)) (an extreme gap
    gives a large finite ratio instead of inf, see :data:`LOG_RATIO_CLAMP`);
    loss = max(-A * ratio, -A * clip(ratio, 1 - clip_low, 1 + clip_high)) (DAPO's decoupled clip range);
    with ``dual_clip = c > 1`` (Ye et al. 2020), tokens with A < 0 are further capped at -A * c.
    ``is_weights``: (B, T) detached rollout-correction weights (``ragen.algorithms.rollout_correction``), which
    multiply each token's loss before aggregation (None = all 1); the metrics do not read them.
    Metrics (python floats, over this call's masked tokens): actor/pg_loss (the returned value),
    actor/pg_clipfrac (fraction where the clipped term is active), actor/ppo_kl (mean old - new log-prob).
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip={dual_clip} must be > 1 (or None to disable)")
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip_low={clip_low} and clip_high={clip_high} must be >= 0")
    m = mask.bool()
    log_ratio = torch.where(m, log_probs - old_log_probs, torch.zeros_like(log_probs))
    log_ratio = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss_mat = torch.maximum(unclipped, clipped)
    if dual_clip is not None:
        capped = torch.minimum(loss_mat, -advantages * dual_clip)
        loss_mat = torch.where(advantages < 0, capped, loss_mat)
    weighted = loss_mat if is_weights is None else loss_mat * is_weights.detach().to(loss_mat.dtype)
    loss = aggregate_loss(weighted, m, agg, num_tokens=num_tokens, num_seqs=num_seqs, seq_tokens=seq_tokens)
    with torch.no_grad():
        metrics = {
            "actor/pg_loss": float(loss.detach()),
            "actor/pg_clipfrac": float(masked_mean((clipped > unclipped).to(loss_mat.dtype), m)),
            "actor/ppo_kl": float(masked_mean(-log_ratio.detach(), m)),
        }
    return loss, metrics


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    clip: float | None = 0.2,
    agg: str = "token-mean",
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    seq_tokens: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Clipped value loss: 0.5 * max((V - R)^2, (V_old + clip(V - V_old, -clip, clip) - R)^2) over ``mask``.

    ``clip=None`` gives the plain 0.5 * (V - R)^2. Metrics: critic/vf_loss, critic/vf_clipfrac.
    """
    m = mask.bool()
    plain = (values - returns).square()
    if clip is None:
        loss_mat = plain
        clipfrac = torch.zeros((), dtype=values.dtype)
    else:
        v_clip = old_values + torch.clamp(values - old_values, -clip, clip)
        clipped = (v_clip - returns).square()
        loss_mat = torch.maximum(plain, clipped)
        clipfrac = masked_mean((clipped > plain).to(values.dtype), m)
    loss = 0.5 * aggregate_loss(loss_mat, m, agg, num_tokens=num_tokens, num_seqs=num_seqs, seq_tokens=seq_tokens)
    return loss, {"critic/vf_loss": float(loss.detach()), "critic/vf_clipfrac": float(clipfrac)}


def kl_estimate(log_probs: Tensor, ref_log_probs: Tensor, kind: str = "k1") -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman 2020, "Approximating KL divergence").

    With d = log_probs - ref_log_probs: k1 = d; k2 = d^2 / 2; k3 = exp(-d) + d - 1 (unbiased and >= 0);
    "low_var_kl" is k3 with d clamped to [-20, 20] and the result clamped to [-10, 10] for stability.
    """
    d = log_probs - ref_log_probs
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * d.square()
    if kind == "k3":
        return torch.exp(-d) + d - 1.0
    if kind == "low_var_kl":
        d = d.clamp(-20.0, 20.0)
        return (torch.exp(-d) + d - 1.0).clamp(-10.0, 10.0)
    raise ValueError(f"unknown KL estimator {kind!r}; choose one of {KL_KINDS}")


def kl_penalties(
    log_probs: Tensor,
    ref_log_probs: Tensor,
    mask: Tensor,
    *,
    coef: float,
    kind: str = "k1",
) -> tuple[Tensor, dict[str, float]]:
    """KL as a reward penalty: the per-token terms ``-coef * KL_t`` on masked tokens, 0 elsewhere, (B, T).

    They go to the estimators as ``AdvantageInputs.token_penalties``, which apply each at its own token at the
    token level (bi-level GAE's low level included) and sum them into the turn reward at the turn level.
    Metrics: actor/reward_kl_penalty (mean per-token KL over the mask), actor/reward_kl_penalty_coef.
    """
    m = mask.bool()
    kl = torch.where(m, kl_estimate(log_probs, ref_log_probs, kind), torch.zeros_like(log_probs))
    metrics = {"actor/reward_kl_penalty": float(masked_mean(kl, m)), "actor/reward_kl_penalty_coef": float(coef)}
    return -coef * kl, metrics


def kl_loss(
    log_probs: Tensor,
    ref_log_probs: Tensor,
    mask: Tensor,
    *,
    kind: str = "low_var_kl",
    agg: str = "token-mean",
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    seq_tokens: Tensor | None = None,
) -> Tensor:
    """KL to the reference as a loss term (GRPO style): aggregated per-token ``kl_estimate`` over ``mask``."""
    return aggregate_loss(kl_estimate(log_probs, ref_log_probs, kind), mask, agg, num_tokens=num_tokens,
                          num_seqs=num_seqs, seq_tokens=seq_tokens)


def entropy_loss(
    entropy: Tensor,
    mask: Tensor,
    *,
    agg: str = "token-mean",
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    seq_tokens: Tensor | None = None,
) -> Tensor:
    """Aggregated per-token entropy (B, T) over ``mask``; the caller subtracts ``entropy_coef`` times it."""
    return aggregate_loss(entropy, mask, agg, num_tokens=num_tokens, num_seqs=num_seqs, seq_tokens=seq_tokens)


def bc_loss(
    log_probs: Tensor,
    mask: Tensor,
    *,
    agg: str = "token-mean",
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    seq_tokens: Tensor | None = None,
) -> Tensor:
    """Behaviour cloning: the negative log-likelihood of the demonstrated tokens, aggregated over ``mask``.

    log_probs: (B, T) log p(token t | tokens < t) under the policy at temperature 1 (``token_log_probs``);
    mask: (B, T) 1 on the tokens to imitate, the RL response mask (model tokens only: prompt, env observation,
    forced-prefix and padding tokens are never imitated). Supervised warm start on expert trajectories
    (``ragen.sft``) and online filtered BC (the ArCHer paper's baseline: the same loss on the agent's own best
    trajectories) both use it.
    """
    return aggregate_loss(-log_probs, mask, agg, num_tokens=num_tokens, num_seqs=num_seqs, seq_tokens=seq_tokens)
