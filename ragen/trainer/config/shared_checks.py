"""Config checks both algorithm families run before Ray or any model starts, so a bad config fails in seconds.

The env (its name, keys, and the env's own constructor checks), the agent's token budgets and sampling (and the
agent proxy's own value checks, ``ragen.agent.config.agent_problems``), the trainer's devices, world sizes, engine
and loggers, and the warm start. Each is registered with the preflight registry (``ragen.trainer.config.preflight``:
its name, the keys it reads and the checks it runs after); the PPO family adds its estimator, credit and batch
checks (``ragen.trainer.config.ppo_checks``), the ArCHer family its loop's (``ragen.archer.main``). Every check returns
a list of messages, each naming the offending key(s), the bad value and how to fix it; ``preflight`` raises them
together as one :class:`ragen.trainer.config.schema.ConfigError`.

The rollout engine's checks read its registry entry (``ragen.rollout.registry``): which names a run accepts, which
packages it needs; an engine with checks of its own beyond those (vLLM's placement) lists them in
:data:`ENGINE_CHECKS`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from ragen.agent.config import agent_problems
from ragen.models.attention import ATTN_IMPLEMENTATIONS, FLASH, flash_problems
from ragen.rollout.registry import engine_entry, training_engines
from ragen.trainer.config.archer_schema import archer_problems
from ragen.trainer.config.preflight import register
from ragen.trainer.config.run_shape import (
    CHARS_PER_TOKEN,
    critic_worker_needed,
    device,
    engine_gpus,
    engine_shares_memory,
    needs_critic,
    total_gpus,
    training_gpus,
    trajectory_token_estimate,
    world_size,
)
from ragen.trainer.config.schema import TrainConfig, algorithm_problems, sft_problems, trainer_problems
from ragen.trainer.layout import layout_of
from ragen.utils.hardware import ENGINE_DTYPES
from ragen.workers.config import VALUE_GRADS, actor_problems, critic_worker_problems


@register("env", reads=("env",), after=("env_mix",), per_env=True)
def check_env(cfg: TrainConfig) -> list[str]:
    import ragen.env

    env = cfg.env
    out = []
    if env.name not in ragen.env.names():
        return [f"env.name={env.name!r} is unknown; registered envs: {', '.join(ragen.env.names())} "
                "(select one with env=<name>)"]
    out += ragen.env.missing_extras(env.name)
    valid = ragen.env.config_keys(env.name)
    bad = sorted(set(env.config) - set(valid))
    if bad:
        out.append(f"env.config has unknown key(s) {bad} for env {env.name!r}; valid keys: {', '.join(valid)}")
    else:
        out += _env_refuses(env.name, dict(env.config))
    if env.max_turn < 1:
        out.append(f"env.max_turn={env.max_turn} must be >= 1 (turns per episode); e.g. env.max_turn=1")
    if env.max_actions_per_turn < 1:
        out.append(f"env.max_actions_per_turn={env.max_actions_per_turn} must be >= 1")
    return out


def _env_refuses(name: str, config: dict) -> list[str]:
    """The env's own checks of its config (values, data files, optional packages, keys that do nothing with the
    other settings): build it once, as every env slot will be, and report what its constructor raises."""
    import ragen.env

    try:
        ragen.env.make(name, **config)
    except (ValueError, TypeError, FileNotFoundError, ImportError) as exc:
        return [f"env.config of env {name!r} is refused by the env: {type(exc).__name__}: {exc}"]
    return []


@register("agent_program", reads=("env.name", "env.config.tool_parser", "rollout.train_envs", "rollout.val_envs",
                                  "algorithm.name"), after=("env_mix",))
def check_agent_program(cfg: TrainConfig) -> list[str]:
    """``env=agent_program`` (the user's program, ``ragen.env.agent_program``): the PPO family only, alone in its
    run (it is played by its own rollout driver, chosen by ``env.name``), with a known tool-call format."""
    from ragen.env.agent_program import PROGRAM_ENV
    from ragen.gateway.toolcalls import TOOL_PARSERS

    out = []
    for key in ("train_envs", "val_envs"):
        names = [e.get("name") if isinstance(e, dict) else e for e in getattr(cfg.rollout, key)]
        if PROGRAM_ENV in names:
            out.append(f"rollout.{key} names {PROGRAM_ENV}: an agent program is played alone; set env={PROGRAM_ENV} "
                       f"(with rollout.n_groups / rollout.val_n_groups) and rollout.{key}=[]")
    if cfg.env.name != PROGRAM_ENV:
        return out
    if cfg.algorithm.name != "ppo":
        out.append(f"algorithm.name={cfg.algorithm.name!r} cannot train env={PROGRAM_ENV}: the ArCHer family samples "
                   "turn by turn itself; use algorithm.name=ppo (python -m ragen.train)")
    parser = dict(cfg.env.config).get("tool_parser", "hermes")
    if parser not in TOOL_PARSERS:
        out.append(f"env.config.tool_parser={parser!r} is unknown; use one of {', '.join(sorted(TOOL_PARSERS))}")
    return out


@register("agent", reads=("agent", "actor.temperature", "env.max_turn"), after=("env_mix",), per_env=True)
def check_agent(cfg: TrainConfig) -> list[str]:
    ag, out = cfg.agent, []
    if ag.max_new_tokens >= ag.max_model_len:
        out.append(f"agent.max_new_tokens={ag.max_new_tokens} leaves no room for the prompt within "
                   f"agent.max_model_len={ag.max_model_len}; raise max_model_len or lower max_new_tokens")
    elif layout_of(cfg).holds_whole_history:
        out += budget_problems(cfg)
    out += layout_of(cfg).checks(cfg)  # what would make the layout's rows differ from what the model saw
    if abs(cfg.actor.temperature - ag.temperature) > 1e-9:
        out.append(f"actor.temperature={cfg.actor.temperature} differs from agent.temperature={ag.temperature}: "
                   "old log-probs would not be those of the sampling distribution; set actor.temperature to the "
                   "same value (base.yaml uses ${agent.temperature})")
    if ag.top_p < 1.0 or ag.top_k > 0:
        out.append(f"agent.top_p={ag.top_p} / agent.top_k={ag.top_k} truncate sampling, but the trainer's "
                   "log-probs are of the full distribution; keep top_p=1.0 and top_k=0 for training rollouts")
    return out


@register("trainer", reads=("trainer", "rollout", "critic", "actor.lr", "algorithm.name", "algorithm.estimator",
                            "agent.temperature"))
def check_trainer(cfg: TrainConfig) -> list[str]:
    tr, out = cfg.trainer, []
    if tr.total_steps < 0 or (tr.total_steps == 0 and not tr.val_only and tr.sft_warmup_steps < 1):
        out.append(f"trainer.total_steps={tr.total_steps} must be >= 1 (or set trainer.val_only=true, or "
                   "trainer.sft_warmup_steps >= 1 for a warm start only)")
    out += _frozen_learners(cfg)
    if tr.device not in ("auto", "cpu", "cuda"):
        out.append(f"trainer.device={tr.device!r} is unknown; use auto, cpu or cuda")
    out += check_engine(cfg)
    if cfg.rollout.dtype not in ENGINE_DTYPES:
        out.append(f"rollout.dtype={cfg.rollout.dtype!r} is unknown; use one of {', '.join(ENGINE_DTYPES)} "
                   "(auto = bfloat16 where the device computes bf16 natively, else float32)")
    if cfg.rollout.val_temperature is not None and cfg.rollout.val_temperature < 0:
        out.append(f"rollout.val_temperature={cfg.rollout.val_temperature} must be >= 0 (0 = greedy) or null "
                   "(= agent.temperature)")
    if device(cfg) == "cuda" and total_gpus(cfg) < 1:
        out.append("trainer.device=cuda but trainer.n_gpus_per_node * trainer.nnodes = 0; set n_gpus_per_node")
    if tr.critic_warmup < 0:
        out.append(f"trainer.critic_warmup={tr.critic_warmup} must be >= 0")
    elif tr.critic_warmup and not needs_critic(cfg):
        out.append(f"trainer.critic_warmup={tr.critic_warmup} needs a critic; set it to 0 or enable the critic")
    elif tr.critic_warmup and cfg.critic.share_backbone:
        out.append(f"trainer.critic_warmup={tr.critic_warmup} with critic.share_backbone=true: the shared value head "
                   "trains only with the actor's update; set trainer.critic_warmup=0 or critic.share_backbone=false")
    if cfg.critic.shared_value_grad not in VALUE_GRADS:
        out.append(f"critic.shared_value_grad={cfg.critic.shared_value_grad!r} is unknown; use backbone (the value "
                   "loss trains the head and the shared backbone) or head (the head only)")
    for name in tr.loggers:
        if name not in ("console", "jsonl", "wandb"):
            out.append(f"trainer.loggers has unknown logger {name!r}; choose from console, jsonl, wandb")
    if tr.report_train_samples < 0:
        out.append(f"trainer.report_train_samples={tr.report_train_samples} must be >= 0 (training episodes per "
                   "step saved for the run report; 0 = none)")
    if tr.report_val_samples is not None and tr.report_val_samples < 0:
        out.append(f"trainer.report_val_samples={tr.report_val_samples} must be >= 0 or null (validation episodes "
                   "saved with their tokens and credit for the run report; null = all, 0 = none)")
    if tr.keep_last_ckpt is not None and tr.keep_last_ckpt < 1:
        out.append(f"trainer.keep_last_ckpt={tr.keep_last_ckpt} must be >= 1 or null (keep all)")
    return out + check_offload(cfg)


@register("world_sizes", reads=("trainer.actor_world_size", "trainer.critic_world_size", "trainer.ref_world_size",
                                "trainer.device", "trainer.n_gpus_per_node", "trainer.nnodes", "trainer.use_ray",
                                "rollout.vllm.placement", "rollout.vllm.rollout_gpus"))
def check_world_sizes(cfg: TrainConfig) -> list[str]:
    """Every role's world size: at least 1, within the training GPUs, and 1 without Ray."""
    out = []
    for role in ("actor", "critic", "ref"):
        ws = world_size(cfg, role)
        if ws < 1:
            out.append(f"trainer.{role}_world_size={ws} must be >= 1 (or null = all GPUs)")
        elif device(cfg) == "cuda" and ws > training_gpus(cfg):
            out.append(f"trainer.{role}_world_size={ws} exceeds the {training_gpus(cfg)} training GPUs "
                       "(trainer.n_gpus_per_node * trainer.nnodes, less rollout.vllm.rollout_gpus with "
                       "rollout.vllm.placement=separate)")
        elif not cfg.trainer.use_ray and ws > 1:
            out.append(f"trainer.{role}_world_size={ws} needs Ray; set trainer.use_ray=true or the world size to 1")
    return out


@register("groups", reads=("rollout.n_groups", "rollout.group_size", "rollout.val_n_groups",
                           "rollout.val_group_size"))
def check_groups(cfg: TrainConfig) -> list[str]:
    """The batch shape: at least one group of at least one env, for training and for validation."""
    out = []
    if cfg.rollout.n_groups < 1 or cfg.rollout.group_size < 1:
        out.append(f"rollout.n_groups={cfg.rollout.n_groups} and rollout.group_size={cfg.rollout.group_size} "
                   "must be >= 1")
    if cfg.rollout.val_n_groups < 1 or cfg.rollout.val_group_size < 1:
        out.append("rollout.val_n_groups and rollout.val_group_size must be >= 1")
    return out


def check_engine(cfg: TrainConfig) -> list[str]:
    """``rollout.engine``: a registered engine a run may train with (``ragen.rollout.registry``), its packages
    importable (:func:`check_engine_packages`), and the engine's own checks (:data:`ENGINE_CHECKS`)."""
    engines = training_engines()
    if cfg.rollout.engine not in engines:
        return [f"rollout.engine={cfg.rollout.engine!r} is unknown; use one of {engines}"]
    return check_engine_packages(cfg) + [p for check in ENGINE_CHECKS.get(cfg.rollout.engine, ()) for p in check(cfg)]


def check_engine_packages(cfg: TrainConfig) -> list[str]:
    """The packages the engine's entry names (``EngineEntry.packages``) must be importable: on CPU always, with
    ``trainer.device=cuda`` where CUDA is visible (this machine would start the run; planning from one without GPUs
    is not refused). The message is the entry's for the device, or a generic one."""
    import importlib.util

    entry = engine_entry(cfg.rollout.engine)
    missing = [p for p in entry.packages if importlib.util.find_spec(p) is None]
    dev = device(cfg)
    if not missing or (dev == "cuda" and not _cuda_visible()):
        return []
    return [entry.missing.get(dev) or f"rollout.engine={entry.name} needs the package(s) {', '.join(missing)}, "
            "which are not importable in this environment; install them or use rollout.engine=hf"]


def check_offload(cfg: TrainConfig) -> list[str]:
    """``trainer.offload=phase`` where it would move nothing useful: on CPU (the host is the device), beside a
    separately placed engine (it has GPUs of its own and never wakes on the training GPUs) or a vLLM engine without
    sleep mode (it never frees its memory), or in the ArCHer family (its loop does not run the between-phase
    schedule)."""
    if cfg.trainer.offload != "phase":
        return []
    if cfg.algorithm.name != "ppo":
        why = f"algorithm.name={cfg.algorithm.name} keeps its workers' state on the GPU (only the PPO trainer's step " \
              "offloads it while the engine is awake)"
    elif device(cfg) != "cuda":
        why = "the workers run on CPU, where the host is the device: there is nothing to move off it"
    elif engine_gpus(cfg):
        why = "rollout.vllm.placement=separate gives the engine GPUs of its own, so it never wakes on the training GPUs"
    elif not engine_shares_memory(cfg):
        why = ("rollout.vllm.enable_sleep_mode=false: the engine keeps its memory while the workers train, so what "
               "the offload frees between phases is never the engine's to use")
    else:
        return []
    return [f"trainer.offload='phase' has no effect: {why}; set trainer.offload=auto (phase wherever an engine "
            "shares the training GPUs) or none"]


def _frozen_learners(cfg: TrainConfig) -> list[str]:
    """A learning rate of 0 on a model the run trains: every update would leave its weights as they are (an actor
    of a training run; the critic when a critic worker trains). A run that trains nothing has its own key:
    ``trainer.val_only=true``."""
    if cfg.trainer.val_only or cfg.trainer.total_steps == 0:
        return []
    trained = [("actor", cfg.actor.lr)]
    if critic_worker_needed(cfg):
        trained.append(("critic", cfg.critic.lr))
    return [f"{role}.lr={lr} trains nothing: every {role} update would leave its weights as they are; set a positive "
            f"rate (e.g. {role}.lr=1e-6), or trainer.val_only=true to evaluate without training"
            for role, lr in trained if lr == 0]


def check_vllm(cfg: TrainConfig) -> list[str]:
    """``rollout.engine=vllm``: vLLM's temperature limit and ``rollout.vllm`` (its package: the registry entry's,
    :func:`check_engine_packages`)."""
    from ragen.rollout.vllm_engine import MAX_TEMPERATURE
    from ragen.trainer.config.schema import PLACEMENTS

    v, out = cfg.rollout.vllm, []
    temps = {"agent.temperature": cfg.agent.temperature, "rollout.val_temperature": cfg.rollout.val_temperature}
    for key, value in temps.items():
        if value is not None and value > MAX_TEMPERATURE:
            out.append(f"{key}={value} > {MAX_TEMPERATURE}: vLLM refuses hotter sampling; lower it or use "
                       "rollout.engine=hf")
    if not 0 < v.gpu_memory_utilization <= 1:
        out.append(f"rollout.vllm.gpu_memory_utilization={v.gpu_memory_utilization} must be in (0, 1]")
    if v.tensor_parallel_size < 1 or v.max_num_seqs < 1:
        out.append(f"rollout.vllm.tensor_parallel_size={v.tensor_parallel_size} and rollout.vllm.max_num_seqs="
                   f"{v.max_num_seqs} must be >= 1")
    if v.placement not in PLACEMENTS:
        out.append(f"rollout.vllm.placement={v.placement!r} is unknown; use one of {PLACEMENTS}")
    elif v.placement == "colocated" and v.rollout_gpus:
        out.append(f"rollout.vllm.rollout_gpus={v.rollout_gpus} only applies to rollout.vllm.placement=separate; "
                   "set it to 0 or the placement to separate")
    elif v.placement == "separate":
        if device(cfg) != "cuda":
            out.append("rollout.vllm.placement=separate needs GPUs; use placement=colocated on CPU")
        elif v.rollout_gpus < v.tensor_parallel_size or v.rollout_gpus % v.tensor_parallel_size:
            out.append(f"rollout.vllm.rollout_gpus={v.rollout_gpus} must be a positive multiple of "
                       f"rollout.vllm.tensor_parallel_size={v.tensor_parallel_size}")
        elif training_gpus(cfg) < 1:
            out.append(f"rollout.vllm.rollout_gpus={v.rollout_gpus} leaves no GPU for training out of "
                       f"{total_gpus(cfg)}; lower it or add GPUs")
    if v.placement == "colocated" and device(cfg) == "cuda" and v.tensor_parallel_size > cfg.trainer.n_gpus_per_node:
        out.append(f"rollout.vllm.tensor_parallel_size={v.tensor_parallel_size} exceeds trainer.n_gpus_per_node="
                   f"{cfg.trainer.n_gpus_per_node} (one engine's GPUs must sit on one node)")
    return out


def _cuda_visible() -> bool:
    import torch

    return torch.cuda.is_available()


def check_engine_placement(cfg: TrainConfig) -> list[str]:
    """Engine layouts that would not start or would leave GPUs idle (``ragen.trainer.placement``).

    Colocated vLLM engines are hosted one per actor rank, in the rank's process on its one GPU (data parallel), so
    an engine cannot span GPUs there: tensor parallel size 1. A separate placement runs one engine, so
    ``rollout_gpus`` beyond its tensor parallel size would idle."""
    v, out = cfg.rollout.vllm, []
    if v.placement == "colocated" and v.tensor_parallel_size > 1:
        out.append(f"rollout.vllm.tensor_parallel_size={v.tensor_parallel_size} with rollout.vllm.placement="
                   "colocated: colocated vLLM engines run one per actor rank, each on its rank's own GPU (data "
                   "parallel), so one engine cannot span GPUs; set rollout.vllm.tensor_parallel_size=1 (every "
                   "training GPU then runs an engine over its share of the episodes)")
    tp = v.tensor_parallel_size
    if v.placement == "separate" and tp >= 1 and v.rollout_gpus > tp and v.rollout_gpus % tp == 0:
        out.append(f"rollout.vllm.rollout_gpus={v.rollout_gpus} with rollout.vllm.tensor_parallel_size={tp}: a "
                   f"separate placement runs one engine, on {tp} GPU(s), and would leave {v.rollout_gpus - tp} idle; "
                   f"set rollout.vllm.rollout_gpus={tp} (the other GPUs then train), or use "
                   "rollout.vllm.placement=colocated, where every training GPU runs an engine")
    return out


@register("warm_start", reads=("trainer.sft_warmup_steps", "env.name", "env.config.expert", "agent.think",
                               "agent.think_tag", "agent.answer_tag", "agent.response_prefix", "sft.noise"),
          after=("env_mix",), per_env=True)
def check_warm_start(cfg: TrainConfig) -> list[str]:
    """``trainer.sft_warmup_steps`` needs an env with an expert and a response prefix the expert can follow, and
    ``sft.noise`` > 0 an env that lists its legal actions (``action_list``) to draw random ones from."""
    steps = cfg.trainer.sft_warmup_steps
    if steps < 0:
        return [f"trainer.sft_warmup_steps={steps} must be >= 0 (0 = no warm start)"]
    if steps == 0:
        return []
    import ragen.env

    out = []
    if ragen.env.is_program(cfg.env.name):  # the program's expert, not an env's (check_agent_program)
        if dict(cfg.env.config).get("expert") is None:
            out.append(f"trainer.sft_warmup_steps={steps} needs an env with an expert: for env={cfg.env.name} set "
                       "env.config.expert=<module>:<function> (prompt text -> answer text), or "
                       "trainer.sft_warmup_steps=0")
        return out
    if cfg.env.name in ragen.env.names() and not ragen.env.has_expert(cfg.env.name):
        with_expert = [n for n in ragen.env.names() if ragen.env.has_expert(n)]
        out.append(f"trainer.sft_warmup_steps={steps} needs an env with an expert, but env {cfg.env.name!r} has none; "
                   f"envs with one: {', '.join(with_expert)} (or set trainer.sft_warmup_steps=0)")
    elif cfg.sft.noise > 0 and cfg.env.name in ragen.env.names() and not ragen.env.has_action_list(cfg.env.name):
        out.append(f"sft.noise={cfg.sft.noise} makes the warm start play random legal actions, but env "
                   f"{cfg.env.name!r} takes free-text actions (it has no action_list(); its legal_actions() describes "
                   "them), so there are none to draw: set sft.noise=0 (its expert on every turn) or "
                   "trainer.sft_warmup_steps=0")
    a = cfg.agent
    full = (f"<{a.think_tag}></{a.think_tag}>" if a.think else "") + f"<{a.answer_tag}>"
    if not full.startswith(a.response_prefix):
        out.append(f"agent.response_prefix={a.response_prefix!r} is not how an expert answer starts ({full!r}...); "
                   "use '' or the opening answer tag with agent.think=false for a warm start")
    return out


@register("attention", reads=("model.attn_implementation", "trainer.device", "actor.mixed_precision",
                              "critic.mixed_precision"), after=("env_mix",))
def check_attention(cfg: TrainConfig) -> list[str]:
    """``model.attn_implementation``: a known value; ``flash_attention_2`` only where it runs (flash_attn importable,
    a CUDA device, bf16 compute for every role that loads the model with it)."""
    value = cfg.model.attn_implementation
    if value not in ATTN_IMPLEMENTATIONS:
        return [f"model.attn_implementation={value!r} is unknown; use one of {', '.join(ATTN_IMPLEMENTATIONS)} "
                "(auto = flash_attention_2 where flash-attn runs, else sdpa)"]
    if value != FLASH or device(cfg) not in ("cpu", "cuda"):  # check_trainer names an unknown trainer.device
        return []
    roles = {"actor": cfg.actor.mixed_precision}
    if cfg.algorithm.name == "ppo" and critic_worker_needed(cfg):
        roles["critic"] = cfg.critic.mixed_precision
    return [f"model.attn_implementation={FLASH} cannot run here: {why}" for why in flash_problems(device(cfg), roles)]


# An engine's checks beyond what its registry entry declares, by engine name.
ENGINE_CHECKS = {"vllm": (check_vllm, check_engine_placement)}

ENV_KEYS = ("max_turn", "max_actions_per_turn")  # AgentConfig fields the env section sets


def _agent_key(name: str) -> str:
    """The config key of an ``AgentConfig`` field: ``env.max_turn``, ``agent.layout``..."""
    return f"env.{name}" if name in ENV_KEYS else f"agent.{name}"


@register("agent_config", reads=("agent", "env.max_turn", "env.max_actions_per_turn"), after=("env", "agent"))
def check_agent_config(cfg: TrainConfig) -> list[str]:
    """The agent proxy's own value checks (``ragen.agent.config.agent_problems``: sizes, timeouts, tags...), so
    they fail before any worker starts, named by the trainer's keys. After ``env`` and ``agent``, which report the
    turn limits and token budget with their fixes."""
    values = SimpleNamespace(**dataclasses.asdict(cfg.agent), max_turn=cfg.env.max_turn,
                             max_actions_per_turn=cfg.env.max_actions_per_turn)
    return agent_problems(values, key=_agent_key)


def _section_check(name: str, section: str, problems: Callable[[Any], list[str]]) -> None:
    """Register a section's value checks (the function its dataclass's ``__post_init__`` raises from, so a config
    built in Python is refused at construction and ``build_config`` names every problem of the section) as the
    check ``name``: one home for each rule, listed with the others."""
    register(name, reads=(section,))(lambda cfg: problems(getattr(cfg, section)))


for _name, _section, _problems in (("actor_values", "actor", actor_problems),
                                   ("critic_values", "critic", critic_worker_problems),
                                   ("algorithm_values", "algorithm", algorithm_problems),
                                   ("sft_values", "sft", sft_problems),
                                   ("trainer_values", "trainer", trainer_problems),
                                   ("archer_values", "archer", archer_problems)):
    _section_check(_name, _section, _problems)


def budget_problems(cfg: TrainConfig) -> list[str]:
    """The last turn's full-history prompt + its response must fit ``agent.max_model_len`` at worst-case response
    lengths: prompt, observation and response tokens together (estimated, ``run_shape.trajectory_token_estimate``).
    Otherwise history gets cut and the cut trajectory rows are masked out of training."""
    ag, est = cfg.agent, trajectory_token_estimate(cfg)
    if est.total <= ag.max_model_len:
        return []
    return [f"prompt budget: env.max_turn * agent.max_new_tokens = {est.responses} tokens of responses + about "
            f"{est.first_prompt + est.observations} prompt and observation tokens (first prompt ~{est.first_prompt}, "
            f"{cfg.env.max_turn - 1} later user message(s) ~{est.observations}; {CHARS_PER_TOKEN} characters per "
            f"token) = {est.total} > agent.max_model_len={ag.max_model_len}: the last turns could not see the whole "
            "history, and trajectory rows whose history is cut are masked out of training; raise "
            "agent.max_model_len, lower agent.max_new_tokens or env.max_turn, or use agent.layout=turn"]
