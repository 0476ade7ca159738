"""The PPO family's config checks: estimator, KL and reference model, credit at env tokens, batch shapes, and
values that would change nothing (``ragen.trainer.config.unread_keys``), on top of the checks both families share
(``ragen.trainer.config.shared_checks``). They run before Ray or any model starts, so a bad config fails in seconds.

Each is registered with the preflight registry (``ragen.trainer.config.preflight``) for the ``ppo`` family, whose
``per_env`` checks run once per env of the run (``ragen.trainer.config.env_mix.per_env_configs``). Every message names
the offending key(s), the bad value, and how to fix it. :func:`validate_ppo` runs the family's checks and raises one
:class:`ConfigError`; ``ragen.launch.validate`` runs the checks of ``cfg``'s family.
"""

from __future__ import annotations

import ragen.trainer.config.shared_checks  # noqa: F401  (registers the checks both families share)
import ragen.trainer.config.unread_keys  # noqa: F401  (registers the inert-value rules)
from ragen.algorithms.registry import estimator_args_problems
from ragen.trainer.config.env_mix import per_env_configs
from ragen.trainer.config.preflight import preflight, register, register_family
from ragen.trainer.config.run_shape import (
    GROUP_ESTIMATORS,
    device,
    engine_gpus,
    estimator_needs_values,
    needs_critic,
    needs_ref,
    train_batch_size,
    uses_kl,
    world_size,
)
from ragen.trainer.config.schema import ROLLOUT_FILTERS, ConfigError, TrainConfig
from ragen.trainer.layout import layout_of

register_family("ppo", ("ppo",), envs=per_env_configs)

RETURN_MODES = ("adv_plus_value", "reward_to_go")
KL_KINDS = ("k1", "k2", "k3")
# Estimators whose token-level GAE takes ``skip_env_tokens`` (False: env tokens are steps, their values read).
SKIP_ENV_ESTIMATORS = ("gae", "weighted_gae")
# Estimators that read the step / outcome reward split (``ragen.env.reports_step_split``).
STEP_SPLIT_ESTIMATORS = ("ms_grpo", "ms_po")
# Estimators whose advantages never read ``AdvantageInputs.token_penalties`` (they score R^T / R^O only), so
# ``algorithm.kl_in_reward`` would build a reference model and log a penalty that changes nothing. The authors'
# MS-GRPO / MS-PO trainers add KL as a loss term (GRPO's beta), never to the rewards.
PENALTY_FREE_ESTIMATORS = ("ms_grpo", "ms_po")


def _estimators() -> tuple[str, ...]:
    from ragen.algorithms import ADVANTAGE_ESTIMATORS

    return tuple(ADVANTAGE_ESTIMATORS)


def _check_step_split(cfg: TrainConfig) -> list[str]:
    """MS-GRPO / MS-PO and ``use_step_reward=false`` need an env that reports the step / outcome split."""
    import ragen.env

    name, alg = cfg.env.name, cfg.algorithm
    if name not in ragen.env.names() or ragen.env.reports_step_split(name):
        return []
    what = (f"algorithm.estimator={alg.estimator!r}" if alg.estimator in STEP_SPLIT_ESTIMATORS
            else "algorithm.use_step_reward=false")
    split = [n for n in ragen.env.names() if _split_or_false(n)]
    return [f"{what} needs an env that reports step and outcome rewards separately, but env {name!r} does not; "
            f"use one of {split} or another estimator (e.g. grpo)"]


def _split_or_false(name: str) -> bool:
    import ragen.env

    try:
        return ragen.env.reports_step_split(name)
    except ImportError:  # an optional dependency of that env is missing: it cannot be the one asked for
        return False


@register("env_mix", reads=("rollout.train_envs", "rollout.val_envs", "env"), families=("ppo",))
def check_env_mix(cfg: TrainConfig) -> list[str]:
    """``rollout.train_envs`` / ``val_envs``: every entry names an env config (``per_env_configs`` builds them)."""
    try:
        per_env_configs(cfg)
    except ConfigError as exc:
        return exc.problems
    return []


def check_rollout_correction(cfg: TrainConfig) -> list[str]:
    """``algorithm.rollout_correction``: a known mode and aggregation, a truncation of at least 1 (a smaller one
    would down-weight tokens on which the engine and the trainer agree) and a band around 1."""
    from ragen.algorithms.rollout_correction import MODES, SEQ_AGGS

    rc, key, out = cfg.algorithm.rollout_correction, "algorithm.rollout_correction", []
    if rc.mode not in MODES:
        out.append(f"{key}.mode={rc.mode!r} is unknown; use one of {', '.join(MODES)}")
    if rc.seq_agg not in SEQ_AGGS:
        out.append(f"{key}.seq_agg={rc.seq_agg!r} is unknown; use one of {', '.join(SEQ_AGGS)}")
    if not rc.clip >= 1.0:
        out.append(f"{key}.clip={rc.clip} must be >= 1 (weights are min(ratio, clip); e.g. {key}.clip=2.0)")
    if not (0.0 <= rc.low < 1.0 < rc.high):
        out.append(f"{key}.low={rc.low} / {key}.high={rc.high} must satisfy 0 <= low < 1 < high (tokens whose ratio "
                   f"leaves [low, high] are dropped; e.g. low=0.5, high=2.0)")
    return out


@register("algorithm", reads=("algorithm", "critic.enable", "rollout.group_size", "actor.lora_rank", "ref.enable",
                              "actor.use_kl_loss", "env.name"), after=("env_mix",), families=("ppo",))
def check_algorithm(cfg: TrainConfig) -> list[str]:
    alg, out = cfg.algorithm, check_rollout_correction(cfg)
    names = _estimators()
    if alg.estimator not in names:
        out.append(f"algorithm.estimator={alg.estimator!r} is unknown; registered estimators: {', '.join(names)} "
                   "(select one with algorithm=<name>)")
    out += estimator_args_problems(alg.estimator, alg.estimator_args)
    if estimator_needs_values(alg.estimator) and not needs_critic(cfg):
        out.append(f"algorithm.estimator={alg.estimator!r} needs a critic (values) but critic.enable=false; "
                   "set critic.enable=true (or null) or pick a critic-free estimator such as grpo")
    if alg.estimator in STEP_SPLIT_ESTIMATORS or not alg.use_step_reward:
        out += _check_step_split(cfg)
    if alg.kl_in_reward and alg.estimator in PENALTY_FREE_ESTIMATORS:
        out.append(f"algorithm.kl_in_reward=true has no effect with algorithm.estimator={alg.estimator!r}: its "
                   "advantages read only the step and outcome rewards, not per-token penalties; set "
                   "algorithm.kl_in_reward=false and, for a KL term, actor.use_kl_loss=true (actor.kl_loss_coef)")
    if alg.estimator in GROUP_ESTIMATORS and cfg.rollout.group_size < 2:
        out.append(f"algorithm.estimator={alg.estimator!r} normalises within env groups and needs "
                   f"rollout.group_size >= 2, got {cfg.rollout.group_size}")
    if not 0.0 < alg.rollout_filter_ratio <= 1.0:
        out.append(f"algorithm.rollout_filter_ratio={alg.rollout_filter_ratio} must be in (0, 1] "
                   "(fraction of groups kept; 1.0 = no filtering)")
    out += _check_rollout_filter(cfg)
    if alg.return_mode not in RETURN_MODES:
        out.append(f"algorithm.return_mode={alg.return_mode!r} is unknown; use one of {RETURN_MODES}")
    if alg.kl_kind not in KL_KINDS:
        out.append(f"algorithm.kl_kind={alg.kl_kind!r} is unknown; use one of {KL_KINDS}")
    if cfg.actor.lora and cfg.ref.enable:
        out.append(f"ref.enable=true with actor.lora_rank={cfg.actor.lora_rank}: a LoRA actor is its own reference "
                   "(adapters off); set ref.enable=null")
    elif uses_kl(cfg) and not needs_ref(cfg) and not cfg.actor.lora:
        out.append("a KL term is on (actor.use_kl_loss or algorithm.kl_in_reward) but ref.enable=false; "
                   "set ref.enable=true (or null) or turn the KL term off")
    return out


@register("async_rollout", reads=("trainer.async_rollout", "trainer.max_staleness", "trainer.stale_policy",
                                  "trainer.partial_rollouts", "rollout.engine", "rollout.vllm.placement",
                                  "algorithm.rollout_correction.mode", "env.name", "trainer.device"),
          after=("algorithm",), families=("ppo",))
def check_async(cfg: TrainConfig) -> list[str]:
    """Asynchronous training (``ragen.ppo.async_rollout``): its keys only with ``trainer.async_rollout=true``; an engine
    of its own (a colocated engine stays synchronous); an explicit off-policy correction once tokens may lag; drop
    needs a bound to drop by; agent programs record no policy versions."""
    tr, out = cfg.trainer, []
    if not tr.async_rollout:
        moved = [f"trainer.{k}={getattr(tr, k)}" for k, default in (("max_staleness", 0), ("stale_policy", "wait"),
                                                                    ("partial_rollouts", False))
                 if getattr(tr, k) != default]
        if moved:
            out.append(f"{', '.join(moved)} only apply to asynchronous training; set trainer.async_rollout=true or "
                       "leave them at their defaults")
        return out
    if device(cfg) == "cuda" and cfg.rollout.engine == "hf":
        out.append("trainer.async_rollout=true with rollout.engine=hf on GPUs: the hf engine shares the training GPUs "
                   "(colocated), which stays synchronous; use rollout.engine=vllm rollout.vllm.placement=separate "
                   "(rollout.vllm.rollout_gpus=N), or trainer.async_rollout=false")
    elif device(cfg) == "cuda" and not engine_gpus(cfg):
        out.append("trainer.async_rollout=true with rollout.vllm.placement=colocated: an engine sharing the training "
                   "GPUs stays synchronous; set rollout.vllm.placement=separate and rollout.vllm.rollout_gpus=N")
    if tr.max_staleness >= 1 and cfg.algorithm.rollout_correction.mode == "none":
        from ragen.algorithms.rollout_correction import MODES

        out.append(f"trainer.max_staleness={tr.max_staleness} trains on tokens sampled by older policies, so the "
                   "behaviour policy must be corrected for explicitly: set algorithm.rollout_correction.mode to one of "
                   f"{', '.join(m for m in MODES if m != 'none')} (seq_mask, which drops whole stale episodes "
                   "the current policy would no longer play, is the recommended one, docs/async.md)")
    if tr.stale_policy == "drop" and tr.max_staleness == 0:
        out.append("trainer.stale_policy=drop with trainer.max_staleness=0 would drop every batch played during an "
                   "update; use trainer.stale_policy=wait (the synchronous numbers) or trainer.max_staleness >= 1")
    if cfg.env.name == "agent_program":
        out.append("trainer.async_rollout=true with env=agent_program: agent programs' calls carry no policy "
                   "versions yet; set trainer.async_rollout=false")
    return out


def _check_rollout_filter(cfg: TrainConfig) -> list[str]:
    """``algorithm.rollout_filter`` is known; the variance-share filter's share is in (0, 1] and its groups hold more
    than one episode (a reward variance needs two)."""
    alg, out = cfg.algorithm, []
    if alg.rollout_filter not in ROLLOUT_FILTERS:
        out.append(f"algorithm.rollout_filter={alg.rollout_filter!r} is unknown; use one of "
                   f"{', '.join(ROLLOUT_FILTERS)}")
    if not 0.0 < alg.rollout_filter_variance_share <= 1.0:
        out.append(f"algorithm.rollout_filter_variance_share={alg.rollout_filter_variance_share} must be in (0, 1] "
                   "(share of the batch's reward variance the kept groups hold)")
    if alg.rollout_filter == "variance_share" and cfg.rollout.group_size < 2:
        out.append(f"algorithm.rollout_filter='variance_share' ranks groups by their reward variance and needs "
                   f"rollout.group_size >= 2 (episodes that replay one seed), got {cfg.rollout.group_size}; set "
                   "rollout.group_size=2 or more, or algorithm.rollout_filter=std_ratio")
    return out


def _check_batching(section: str, mini: int, micro: int, batch: int | None, world: int) -> list[str]:
    """``batch`` None: the row count varies (turn layout; the trainer pads rows), only mini/micro/world checks."""
    out = []
    if batch is not None and batch % mini:
        out.append(f"{section}.mini_batch_size={mini} must divide the train batch of {batch} sequences "
                   "(= ceil(algorithm.rollout_filter_ratio * rollout.n_groups) * rollout.group_size); "
                   f"e.g. {section}.mini_batch_size={batch}")
    if mini % world:
        out.append(f"{section}.mini_batch_size={mini} must be a multiple of the {section} world size {world} "
                   f"(trainer.{section}_world_size)")
    elif (mini // world) % micro:
        out.append(f"{section}.micro_batch_size={micro} (per rank) must divide the per-rank mini-batch "
                   f"{mini}/{world}={mini // world}; e.g. {section}.micro_batch_size=1")
    return out


@register("batches", reads=("actor.mini_batch_size", "actor.micro_batch_size", "critic.mini_batch_size",
                            "critic.micro_batch_size", "agent.layout", "rollout", "algorithm.rollout_filter_ratio",
                            "algorithm.rollout_filter",
                            "trainer"), after=("env_mix", "world_sizes", "groups"), families=("ppo",))
def check_batches(cfg: TrainConfig) -> list[str]:
    batch, out = train_batch_size(cfg), []
    rows = layout_of(cfg).rows.fixed_rows(batch)  # None: the rows vary per step (padded to divide)
    if cfg.algorithm.rollout_filter == "variance_share":
        rows = None  # the number of groups kept follows the batch (the trainer pads rows to divide)
    out += _check_batching("actor", cfg.actor.mini_batch_size, cfg.actor.micro_batch_size, rows,
                           world_size(cfg, "actor"))
    if needs_critic(cfg) and not cfg.critic.share_backbone:
        out += _check_batching("critic", cfg.critic.mini_batch_size, cfg.critic.micro_batch_size, rows,
                               world_size(cfg, "critic"))
    if needs_ref(cfg) and rows is not None and rows % world_size(cfg, "ref"):
        out.append(f"the train batch of {batch} sequences must be a multiple of trainer.ref_world_size="
                   f"{world_size(cfg, 'ref')}")
    return out


@register("credit", reads=("critic.mask_env_tokens", "algorithm.estimator", "algorithm.skip_env_tokens",
                           "algorithm.lam"), after=("env_mix",), families=("ppo",), per_env=True)
def check_credit(cfg: TrainConfig) -> list[str]:
    """Critic and estimator settings under which values at env tokens would be trained or read wrongly."""
    alg, out = cfg.algorithm, []
    if needs_critic(cfg) and not cfg.critic.mask_env_tokens:
        out.append("critic.mask_env_tokens=false trains the critic's values at prompt and env tokens toward a return "
                   "of 0 (returns are 0 off model tokens), and no estimator reads values there; set "
                   "critic.mask_env_tokens=true")
    if alg.estimator in SKIP_ENV_ESTIMATORS and not alg.skip_env_tokens and alg.lam < 1.0:
        out.append(f"algorithm.skip_env_tokens=false with algorithm.lam={alg.lam} < 1 makes "
                   f"algorithm.estimator={alg.estimator!r} read critic values at env tokens, which the critic never "
                   "trains (its loss covers model tokens only); set algorithm.skip_env_tokens=true (or "
                   "algorithm.lam=1.0, where those values cancel out)")
    return out


def validate_ppo(cfg: TrainConfig) -> None:
    """Raise :class:`ConfigError` listing every problem of the PPO-family job ``cfg`` (nothing is started before
    this passes): the registered checks of the ``ppo`` family (``ragen.trainer.config.preflight``)."""
    if cfg.algorithm.name != "ppo":
        raise ConfigError([f"algorithm.name={cfg.algorithm.name!r} is not the PPO family (algorithm.name=ppo); the "
                           "ArCHer family runs with python -m ragen.archer"])
    preflight(cfg, "ppo")
