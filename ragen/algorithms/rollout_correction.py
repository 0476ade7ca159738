"""Rollout correction: importance weights for the gap between the engine that samples and the trainer.

The rollout engine (vLLM or the hf engine: bf16, its own kernels) and the trainer that recomputes log-probs (FSDP,
fp32 master weights) compute different distributions for the same tokens: the engine samples from mu, PPO's ratio
starts from pi_old. The surrogate E_{a ~ pi_old}[r(a) A(a)] is then estimated from samples of mu. Weighting each
token's loss by the detached ratio rho = pi_old / mu corrects the expectation (E_mu[rho f] = E_pi_old[f]); its
truncated and rejection variants trade the bias of the cut against the variance of large ratios:

* ``token_tis``: w_t = min(rho_t, clip), truncated importance sampling (Ionides 2008) per token, as proposed for
  this gap by Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training" (C = 2);
* ``token_mask``: w_t = 1 if low <= rho_t <= high else 0, rejection: a token on which the engine and the trainer
  disagree by more than the band is dropped from the policy loss, the others count as on-policy (no reweighting);
* ``seq_tis`` / ``seq_mask``: the same with the sequence's ratio rho_seq on every token of the sequence. A sequence
  is an episode (the ``turn`` layout's turn rows of an episode together, ``seq_ids``); its ratio aggregates the
  token ratios over its model tokens, ``seq_agg``: ``product`` (prod_t rho_t, the importance ratio of the sampled
  token sequence: env tokens do not depend on the policy, so this is the exact trajectory ratio) or
  ``geometric_mean`` (exp(mean_t log rho_t): length-normalised, so long episodes are not truncated or rejected
  for the accumulated noise of many near-1 ratios; a biased, lower-variance proxy, as in geometric-mean rejection).

``mu`` must be the distribution the engine sampled from, after temperature (``RolloutBatch.sample_log_probs``:
the hf engine reports ``log_softmax(logits / T)``, vLLM ``processed_logprobs``), and ``pi_old`` the trainer's
log-probs at the same temperature (``actor.temperature`` = ``agent.temperature``, checked by validation).

The ``*_tis`` weights multiply the per-token policy-gradient loss (``losses.policy_loss(is_weights=...)``) before
aggregation; the entropy and KL terms are not weighted. The ``*_mask`` modes' 0/1 weights act as a mask instead
(verl's rejection rule): a rejected token leaves the actor's loss altogether, its policy-gradient, entropy and KL
terms and the aggregation's normaliser (``TrainBatch.keep_mask`` / ``actor_mask``), so the kept tokens' loss is
their own mean, not diluted by the rejected ones.

On CPU (fp32 on both sides) the gap is ~1e-5 and the correction is off by default; on GPUs with vLLM in bf16 the
recommended setting is ``mode=token_tis, clip=2.0`` (Yao et al.'s choice: the weight is the exact importance ratio
wherever that stays below 2, and bounded where it does not; ``rollout/logprob_diff_*`` and
``rollout_correction/clipped_frac`` show how often a run truncates).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

MODES = ("none", "token_tis", "token_mask", "seq_tis", "seq_mask")
SEQ_AGGS = ("geometric_mean", "product")
_READS = {"none": (), "token_tis": ("clip",), "token_mask": ("low", "high"), "seq_tis": ("clip", "seq_agg"),
          "seq_mask": ("low", "high", "seq_agg")}
_LOG_CAP = 50.0  # ratio metrics are reported within e^-50 .. e^50 (a product over a long sequence can overflow)


@dataclass(frozen=True)
class RolloutCorrectionConfig:
    """``algorithm.rollout_correction``: which correction (``mode``, one of :data:`MODES`) and its scalars.

    ``clip``: the truncation C of the ``*_tis`` modes; ``low`` / ``high``: the band of the ``*_mask`` modes;
    ``seq_agg``: how the ``seq_*`` modes aggregate token ratios (:data:`SEQ_AGGS`). A mode reads only its own
    keys (:func:`keys_read`); validation rejects the others when set.
    """

    mode: str = "none"
    clip: float = 2.0
    low: float = 0.5
    high: float = 2.0
    seq_agg: str = "geometric_mean"


def keys_read(mode: str) -> tuple[str, ...]:
    """The ``algorithm.rollout_correction`` keys besides ``mode`` that ``mode`` reads."""
    return _READS.get(mode, ())


def _sequence_log_ratio(log_ratio: Tensor, mask: Tensor, seq_ids: Tensor | None, seq_agg: str) -> Tensor:
    """(B,) each row's sequence log-ratio: the sum (product) or mean (geometric mean) of the token log-ratios over
    the masked tokens of all rows of its sequence (``seq_ids``; None = each row its own sequence)."""
    row_sum = (log_ratio * mask).sum(-1)
    row_n = mask.sum(-1)
    if seq_ids is None:
        inv = torch.arange(log_ratio.shape[0], device=log_ratio.device)
    else:
        inv = torch.unique(seq_ids, return_inverse=True)[1].to(log_ratio.device)
    n_seq = int(inv.max()) + 1 if inv.numel() else 0
    seq_sum = torch.zeros(n_seq, dtype=row_sum.dtype, device=row_sum.device).index_add_(0, inv, row_sum)
    seq_n = torch.zeros(n_seq, dtype=row_n.dtype, device=row_n.device).index_add_(0, inv, row_n)
    agg = seq_sum if seq_agg == "product" else seq_sum / seq_n.clamp(min=1)
    return agg[inv]


def rollout_correction_weights(
    old_log_probs: Tensor,
    engine_log_probs: Tensor,
    mask: Tensor,
    *,
    mode: str,
    clip: float = 2.0,
    low: float = 0.5,
    high: float = 2.0,
    seq_agg: str = "geometric_mean",
    seq_ids: Tensor | None = None,
) -> tuple[Tensor | None, dict[str, float]]:
    """The detached per-token weights of rollout correction ``mode`` (module docstring) and their metrics.

    old_log_probs: (B, T) the trainer's log pi_old of each token; engine_log_probs: (B, T) log mu of the same tokens
    under the distribution the engine sampled from (after temperature); mask: (B, T) 1 on the tokens the policy
    loss covers (model tokens; prompt, env observation and padding tokens 0); seq_ids: (B,) the sequence (episode)
    of each row for the ``seq_*`` modes (None = each row is its own sequence). Scalars as in
    :class:`RolloutCorrectionConfig`. Returns ``(None, {})`` for ``mode="none"``, else weights (B, T) float32
    (0 off the mask) and ``rollout_correction/*`` metrics over the masked tokens: ``ratio_mean`` / ``ratio_max`` /
    ``ratio_min`` (token ratios, or for ``seq_*`` each sequence's ratio once, within e^-50..e^50),
    ``weight_mean``, and ``clipped_frac`` (``*_tis``: tokens whose weight was truncated) or ``masked_frac``
    (``*_mask``: tokens dropped).
    """
    if mode not in MODES:
        raise ValueError(f"rollout correction mode {mode!r} is not one of {MODES}")
    if mode == "none":
        return None, {}
    if seq_agg not in SEQ_AGGS:
        raise ValueError(f"seq_agg={seq_agg!r} is not one of {SEQ_AGGS}")
    m = mask.bool()
    mf = m.to(torch.float64)
    log_ratio = torch.where(m, old_log_probs.detach().double() - engine_log_probs.detach().double(), 0.0)
    seq_level = mode.startswith("seq_")
    level = _sequence_log_ratio(log_ratio, mf, seq_ids, seq_agg)[:, None].expand_as(log_ratio) if seq_level \
        else log_ratio
    if mode.endswith("_tis"):
        weights = torch.exp(level.clamp(max=math.log(clip)))
        changed = level > math.log(clip)
    else:
        lo = math.log(low) if low > 0 else -math.inf
        weights = ((level >= lo) & (level <= math.log(high))).double()
        changed = weights == 0
    weights = torch.where(m, weights, 0.0)
    n = mf.sum().clamp(min=1)
    metrics = _ratio_metrics(level, m, seq_ids if seq_level else None, seq_level)
    metrics["rollout_correction/weight_mean"] = float(weights.sum() / n)
    frac = "clipped_frac" if mode.endswith("_tis") else "masked_frac"
    metrics[f"rollout_correction/{frac}"] = float((changed & m).double().sum() / n)
    return weights.float(), metrics


def _ratio_metrics(level: Tensor, m: Tensor, seq_ids: Tensor | None, seq_level: bool) -> dict[str, float]:
    """mean / max / min of the ratios: over masked tokens, or each sequence with a masked token once."""
    if not m.any():
        return {"rollout_correction/ratio_mean": 1.0, "rollout_correction/ratio_max": 1.0,
                "rollout_correction/ratio_min": 1.0}
    if seq_level:
        rows = m.any(-1)
        first = level[:, 0]
        if seq_ids is None:
            values = first[rows]
        else:
            seen: dict[int, float] = {}
            for s, v in zip(seq_ids[rows].tolist(), first[rows].tolist(), strict=True):
                seen.setdefault(s, v)
            values = torch.tensor(list(seen.values()), dtype=torch.float64)
    else:
        values = level[m]
    ratios = values.clamp(-_LOG_CAP, _LOG_CAP).exp()
    return {"rollout_correction/ratio_mean": float(ratios.mean()), "rollout_correction/ratio_max": float(ratios.max()),
            "rollout_correction/ratio_min": float(ratios.min())}
