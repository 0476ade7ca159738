"""Config values that would change nothing in the configuration they are set in: rejected before any worker starts.

A key that a run never reads for its settings (``algorithm.lam`` under GRPO, ``actor.kl_loss_coef`` without
``actor.use_kl_loss``, ``rollout.vllm.*`` with the hf engine...) would otherwise be accepted and silently do
nothing. :func:`check_inert` lists each such key whose value differs from its schema default, naming the setting
that makes it inert and the fix. Which algorithm scalars an estimator reads comes from the estimator registry
(``EstimatorSpec.params``), so a new estimator or scalar needs no change here.

``tests/liveness`` walks every key and checks both directions: a value these rules reject would indeed change no
number, and a value they accept changes a named quantity (``docs/config_reference.md``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from ragen.trainer.config.preflight import register
from ragen.trainer.config.schema import SECTIONS, TrainConfig, default_section_values
from ragen.trainer.layout import layout_of
from ragen.workers.config import CriticConfig

# Algorithm keys the PPO trainer reads whatever the estimator (the registry lists the estimator's own scalars).
ALWAYS_READ = ("name", "estimator", "estimator_args", "whiten", "kl_in_reward", "rollout_filter",
               "use_step_reward", "rollout_correction")
# The key each group filter (``algorithm.rollout_filter``) reads.
FILTER_KEYS = {"std_ratio": "rollout_filter_ratio", "variance_share": "rollout_filter_variance_share"}
# Estimators that read the step and outcome rewards themselves: taking the step rewards out of the token rewards
# (``algorithm.use_step_reward=false``) changes nothing they read.
OWN_STEP_SPLIT = ("ms_grpo", "ms_po")
# Estimators whose advantages are already whitened over the batch's model tokens (REINFORCE++): whitening them again
# (``algorithm.whiten``) changes nothing.
SELF_WHITENED = ("reinforce_pp",)
TINY_KEYS = ("tiny_hidden_size", "tiny_num_layers", "tiny_num_heads", "tiny_seed")
ARCHER_CRITIC_KEYS = ("encoder", "encoder_max_length", "head_hidden", "freeze_encoder")
COSINE_KEYS = ("min_lr_ratio", "total_steps")


def algorithm_keys_read(cfg: TrainConfig) -> tuple[str, ...]:
    """The ``algorithm`` keys the PPO trainer reads for ``cfg``'s estimator, layout and switches.

    Always :data:`ALWAYS_READ` (``whiten`` except for :data:`SELF_WHITENED` estimators) and the chosen group filter's
    key (:data:`FILTER_KEYS`), plus the scalars the
    estimator declares, ``eps`` when whitening (the whitening divides by std + eps), ``kl_coef`` / ``kl_kind`` with
    ``kl_in_reward``. ``skip_env_tokens`` only matters where env tokens sit between model tokens of one row (not in
    the turn layout's per-episode view of model tokens) and ``gamma`` or ``lam`` is below 1 (at gamma = lam = 1 the
    values at env tokens telescope away); ``use_step_reward`` is not read by estimators that take the step and
    outcome rewards themselves (:data:`OWN_STEP_SPLIT`).
    """
    from ragen.algorithms import ADVANTAGE_ESTIMATORS

    alg = cfg.algorithm
    spec = ADVANTAGE_ESTIMATORS.get(alg.estimator)
    read = set(ALWAYS_READ) | set(spec.params if spec is not None else ())
    read |= {FILTER_KEYS.get(alg.rollout_filter, "rollout_filter_ratio")}
    if alg.estimator in SELF_WHITENED:
        read.discard("whiten")
    elif alg.whiten:
        read.add("eps")
    if alg.kl_in_reward:
        read |= {"kl_coef", "kl_kind"}
    read -= set(layout_of(cfg).unread_algorithm_keys)
    if alg.gamma == 1.0 and alg.lam == 1.0:
        read.discard("skip_env_tokens")
    if alg.estimator in OWN_STEP_SPLIT:
        read.discard("use_step_reward")
    return tuple(f.name for f in dataclasses.fields(alg) if f.name in read)


def show(value: Any) -> str:
    """``value`` as written on the command line: true / false / null for bools and None, else ``repr``."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    return repr(list(value) if isinstance(value, tuple) else value)


def _set(value: Any, default: Any) -> bool:
    """``value`` differs from the schema ``default`` (tuples and lists compare alike)."""
    def norm(x: Any) -> Any:
        return list(x) if isinstance(x, tuple | list) else x

    return norm(value) != norm(default)


def _inert(cfg: TrainConfig, section: str, keys: tuple[str, ...], why: str, fix: str) -> list[str]:
    """One problem per key of ``section`` in ``keys`` whose value differs from the schema default."""
    defaults = default_section_values(section)
    obj = getattr(cfg, section)
    out = []
    for key in keys:
        value = getattr(obj, key)
        if _set(value, defaults[key]):
            out.append(f"{section}.{key}={show(value)} has no effect: {why}; {fix} (default {show(defaults[key])})")
    return out


def _algorithm(cfg: TrainConfig) -> list[str]:
    alg, read = cfg.algorithm, algorithm_keys_read(cfg)
    unread = tuple(f.name for f in dataclasses.fields(alg) if f.name not in read)
    out, by_layout = [], layout_of(cfg).unread_algorithm_keys
    for key in unread:
        if key == "whiten":  # a self-whitened estimator: whitening again is the no-op, false the plain setting
            if alg.whiten:
                out.append(f"algorithm.whiten=true has no effect: algorithm.estimator={alg.estimator!r} already "
                           "whitens its advantages over the batch; set algorithm.whiten=false "
                           f"(config/algorithm/{alg.estimator}.yaml does)")
            continue
        why = f"algorithm.estimator={alg.estimator!r} does not read it"
        if key in by_layout:
            why = by_layout[key]
        elif key == "skip_env_tokens" and key in _estimator_params(alg.estimator):
            why = "with algorithm.gamma=1 and algorithm.lam=1 the values at env tokens cancel out"
        elif key in FILTER_KEYS.values():
            why = f"algorithm.rollout_filter={alg.rollout_filter!r} does not read it"
        elif key in ("kl_coef", "kl_kind"):
            why = "algorithm.kl_in_reward=false (no KL penalty in the reward)"
        elif key == "eps":
            why = f"algorithm.estimator={alg.estimator!r} does not read it and algorithm.whiten=false"
        elif key == "use_step_reward":
            why = (f"algorithm.estimator={alg.estimator!r} reads the step and outcome rewards itself; for outcome-only "
                   "training use algorithm.estimator=grpo")
        out += _inert(cfg, "algorithm", (key,), why, f"keys it reads: {', '.join(read)}; remove the override")
    return out


def _rollout_correction(cfg: TrainConfig) -> list[str]:
    """``algorithm.rollout_correction`` keys its ``mode`` does not read (``rollout_correction.keys_read``)."""
    from ragen.algorithms.rollout_correction import RolloutCorrectionConfig, keys_read

    rc, defaults, out = cfg.algorithm.rollout_correction, RolloutCorrectionConfig(), []
    read = keys_read(rc.mode)
    for f in dataclasses.fields(rc):
        value, default = getattr(rc, f.name), getattr(defaults, f.name)
        if f.name != "mode" and f.name not in read and _set(value, default):
            reads = f"it reads {', '.join(read)}" if read else "no correction is applied"
            out.append(f"algorithm.rollout_correction.{f.name}={show(value)} has no effect: "
                       f"algorithm.rollout_correction.mode={rc.mode!r} does not read it ({reads}); set a mode that "
                       f"reads it or remove the override (default {show(default)})")
    return out


def _estimator_params(name: str) -> tuple[str, ...]:
    from ragen.algorithms import ADVANTAGE_ESTIMATORS

    spec = ADVANTAGE_ESTIMATORS.get(name)
    return spec.params if spec is not None else ()


def _workers(cfg: TrainConfig) -> list[str]:
    from ragen.trainer.config.run_shape import estimator_needs_values, needs_critic, uses_kl

    a, c, out = cfg.actor, cfg.critic, []
    if not a.use_kl_loss:
        out += _inert(cfg, "actor", ("kl_loss_coef", "kl_kind"), "actor.use_kl_loss=false",
                      "set actor.use_kl_loss=true or remove the override")
    if not a.lora:
        out += _inert(cfg, "actor", ("lora_alpha", "lora_target_modules"), "actor.lora_rank=0 (no LoRA)",
                      "set actor.lora_rank > 0 or remove the override")
        out += _inert(cfg, "actor", ("seed",), "without LoRA adapters to initialise nothing in the actor is random "
                      "(its weights come from model.path; trainer.seed seeds the run)", "remove the override")
    out += _inert(cfg, "critic", ("seed",), "the PPO critic's value head starts at zero, so nothing in it is random "
                  "(the ArCHer family's critic reads it)", "remove the override")
    out += _critic_worker(cfg)
    for section in ("actor", "critic"):
        if getattr(cfg, section).lr_schedule != "cosine":
            out += _inert(cfg, section, COSINE_KEYS, f"{section}.lr_schedule=constant (they shape the cosine decay)",
                          f"set {section}.lr_schedule=cosine or remove the override")
    if not (c.share_backbone and needs_critic(cfg)):
        out += _inert(cfg, "critic", ("shared_loss_coef", "shared_value_grad"),
                      "no critic shares the actor's backbone (critic.share_backbone=false or no critic)",
                      "set critic.share_backbone=true or remove the override")
    out += _inert(cfg, "critic", ARCHER_CRITIC_KEYS, "only the ArCHer family's critic reads it (algorithm.name=ppo)",
                  "remove the override")
    if c.enable and not estimator_needs_values(cfg.algorithm.estimator):
        out.append(f"critic.enable=true has no effect on training: algorithm.estimator={cfg.algorithm.estimator!r} "
                   "reads no values (the critic would train but nothing uses it); set critic.enable=null")
    if cfg.ref.enable and not uses_kl(cfg):
        out.append("ref.enable=true has no effect: no KL term reads the reference (actor.use_kl_loss and "
                   "algorithm.kl_in_reward are false); set ref.enable=null")
    return out


# The keys the command line set (``section.key``), while a command's config is checked (:func:`explicit_keys`);
# None: unknown (a config built in Python), and no key counts as typed.
_EXPLICIT: ContextVar[frozenset[str] | None] = ContextVar("ragen_explicit_keys", default=None)


@contextmanager
def explicit_keys(keys: Iterable[str]) -> Iterator[None]:
    """Within: the rules that follow a context switch (:func:`_critic_worker`) report the ``keys`` the command line
    set (``ragen.launch.cli_main`` wraps every command's checks in it). A recipe's critic settings for its own
    estimator are not the user's mistake when the user switches to a critic-free one (``bash train_ppo.sh
    algorithm=grpo``); a ``critic.lr=...`` typed beside it is. Outside it (a config built in Python) those rules
    report nothing: where the values came from is unknown."""
    token = _EXPLICIT.set(frozenset(keys))
    try:
        yield
    finally:
        _EXPLICIT.reset(token)


def command_line_keys(overrides: Iterable[str]) -> list[str]:
    """The dotted keys a list of Hydra overrides sets (``critic.lr=1e-4``, ``+x.y=1``, ``~x.y``); group choices
    (``algorithm=grpo``) set no key of their own."""
    keys = []
    for item in overrides:
        key = item.split("=", 1)[0].lstrip("+~")
        if "." in key:
            keys.append(key)
    return keys


def _explicit(section: str, keys: tuple[str, ...]) -> tuple[str, ...]:
    """``keys`` of ``section`` the command line set (none when that is unknown)."""
    known = _EXPLICIT.get() or frozenset()
    return tuple(k for k in keys if f"{section}.{k}" in known)


# The critic worker's settings that shape its batches or its speed only; the device presets (config/trainer/*.yaml)
# set them for every run, with or without a critic, so they are never reported as inert.
CRITIC_SHAPE_KEYS = ("mini_batch_size", "micro_batch_size", "infer_micro_batch_size", "gradient_checkpointing")


def _critic_worker(cfg: TrainConfig) -> list[str]:
    """The critic worker's own optimiser and loss settings where no critic worker trains: without a critic (an
    estimator that reads no values) all of them, ``model_path`` and ``share_backbone`` too; with the value head on
    the actor's backbone all but ``lr`` and ``value_clip``, the two the head reads (its AdamW group's rate and its
    value clip): it trains in the actor's update, with the actor's epochs, schedule, clipping, loss aggregation and
    precision. ``critic.seed`` has its own rule, ``enable`` and the ``shared_*`` keys theirs, and
    :data:`CRITIC_SHAPE_KEYS` are left alone. Within :func:`explicit_keys` only the keys the command line set count:
    a recipe's critic settings stay valid when the command switches its estimator or the head's place."""
    from ragen.trainer.config.run_shape import needs_critic

    skip = ("seed", *CRITIC_SHAPE_KEYS)
    own = tuple(f.name for f in dataclasses.fields(CriticConfig) if f.name not in skip) + ("model_path",)
    if not needs_critic(cfg):
        return _inert(cfg, "critic", _explicit("critic", own + ("share_backbone",)), f"no critic: algorithm.estimator="
                      f"{cfg.algorithm.estimator!r} reads no values", "remove the override (or choose an estimator "
                      "with a critic: gae, turn_gae, bilevel_gae, weighted_gae)")
    if cfg.critic.share_backbone:
        return _inert(cfg, "critic", _explicit("critic", tuple(k for k in own if k not in ("lr", "value_clip"))),
                      "critic.share_backbone=true: the value head trains in the actor's update (its epochs, schedule, "
                      "gradient clipping, loss aggregation and precision are the actor's; the head reads only "
                      "critic.lr and critic.value_clip)", "set the actor's key, or critic.share_backbone=false")
    return []


def _sections(cfg: TrainConfig) -> list[str]:
    out = []
    if not cfg.model.tiny:
        out += _inert(cfg, "model", TINY_KEYS, "model.tiny=false (they size the tiny random model)",
                      "set model.tiny=true or remove the override")
    archer_keys = tuple(f.name for f in dataclasses.fields(SECTIONS["archer"]))
    out += _inert(cfg, "archer", archer_keys, "algorithm.name=ppo (the archer section is the ArCHer family's loop)",
                  "use algorithm.name=archer | chai | filtered_bc (python -m ragen.archer) or remove the override")
    return out + _engine_sections(cfg)


def _engine_sections(cfg: TrainConfig) -> list[str]:
    """The settings sections of the engines not selected (``rollout.<section>`` of each registry entry,
    ``ragen.rollout.registry``): their keys configure another engine."""
    from ragen.rollout.registry import engine_entries

    out = []
    for entry in engine_entries():
        if entry.section is None or entry.name == cfg.rollout.engine or not hasattr(cfg.rollout, entry.section):
            continue
        section = getattr(cfg.rollout, entry.section)
        defaults, key = type(section)(), f"rollout.{entry.section}"
        for f in dataclasses.fields(section):
            value = getattr(section, f.name)
            if _set(value, getattr(defaults, f.name)):
                out.append(f"{key}.{f.name}={show(value)} has no effect: rollout.engine={cfg.rollout.engine!r} "
                           f"({key} configures the {entry.label or entry.name} engine); set rollout.engine="
                           f"{entry.name} or remove the override (default {show(getattr(defaults, f.name))})")
    return out


def _agent(cfg: TrainConfig) -> list[str]:
    """``agent.history_thinking=strip`` where every env of the run (train and validation) plays one turn: no prompt
    holds an earlier turn, so there is no thinking to cut."""
    from ragen.trainer.config.env_mix import per_env_configs
    from ragen.trainer.config.schema import ConfigError

    if cfg.agent.history_thinking != "strip":
        return []
    try:
        turns = max(sub.env.max_turn for sub in per_env_configs(cfg))
    except ConfigError:  # a bad rollout.train_envs / val_envs entry: validation reports it
        return []
    if turns > 1:
        return []
    return ["agent.history_thinking='strip' has no effect: every env of the run plays one turn (env.max_turn=1), so "
            "no prompt holds an earlier turn's thinking; remove the override (default 'keep')"]


# The agent keys the program rollout driver reads (``ragen.agent.program_rollout``): sampling, budgets and the layout.
PROGRAM_AGENT_KEYS = ("max_model_len", "max_new_tokens", "temperature", "top_p", "top_k", "layout")


def _program(cfg: TrainConfig) -> list[str]:
    """``env=agent_program``: the agent keys typed on the command line that shape the env proxy's prompts and
    parsing, which a program writes and reads itself (:data:`PROGRAM_AGENT_KEYS` are read)."""
    from ragen.env.agent_program import PROGRAM_ENV

    if cfg.env.name != PROGRAM_ENV:
        return []
    unread = tuple(f.name for f in dataclasses.fields(cfg.agent)
                   if f.name not in PROGRAM_AGENT_KEYS and f.name != "format_penalty")
    why = f"env={PROGRAM_ENV} runs your program, which writes its own prompts and reads its own answers"
    return (_inert(cfg, "agent", _explicit("agent", unread), why, "remove the override")
            + _inert(cfg, "agent", _explicit("agent", ("format_penalty",)), why,
                     "the gateway's penalty for a malformed tool call is env.config.format_penalty; set that instead")
            + _inert(cfg, "sft", _explicit("sft", ("noise",)), "the program's expert (env.config.expert) answers "
                     "every call of its warm start; there are no legal actions to draw from", "remove the override"))


def _trainer(cfg: TrainConfig) -> list[str]:
    """``trainer.collapse_prompts`` where the collapse metrics are off (``trainer.collapse_every=0``)."""
    if cfg.trainer.collapse_every > 0:
        return []
    return _inert(cfg, "trainer", ("collapse_prompts",), "trainer.collapse_every=0 (no collapse metrics)",
                  "set trainer.collapse_every > 0 or remove the override")


@register("inert", reads=("algorithm", "actor", "critic", "ref", "model", "archer", "rollout", "agent",
                          "trainer.collapse_every", "trainer.collapse_prompts"),
          after=("env_mix",), families=("ppo",))
def check_inert(cfg: TrainConfig) -> list[str]:
    """Problems naming each key of a PPO-trainer config (``algorithm.name=ppo``) set to a non-default value that
    nothing reads in this configuration (see the module docstring)."""
    return (_algorithm(cfg) + _rollout_correction(cfg) + _workers(cfg) + _sections(cfg) + _agent(cfg)
            + _program(cfg) + _trainer(cfg))
