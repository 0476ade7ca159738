"""The PPO family's config checks: estimator, KL and reference model, credit at env tokens, batch shapes, and
values that would change nothing (``ragen.trainer.inert``), on top of the checks both families share
(``ragen.trainer.checks``). They run before Ray or any model starts, so a bad config fails in seconds.

Every message names the offending key(s), the bad value, and how to fix it. :func:`validate_ppo` collects all
problems and raises one :class:`ConfigError`; ``ragen.launch.validate`` picks it or the ArCHer family's checks by
``algorithm.name``.
"""

from __future__ import annotations

from ragen.trainer.checks import check_agent, check_attention, check_env, check_trainer, check_warm_start
from ragen.trainer.config import ConfigError, TrainConfig
from ragen.trainer.derived import (
    GROUP_ESTIMATORS,
    estimator_needs_values,
    needs_critic,
    needs_ref,
    train_batch_size,
    uses_kl,
    world_size,
)
from ragen.trainer.inert import check_inert
from ragen.trainer.layout import layout_of

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


def check_algorithm(cfg: TrainConfig) -> list[str]:
    alg, out = cfg.algorithm, check_rollout_correction(cfg)
    names = _estimators()
    if alg.estimator not in names:
        out.append(f"algorithm.estimator={alg.estimator!r} is unknown; registered estimators: {', '.join(names)} "
                   "(select one with algorithm=<name>)")
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


def check_batches(cfg: TrainConfig) -> list[str]:
    batch, out = train_batch_size(cfg), []
    rows = layout_of(cfg).rows.fixed_rows(batch)  # None: the rows vary per step (padded to divide)
    out += _check_batching("actor", cfg.actor.mini_batch_size, cfg.actor.micro_batch_size, rows,
                           world_size(cfg, "actor"))
    if needs_critic(cfg) and not cfg.critic.share_backbone:
        out += _check_batching("critic", cfg.critic.mini_batch_size, cfg.critic.micro_batch_size, rows,
                               world_size(cfg, "critic"))
    if needs_ref(cfg) and rows is not None and rows % world_size(cfg, "ref"):
        out.append(f"the train batch of {batch} sequences must be a multiple of trainer.ref_world_size="
                   f"{world_size(cfg, 'ref')}")
    return out


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
    this passes): the shared checks per env of the run, then the PPO family's own."""
    from ragen.trainer.env_mix import per_env_configs

    if cfg.algorithm.name != "ppo":
        raise ConfigError([f"algorithm.name={cfg.algorithm.name!r} is not the PPO family (algorithm.name=ppo); the "
                           "ArCHer family runs with python -m ragen.archer"])
    try:
        envs = per_env_configs(cfg)
    except ConfigError as exc:  # a rollout.train_envs / val_envs entry that names no env config
        raise ConfigError(exc.problems + check_trainer(cfg)) from None
    problems = check_algorithm(cfg) + check_trainer(cfg) + check_attention(cfg) + check_inert(cfg)
    for sub in envs:  # each env of the run with its own turn limits, prompts and expert
        problems += check_env(sub) + check_credit(sub) + check_agent(sub) + check_warm_start(sub)
    problems = list(dict.fromkeys(problems))
    if not any("world_size" in p or "n_groups" in p for p in problems):
        problems += check_batches(cfg)
    if not problems:
        problems += _check_agent_config(cfg)
    if problems:
        raise ConfigError(problems)


def _check_agent_config(cfg: TrainConfig) -> list[str]:
    """The agent proxy's own checks (``AgentConfig.__post_init__``: sizes, timeouts...), so they also fail before
    any worker starts; messages name the trainer's keys."""
    try:
        cfg.agent_config()
    except ValueError as exc:
        msg = str(exc).replace("AgentConfig.max_turn", "env.max_turn")
        return [msg.replace("AgentConfig.max_actions_per_turn", "env.max_actions_per_turn").replace(
            "AgentConfig.", "agent.")]
    return []
