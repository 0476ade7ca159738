"""The dry run (``trainer.dry_run=true``, ``ragen train --check``): check everything, print the plan, start nothing.

:func:`dry_run` validates the config (``ragen.launch.validate``: the PPO family's checks or the ArCHer family's),
runs the pre-start checks (``ragen.trainer.config.resource_checks``: the model's config and tokenizer without weights,
the output folder, each env built once) and returns the plan: the start-up block a real run prints
(``builders.startup_block``) plus the tokenizer, devices and GPUs, Ray, the batch arithmetic (groups x group size =
episodes, rows, mini / micro batches, optimizer steps per step and in total), on GPUs the memory plan of one GPU per
phase of a step (``ragen.trainer.config.memory_checks``), the agent's token budgets, validation and what the output
folder holds. No worker, Ray, engine or file is created.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable
from pathlib import Path

from ragen.trainer import builders
from ragen.trainer.config import env_mix, run_shape
from ragen.trainer.config.archer_schema import uses_critic
from ragen.trainer.config.resource_checks import ModelCheck, check_before_start, saved_config
from ragen.trainer.config.schema import TrainConfig
from ragen.trainer.layout import layout_of


def dry_run(cfg: TrainConfig, check: Callable[[TrainConfig], None]) -> str:
    """Validate ``cfg`` (``check``: ``ragen.launch.validate``, or one family's checks), run the pre-start checks and
    return the plan (:func:`plan_text`); raises ``ConfigError`` listing every problem."""
    check(cfg)
    return plan_text(cfg, check_before_start(cfg, dry_run=True))


def plan_text(cfg: TrainConfig, model: ModelCheck) -> str:
    """The plan of a run of ``cfg`` whose model check found ``model`` (see the module docstring)."""
    lines = builders.startup_block(cfg, model.summary).splitlines()
    lines.insert(1, f"[ragen] tokenizer {model.tokenizer}")
    lines += [devices_line(cfg), ray_line(cfg), *batch_lines(cfg), *memory_lines(cfg, model), agent_line(cfg),
              validation_line(cfg), output_line(cfg)]
    head = ("[ragen] dry run (trainer.dry_run=true): config, model config + tokenizer, envs and output folder "
            "checked; nothing was started or written")
    return "\n".join([head, *lines])


def devices_line(cfg: TrainConfig) -> str:
    dev, tr = run_shape.device(cfg), cfg.trainer
    if dev != "cuda":
        threads = builders.worker_threads(cfg)
        return f"[ragen] devices   cpu, no GPUs; {threads} torch thread(s) per worker rank"
    v, engine_gpus = cfg.rollout.vllm, run_shape.engine_gpus(cfg)
    text = (f"[ragen] devices   cuda, {run_shape.total_gpus(cfg)} GPU(s) = trainer.n_gpus_per_node={tr.n_gpus_per_node}"
            f" x trainer.nnodes={tr.nnodes}; rank r of every role on GPU r")
    if cfg.rollout.engine == "vllm":
        where = (f"{engine_gpus} GPU(s) of its own" if engine_gpus else "colocated on the training GPUs, one in "
                 f"each of the {run_shape.world_size(cfg, 'actor')} actor ranks, sleep mode "
                 f"{'on' if v.enable_sleep_mode else 'off'}")
        text += (f"; vllm engine {where}, tensor_parallel_size {v.tensor_parallel_size}, gpu_memory_utilization "
                 f"{v.gpu_memory_utilization}")
        if importlib.util.find_spec("vllm") is None:  # planning from a machine without GPUs (checks refuse it on one)
            text += "; vllm is not installed here: the GPU machines need pip install -e .[gpu] (vllm==0.32.0)"
    mode = run_shape.offload_mode(cfg)
    state = "in host memory" if mode == "phase" else "on the GPUs"
    return text + f"; training state {state} while the engine is awake (trainer.offload={tr.offload}: {mode})"


def memory_lines(cfg: TrainConfig, model: ModelCheck) -> list[str]:
    """The memory plan of one GPU (PPO family on cuda, with the model's sizes), else nothing."""
    from ragen.trainer.config import memory_checks

    if model.shape is None or not memory_checks.applies(cfg):
        return []
    return memory_checks.memory_lines(cfg, *memory_checks.memory_plan(cfg, model.shape))


def ray_line(cfg: TrainConfig) -> str:
    if not cfg.trainer.use_ray:
        return "[ragen] ray       not used: the workers run in this process (trainer.use_ray=false)"
    address = builders.ray_address(cfg)
    ranks = sum(run_shape.world_size(cfg, r) for r in _roles(cfg))
    where = f"joins the cluster at {address}" if address else "starts a local Ray"
    return f"[ragen] ray       {where}; {ranks} worker rank(s), {cfg.trainer.cpus_per_worker} CPU each"


def batch_lines(cfg: TrainConfig) -> list[str]:
    """Episodes and rows per step, then per trained role: mini-batches, micro-batches and optimizer steps."""
    ro, groups = cfg.rollout, env_mix.n_train_groups(cfg)
    episodes, kept = groups * ro.group_size, run_shape.train_batch_size(cfg)
    filtered = (f", rollout filter keeps {run_shape.kept_groups(cfg)} groups = {kept} episodes"
                if kept != episodes else "")
    if cfg.algorithm.rollout_filter == "variance_share":
        filtered = (f", rollout filter keeps the groups holding {cfg.algorithm.rollout_filter_variance_share:g} of "
                    "the reward variance (at most all)")
    layout, turns = layout_of(cfg), env_mix.max_turns(cfg)
    max_rows, rows = layout.rows.max_rows(kept, turns), layout.rows_text(kept, turns)
    if cfg.algorithm.rollout_filter == "variance_share" and not rows.startswith("up to"):
        rows = f"up to {rows}"  # the kept groups follow each batch
    out = [f"[ragen] batch     {groups} groups x {ro.group_size} = {episodes} episodes per step{filtered}; {rows}"]
    if cfg.trainer.sft_warmup_steps:  # ragen.trainer.warm_start (both families): epochs passes per expert batch
        sft, per_step = cfg.sft, math.ceil(max_rows / cfg.actor.mini_batch_size)
        total = cfg.trainer.sft_warmup_steps * sft.epochs * per_step
        out.append(f"[ragen] warm start {cfg.trainer.sft_warmup_steps} steps x {sft.epochs} epoch(s) x "
                   f"{layout.at_most(per_step)} mini-batch(es) of {cfg.actor.mini_batch_size} rows = "
                   f"{total} optimizer steps; lr {sft.lr:g} ({sft.lr_schedule}), expert noise {sft.noise} "
                   f"({sft.random_actions})")
    if cfg.algorithm.name != "ppo" or cfg.trainer.total_steps == 0:
        return out
    trained = ["actor"] + (["critic"] if run_shape.critic_worker_needed(cfg) else [])
    for role in trained:
        section = cfg.actor if role == "actor" else cfg.critic
        ws = run_shape.world_size(cfg, role)
        per_rank = section.mini_batch_size // max(1, ws)
        accum = max(1, math.ceil(per_rank / section.micro_batch_size))
        per_step = run_shape.optimizer_steps_per_trainer_step(cfg, role)
        out.append(f"[ragen] {role:<9} mini-batch {section.mini_batch_size} rows -> {per_step} optimizer step(s) per "
                   f"step ({section.ppo_epochs} epoch(s)); micro-batch {section.micro_batch_size} per rank x {ws} "
                   f"rank(s) -> {accum} accumulation step(s); {run_shape.worker_total_steps(cfg, role)} optimizer "
                   f"steps in total; lr {section.lr:g} ({section.lr_schedule})")
    return out


def agent_line(cfg: TrainConfig) -> str:
    a = cfg.agent
    prefix = f", response_prefix {a.response_prefix!r}" if a.response_prefix else ""
    return (f"[ragen] agent     think={str(a.think).lower()}, max_new_tokens {a.max_new_tokens}, max_model_len "
            f"{a.max_model_len}, temperature {a.temperature}, layout {a.layout}{prefix}")


def validation_line(cfg: TrainConfig) -> str:
    tr, ro = cfg.trainer, cfg.rollout
    n = sum(g.n_groups for g in env_mix.val_groups(cfg)) * ro.val_group_size
    when = f"every {tr.val_freq} steps and at the end" if tr.val_freq > 0 else "at the end"
    before = ", before training" if tr.val_before_train else ""
    temp = "greedy" if ro.val_temperature == 0 else f"temperature {ro.val_temperature}"
    return f"[ragen] validate  {n} episodes ({temp}) {when}{before}"


def output_line(cfg: TrainConfig) -> str:
    """What ``trainer.output_dir`` holds now: nothing (a new run) or a run that ``trainer.resume`` continues."""
    from ragen.utils.checkpoint import list_checkpoints

    run_dir = Path(cfg.trainer.output_dir)
    if saved_config(run_dir) is None and not (run_dir / "checkpoints").is_dir():
        return f"[ragen] output    {run_dir} (a new run)"
    found = list_checkpoints(run_dir / "checkpoints") if (run_dir / "checkpoints").is_dir() else []
    if cfg.trainer.resume == "none" or not found:
        return (f"[ragen] output    {run_dir} holds a run; this one starts from step 0 "
                f"(trainer.resume={cfg.trainer.resume})")
    return (f"[ragen] output    {run_dir} holds a run; trainer.resume={cfg.trainer.resume} continues it from its "
            f"latest checkpoint {found[-1][1].name}")


def _roles(cfg: TrainConfig) -> list[str]:
    if cfg.algorithm.name != "ppo":
        return ["actor"] + (["critic"] if uses_critic(cfg.algorithm.name) else [])
    return (["actor"] + (["critic"] if run_shape.critic_worker_needed(cfg) else [])
            + (["ref"] if run_shape.needs_ref(cfg) else []))
