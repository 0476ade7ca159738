"""Values derived from the frozen config (never stored back into it): roles, world sizes, batch shapes."""

from __future__ import annotations

import dataclasses
import math

from ragen.agent.layout import row_layout
from ragen.trainer.config.schema import TrainConfig
from ragen.workers.config import ActorConfig, CriticConfig, SharedValueHead

# Estimators that normalise within env groups and so need group_size >= 2.
GROUP_ESTIMATORS = ("grpo", "rloo", "ms_grpo", "ms_po", "gigpo")


def estimator_needs_values(name: str) -> bool:
    """True when estimator ``name`` reads the critic's values (its registry spec lists ``values``)."""
    from ragen.algorithms import ADVANTAGE_ESTIMATORS

    spec = ADVANTAGE_ESTIMATORS.get(name)
    return spec is not None and "values" in spec.needs


def needs_critic(cfg: TrainConfig) -> bool:
    """Critic on: ``critic.enable`` when set, else exactly when the estimator needs values."""
    if cfg.critic.enable is not None:
        return bool(cfg.critic.enable)
    return estimator_needs_values(cfg.algorithm.estimator)


def critic_worker_needed(cfg: TrainConfig) -> bool:
    """A critic worker group of its own: the critic is on and does not share the policy's backbone
    (``critic.share_backbone``: the actor then carries the value head)."""
    return needs_critic(cfg) and not cfg.critic.share_backbone


def shared_value_head(cfg: TrainConfig) -> SharedValueHead | None:
    """The actor's value head settings when the critic shares its backbone, else None."""
    if not (needs_critic(cfg) and cfg.critic.share_backbone):
        return None
    return SharedValueHead(coef=cfg.critic.shared_loss_coef, clip=cfg.critic.value_clip, lr=cfg.critic.lr,
                           grad=cfg.critic.shared_value_grad)


def uses_kl(cfg: TrainConfig) -> bool:
    return bool(cfg.actor.use_kl_loss or cfg.algorithm.kl_in_reward)


def needs_ref(cfg: TrainConfig) -> bool:
    """Reference worker on: ``ref.enable`` when set, else exactly when a KL term is used and the actor is not LoRA
    (a LoRA actor is its own reference: adapters off, ``PolicyWorker.compute_ref_log_probs``)."""
    if cfg.actor.lora:
        return False
    if cfg.ref.enable is not None:
        return bool(cfg.ref.enable)
    return uses_kl(cfg)


def device(cfg: TrainConfig) -> str:
    """``cpu`` or ``cuda`` (``auto`` = cuda when GPUs are configured and visible)."""
    if cfg.trainer.device != "auto":
        return cfg.trainer.device
    import torch

    return "cuda" if cfg.trainer.n_gpus_per_node > 0 and torch.cuda.is_available() else "cpu"


def total_gpus(cfg: TrainConfig) -> int:
    return cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes


def engine_gpus(cfg: TrainConfig) -> int:
    """GPUs reserved for the rollout engine alone: ``rollout.vllm.rollout_gpus`` with ``placement=separate``, else
    0 (the hf engine, and a colocated vLLM engine, share the training GPUs)."""
    v = cfg.rollout.vllm
    return v.rollout_gpus if cfg.rollout.engine == "vllm" and v.placement == "separate" else 0


def offload_mode(cfg: TrainConfig) -> str:
    """``trainer.offload`` resolved to ``phase`` or ``none``: ``auto`` is phase where a rollout engine shares the
    training GPUs and frees its memory between rollouts (device cuda; the hf engine, or vLLM colocated with sleep
    mode) in the PPO trainer, whose step sleeps and wakes the engine around the training phases; none elsewhere
    (CPU: the host is the device)."""
    mode = cfg.trainer.offload
    if mode != "auto":
        return mode
    return "phase" if engine_shares_memory(cfg) and cfg.algorithm.name == "ppo" else "none"


def engine_shares_memory(cfg: TrainConfig) -> bool:
    """The rollout engine takes turns with the training state on the training GPUs: device cuda and the hf engine,
    or vLLM colocated with sleep mode (without it vLLM holds its memory all the time; on GPUs of its own it never
    shares them)."""
    if device(cfg) != "cuda":
        return False
    v = cfg.rollout.vllm
    return cfg.rollout.engine != "vllm" or (not engine_gpus(cfg) and v.enable_sleep_mode)


def training_gpus(cfg: TrainConfig) -> int:
    """GPUs the actor / critic / reference ranks may use: all GPUs less the engine's own."""
    return total_gpus(cfg) - engine_gpus(cfg)


def world_size(cfg: TrainConfig, role: str) -> int:
    """World size of ``role`` (actor / critic / ref): the configured one, else all training GPUs, else 1."""
    value = getattr(cfg.trainer, f"{role}_world_size")
    if value is not None:
        return int(value)
    return max(1, training_gpus(cfg)) if device(cfg) == "cuda" else 1


def kept_groups(cfg: TrainConfig) -> int:
    """Groups kept after rollout filtering: ``ceil(rollout_filter_ratio * n_groups)`` (at least 1), ``n_groups``
    summed over the training envs (``ragen.trainer.config.env_mix``); with ``algorithm.rollout_filter=variance_share``
    the number follows each batch, and this is its upper bound, ``n_groups``."""
    from ragen.trainer.config.env_mix import n_train_groups

    if cfg.algorithm.rollout_filter == "variance_share":
        return n_train_groups(cfg)
    return max(1, math.ceil(cfg.algorithm.rollout_filter_ratio * n_train_groups(cfg) - 1e-9))


def train_batch_size(cfg: TrainConfig) -> int:
    """Sequences per training step after filtering (``turn`` layout: one row per turn, so this counts episodes)."""
    return kept_groups(cfg) * cfg.rollout.group_size


def optimizer_steps_per_trainer_step(cfg: TrainConfig, role: str) -> int:
    """Optimizer steps one ``update`` of ``role`` (actor / critic) runs: ppo_epochs x mini-batches of the batch.

    Trajectory layout: ``train_batch_size / mini_batch_size`` mini-batches. Turn layout: the row count varies,
    so this uses its upper bound, one row per turn of every episode (the training envs' most turns each); the
    padding rows that make the row count divisible form mini-batches without a loss token, which take no optimizer
    or lr-schedule step (``Trainable.update``), so they are not counted. Past the bound a cosine schedule holds its
    final rate.
    """
    section = cfg.actor if role == "actor" else cfg.critic
    from ragen.trainer.config.env_mix import max_turns

    rows = row_layout(cfg.agent.layout).max_rows(train_batch_size(cfg), max_turns(cfg))
    return section.ppo_epochs * max(1, math.ceil(rows / section.mini_batch_size))


def worker_total_steps(cfg: TrainConfig, role: str) -> int:
    """``<role>.total_steps`` (optimizer steps, the horizon of the cosine schedule); null = derived from
    ``trainer.total_steps``: the trainer steps that update ``role`` (the actor skips ``trainer.critic_warmup``)
    times :func:`optimizer_steps_per_trainer_step`."""
    section = cfg.actor if role == "actor" else cfg.critic
    if section.total_steps is not None:
        return int(section.total_steps)
    updates = cfg.trainer.total_steps - (cfg.trainer.critic_warmup if role == "actor" else 0)
    return max(1, updates) * optimizer_steps_per_trainer_step(cfg, role)


def actor_worker_config(cfg: TrainConfig) -> ActorConfig:
    """The policy workers' config: ``cfg.actor`` with ``total_steps`` resolved (the frozen config is unchanged)."""
    return dataclasses.replace(cfg.actor, total_steps=worker_total_steps(cfg, "actor"))


def critic_worker_config(cfg: TrainConfig) -> CriticConfig:
    """The critic workers' config: ``cfg.critic`` without trainer-only keys, ``total_steps`` resolved."""
    return cfg.critic.worker_config(total_steps=worker_total_steps(cfg, "critic"))


# Characters per token used to size prompts without a tokenizer: BPE tokenizers average 3-4.5 characters per
# token on English text and fewer on grids and symbols, so this rarely overestimates.
CHARS_PER_TOKEN = 4


@dataclasses.dataclass(frozen=True)
class TokenEstimate:
    """Tokens of one ``trajectory`` row at worst-case response lengths, estimated without a tokenizer.

    ``first_prompt``: system prompt + env instructions + the first user message; ``observations``: the user
    messages of turns 1..max_turn-1; ``responses``: ``env.max_turn * agent.max_new_tokens``. The chat template's
    own tokens are not counted, so ``total`` is an estimate from below.
    """

    first_prompt: int
    observations: int
    responses: int

    @property
    def total(self) -> int:
        return self.first_prompt + self.observations + self.responses


def env_texts(cfg: TrainConfig) -> tuple[str, str, str]:
    """(instructions, first observation, legal actions) of one env built from ``cfg.env``; empty strings when the
    env cannot be built here (its errors surface in the rollout, where each env failure is isolated)."""
    import ragen.env

    try:
        env = ragen.env.make(cfg.env.name, **dict(cfg.env.config))
        observation = env.reset(cfg.trainer.seed)
        return str(env.instructions), str(observation), str(env.legal_actions())
    except Exception:  # noqa: BLE001 - an estimate: fall back to the proxy's own text
        return "", "", ""


def trajectory_token_estimate(cfg: TrainConfig) -> TokenEstimate:
    """Estimate a trajectory row's tokens (see :class:`TokenEstimate`): the proxy's user messages rendered with
    the env's real texts (the first observation stands in for later ones), at :data:`CHARS_PER_TOKEN`."""
    from ragen.agent.rollout import user_text

    ag, turns, actions = cfg.agent, cfg.env.max_turn, cfg.env.max_actions_per_turn
    instructions, observation, legal = env_texts(cfg)
    prefix = len(ag.response_prefix)
    first = (len(ag.system_prompt or "") + len(instructions) + 2 + prefix
             + len(user_text(ag, observation, legal, 0, turns, actions)))
    rest = sum(len(user_text(ag, observation, legal, k, turns, actions)) + prefix for k in range(1, turns))
    return TokenEstimate(first // CHARS_PER_TOKEN, rest // CHARS_PER_TOKEN, turns * ag.max_new_tokens)
