"""Worker configs: frozen dataclasses the trainer's YAML (``actor:`` / ``critic:``) mirrors key for key.

Batch sizes follow verl's convention:
  - ``mini_batch_size`` counts sequences GLOBALLY (all ranks); one optimizer step per mini-batch, so one
    ``update`` call does ``ppo_epochs * B_global / mini_batch_size`` optimizer steps.
  - ``micro_batch_size`` counts sequences PER RANK; micro-batches accumulate gradients. Losses are
    normalised by token / sequence counts over the whole mini-batch (all micro-batches, all ranks), so the
    result does not depend on the micro-batch split or the world size.
  - ``infer_micro_batch_size`` (per rank) is the chunk size of the no-grad passes (log-probs, values).

Defaults follow RAGEN / verl: actor lr 1e-6, critic lr 1e-5, clip-higher (0.2, 0.28), grad clip 1.0,
value clip 0.5, KL as a k3 ("low-variance") loss when enabled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ragen.utils.hardware import MIXED_PRECISIONS

LR_SCHEDULES = ("constant", "cosine")
MIXED_PRECISION = MIXED_PRECISIONS  # ("auto", "bf16", "fp32")
LOSS_AGG = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")
KL_KINDS = ("k1", "k2", "k3", "low_var_kl")
# Every linear map of a Llama-style decoder layer (mirrors ragen.workers.lora.DEFAULT_TARGETS; peft is imported lazily).
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Ray placement group strategies for the ranks of a worker group (``ragen.workers.group``): PACK keeps the bundles
# on as few nodes as possible, SPREAD on as many; the STRICT_ forms fail rather than bend.
PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


def common_problems(cfg: Any, prefix: str) -> list[str]:
    """The optimisation / batching fields the actor and critic configs share (``prefix`` names the YAML group)."""
    out = []
    if len(tuple(cfg.betas)) != 2:
        out.append(f"{prefix}.betas={cfg.betas} must be two numbers, e.g. [0.9, 0.999]")
    if cfg.lr < 0:
        out.append(f"{prefix}.lr={cfg.lr} must be >= 0")
    if cfg.lr_schedule not in LR_SCHEDULES:
        out.append(f"{prefix}.lr_schedule={cfg.lr_schedule!r} is unknown; use one of {LR_SCHEDULES}")
    if cfg.lr_schedule == "cosine" and cfg.total_steps is not None and cfg.total_steps < 1:
        out.append(f"{prefix}.lr_schedule='cosine' needs {prefix}.total_steps >= 1 (optimizer steps) or null "
                   f"(derived from trainer.total_steps by the trainer), got {cfg.total_steps}")
    if cfg.warmup_steps < 0:
        out.append(f"{prefix}.warmup_steps={cfg.warmup_steps} must be >= 0")
    if not 0.0 <= cfg.min_lr_ratio <= 1.0:
        out.append(f"{prefix}.min_lr_ratio={cfg.min_lr_ratio} must be in [0, 1]")
    if cfg.mixed_precision not in MIXED_PRECISION:
        out.append(f"{prefix}.mixed_precision={cfg.mixed_precision!r} is unknown; use one of {MIXED_PRECISION}")
    if cfg.loss_agg not in LOSS_AGG:
        out.append(f"{prefix}.loss_agg={cfg.loss_agg!r} is unknown; use one of {LOSS_AGG}")
    for name in ("ppo_epochs", "mini_batch_size", "micro_batch_size"):
        if getattr(cfg, name) < 1:
            out.append(f"{prefix}.{name}={getattr(cfg, name)} must be >= 1")
    if cfg.infer_micro_batch_size is not None and cfg.infer_micro_batch_size < 1:
        out.append(f"{prefix}.infer_micro_batch_size={cfg.infer_micro_batch_size} must be >= 1 or null")
    if cfg.grad_clip is not None and cfg.grad_clip <= 0:
        out.append(f"{prefix}.grad_clip={cfg.grad_clip} must be > 0 or null (no clipping)")
    return out


def _refuse(problems: list[str]) -> None:
    if problems:
        raise ValueError("; ".join(problems))


@dataclass(frozen=True)
class ActorConfig:
    """Policy (and reference) worker settings.

    Optimiser: AdamW(lr, betas, eps, weight_decay) on fp32 master weights; linear warmup over
    ``warmup_steps`` optimizer steps, then constant or cosine decay to ``min_lr_ratio * lr`` at
    ``total_steps``. ``grad_clip`` clips the global grad norm (null = no clipping).
    Loss: PPO clipped surrogate with ratio clipped to [1 - clip_low, 1 + clip_high] (clip-higher, DAPO) and
    optional ``dual_clip`` (c > 1, Ye et al. 2020) for negative advantages; minus ``entropy_coef`` * entropy;
    plus ``kl_loss_coef`` * KL(pi || pi_ref) (estimator ``kl_kind``, Schulman's k1/k2/k3) when
    ``use_kl_loss`` (otherwise KL belongs in the reward, applied by the trainer).
    ``temperature`` must equal the rollout temperature: log-probs are of the sampling distribution.
    ``mixed_precision='bf16'`` = bf16 compute with fp32 master weights and optimizer state (GPU: FSDP2
    MixedPrecisionPolicy; CPU: bf16 autocast); ``'fp32'`` = everything fp32 (tests, debugging); ``'auto'``
    (default) = bf16 where the worker's device computes bf16 natively (bf16 GPUs, CPUs with AVX512_BF16 / AMX),
    else fp32 (resolved by the worker, ``ragen.utils.hardware``; the config keeps ``'auto'``).
    ``log_prob_chunk_size`` = tokens per lm_head chunk in ``token_log_probs`` (bounds the logits memory);
    ``checkpoint_lm_head`` recomputes each chunk's logits in backward instead of keeping them.
    LoRA (``ragen.workers.lora``): ``lora_rank`` > 0 trains rank-``lora_rank`` adapters (scale ``lora_alpha /
    lora_rank``) on the ``lora_target_modules`` linears with the base frozen, at ``lr`` (the one learning rate of
    the actor, as in verl; adapters starting from B = 0 usually want a larger one than full fine-tuning, e.g. 1e-5
    to 1e-4); the reference policy is then the actor with its adapters off (no reference worker).
    """

    lr: float = 1e-6
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    warmup_steps: int = 0
    lr_schedule: str = "constant"
    min_lr_ratio: float = 0.0
    total_steps: int | None = None
    grad_clip: float | None = 1.0
    ppo_epochs: int = 1
    mini_batch_size: int = 8
    micro_batch_size: int = 2
    infer_micro_batch_size: int | None = None
    clip_low: float = 0.2
    clip_high: float = 0.28
    dual_clip: float | None = None
    loss_agg: str = "token-mean"
    entropy_coef: float = 0.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_kind: str = "k3"
    temperature: float = 1.0
    log_prob_chunk_size: int = 1024
    checkpoint_lm_head: bool = True
    gradient_checkpointing: bool = False
    mixed_precision: str = "auto"
    seed: int = 0
    lora_rank: int = 0
    lora_alpha: float = 32.0
    lora_target_modules: list[str] = field(default_factory=lambda: list(LORA_TARGETS))

    @property
    def lora(self) -> bool:
        return self.lora_rank > 0

    def __post_init__(self) -> None:
        _refuse(actor_problems(self))
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))  # YAML gives a list
        object.__setattr__(self, "lora_target_modules", tuple(self.lora_target_modules))


def actor_problems(a: Any) -> list[str]:
    """The actor section's values (:func:`common_problems` plus LoRA, clipping, KL and temperature)."""
    out = common_problems(a, "actor")
    if a.lora_rank < 0:
        out.append(f"actor.lora_rank={a.lora_rank} must be >= 0 (0 = train all weights, e.g. 16 = LoRA)")
    if a.lora_rank > 0 and (a.lora_alpha <= 0 or not a.lora_target_modules):
        out.append(f"actor.lora_rank={a.lora_rank} needs actor.lora_alpha > 0 (got {a.lora_alpha}) and some "
                   f"actor.lora_target_modules (got {list(a.lora_target_modules)}, e.g. [q_proj, v_proj])")
    if a.clip_low < 0 or a.clip_high < 0:
        out.append(f"actor.clip_low={a.clip_low} / actor.clip_high={a.clip_high} must be >= 0")
    if a.dual_clip is not None and a.dual_clip <= 1.0:
        out.append(f"actor.dual_clip={a.dual_clip} must be > 1 (e.g. 3.0) or null to disable")
    if a.kl_kind not in KL_KINDS:
        out.append(f"actor.kl_kind={a.kl_kind!r} is unknown; use one of {KL_KINDS}")
    if a.temperature <= 0:
        out.append(f"actor.temperature={a.temperature} must be > 0 (use the rollout temperature)")
    if a.log_prob_chunk_size < 1:
        out.append(f"actor.log_prob_chunk_size={a.log_prob_chunk_size} must be >= 1")
    return out


VALUE_GRADS = ("backbone", "head")  # SharedValueHead.grad / critic.shared_value_grad


@dataclass(frozen=True)
class SharedValueHead:
    """The critic as a value head on the policy's own backbone (``critic.share_backbone``; several RLHF stacks do
    this): ``PolicyWorker`` adds ``Linear(hidden, 1)`` (zero-initialised) on the hidden states its log-probs use and
    trains it jointly, loss = policy loss + ``coef`` * clipped value loss (``clip``) over model tokens, the head at
    learning rate ``lr`` and the backbone at the actor's.
    Saves one model's forward and backward per step and its memory. ``grad``: where the value loss's gradient
    goes: ``backbone`` (the head and, through the hidden states, the policy's features) or ``head`` (the head only,
    on detached hidden states: the value fit cannot move the policy; the head is then a linear probe of features
    the policy loss alone shapes)."""

    coef: float = 0.5
    clip: float | None = 0.5
    lr: float = 1e-5
    grad: str = "backbone"

    def __post_init__(self) -> None:
        if self.grad not in VALUE_GRADS:
            raise ValueError(f"critic.shared_value_grad={self.grad!r} is unknown; use backbone or head")


@dataclass(frozen=True)
class CriticConfig:
    """Critic (value-head model) settings.

    Value loss: clipped (PPO2 style) 0.5 * max((V - R)^2, (clip(V, V_old +- value_clip) - R)^2), aggregated
    with ``loss_agg`` over model tokens when ``mask_env_tokens`` (default; values at prompt / env tokens are
    never used by the estimators) or over all real tokens otherwise. ``value_clip=null`` disables clipping.
    Optimiser and batching fields mean the same as in ``ActorConfig``.
    """

    lr: float = 1e-5
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    warmup_steps: int = 0
    lr_schedule: str = "constant"
    min_lr_ratio: float = 0.0
    total_steps: int | None = None
    grad_clip: float | None = 1.0
    ppo_epochs: int = 1
    mini_batch_size: int = 8
    micro_batch_size: int = 2
    infer_micro_batch_size: int | None = None
    value_clip: float | None = 0.5
    loss_agg: str = "token-mean"
    mask_env_tokens: bool = True
    gradient_checkpointing: bool = False
    mixed_precision: str = "auto"
    seed: int = 0

    def __post_init__(self) -> None:
        _refuse(critic_worker_problems(self))
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))  # YAML gives a list


def critic_worker_problems(c: Any) -> list[str]:
    """The critic worker's values (:func:`common_problems` plus the value clip)."""
    out = common_problems(c, "critic")
    if c.value_clip is not None and c.value_clip <= 0:
        out.append(f"critic.value_clip={c.value_clip} must be > 0 or null to disable")
    return out
