"""The memory plan of a GPU run from its config (``ragen.trainer.config.memory_plan``), the GPU's size, and the refusal
of a plan that cannot fit, before any worker starts.

Runs for the PPO family on ``cuda`` (the pre-start checks of a real run and of ``--check``, ``ragen.trainer.
prestart``), with the model's sizes read from its config. The GPU's size: ``trainer.gpu_memory_gb`` (GiB, as
``nvidia-smi``'s MiB / 1024: an "80 GB" A100 / H100 has 80), else the size of the GPU this process sees, else
:data:`ASSUMED_GPU_GIB` (planning from a machine without GPUs), which the plan says. ``trainer.memory_check``:
``refuse`` (default) fails a plan whose peak exceeds the GPU, or whose vLLM share leaves no room for one sequence's
KV cache, naming what lowers it; ``warn`` prints the plan and starts anyway (the plan is an estimate: use it where
a run is known to fit).
"""

from __future__ import annotations

import math

from ragen.agent.layout import row_layout
from ragen.models.shape import ModelShape
from ragen.trainer.config import env_mix, run_shape
from ragen.trainer.config.memory_plan import (
    ACTOR_UPDATE,
    CRITIC_UPDATE,
    ROLLOUT,
    EngineLoad,
    MemoryInputs,
    MemoryPlan,
    RoleLoad,
    plan_lines,
    plan_memory,
)
from ragen.trainer.config.schema import TrainConfig
from ragen.utils.hardware import resolve_dtype, resolve_precision

ASSUMED_GPU_GIB = 80.0
MEMORY_CHECKS = ("refuse", "warn")
ENGINE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def applies(cfg: TrainConfig) -> bool:
    """The plan is made for PPO-family runs on GPUs."""
    return cfg.algorithm.name == "ppo" and run_shape.device(cfg) == "cuda"


def detected_gpu() -> tuple[float, str] | None:
    """(GiB, name) of the first GPU this process sees, or None without CUDA."""
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
        return None
    props = torch.cuda.get_device_properties(0)
    return props.total_memory / 2**30, props.name


def gpu_size(cfg: TrainConfig) -> tuple[float, str]:
    """(GiB of one training GPU, where the figure comes from, as the plan prints it)."""
    if cfg.trainer.gpu_memory_gb is not None:
        return float(cfg.trainer.gpu_memory_gb), f"trainer.gpu_memory_gb={cfg.trainer.gpu_memory_gb:g}"
    found = detected_gpu()
    if found is not None:
        return found[0], f"detected: {found[1]}"
    return ASSUMED_GPU_GIB, ("ASSUMED: no GPU is visible here; set trainer.gpu_memory_gb to the training GPUs' size, "
                             "e.g. 40, 80 or 141")


def _rows(mini: int, micro: int, world: int) -> int:
    """Rows of one micro-batch on one rank: the micro-batch, unless the rank's share of a mini-batch is smaller."""
    return max(1, min(micro, mini // max(1, world)))


def _infer_rows(cfg: TrainConfig, infer: int | None, micro: int, world: int) -> int:
    """Rows of one no-grad pass on one rank: the pass's chunk, unless the rank holds fewer rows."""
    rows = row_layout(cfg.agent.layout).max_rows(run_shape.train_batch_size(cfg), env_mix.max_turns(cfg))
    return max(1, min(infer or micro, math.ceil(rows / max(1, world))))


def _compute_bytes(setting: str) -> int:
    return 2 if resolve_precision(setting, "cuda")[0] == "bf16" else 4


def role_loads(cfg: TrainConfig, shape: ModelShape) -> tuple[RoleLoad, RoleLoad | None, int | None]:
    """(actor, critic or None, reference world size or None) for ``cfg`` with a policy of ``shape``."""
    a, c = cfg.actor, cfg.critic
    ws = run_shape.world_size(cfg, "actor")
    head = shape.hidden + 1 if run_shape.shared_value_head(cfg) else 0  # Linear(hidden, 1) on the actor
    adapters = shape.lora_params(a.lora_rank, a.lora_target_modules) if a.lora else 0
    actor = RoleLoad(params=shape.params + adapters + head, trained=(adapters if a.lora else shape.params) + head,
                     world=ws, micro_rows=_rows(a.mini_batch_size, a.micro_batch_size, ws),
                     infer_rows=_infer_rows(cfg, a.infer_micro_batch_size, a.micro_batch_size, ws),
                     checkpointing=a.gradient_checkpointing, compute_bytes=_compute_bytes(a.mixed_precision))
    critic = None
    if run_shape.critic_worker_needed(cfg):
        wc = run_shape.world_size(cfg, "critic")
        params = shape.params - shape.head_params + shape.hidden + 1  # the backbone and Linear(hidden, 1)
        critic = RoleLoad(params=params, trained=params, world=wc,
                          micro_rows=_rows(c.mini_batch_size, c.micro_batch_size, wc),
                          infer_rows=_infer_rows(cfg, c.infer_micro_batch_size, c.micro_batch_size, wc),
                          checkpointing=c.gradient_checkpointing, compute_bytes=_compute_bytes(c.mixed_precision),
                          logits=False)
    ref = run_shape.world_size(cfg, "ref") if run_shape.needs_ref(cfg) else None
    return actor, critic, ref


def engine_load(cfg: TrainConfig) -> EngineLoad:
    """The rollout engine of ``cfg`` on GPUs (hf: on GPU 0 in the driver, KV caches of every episode of a call when
    it keeps them from turn to turn, else of one decoding batch)."""
    ro, v = cfg.rollout, cfg.rollout.vllm
    weight_bytes = ENGINE_BYTES[resolve_dtype(ro.dtype, "cuda")[0]]
    if ro.engine == "vllm":
        colocated = v.placement == "colocated"
        return EngineLoad("vllm", colocated=colocated, utilization=v.gpu_memory_utilization,
                          tensor_parallel=v.tensor_parallel_size, sleeps=v.enable_sleep_mode and colocated,
                          weight_bytes=weight_bytes)
    from ragen.rollout.hf import HFEngine

    groups = [*env_mix.train_groups(cfg), *env_mix.val_groups(cfg)]
    episodes = max(env_mix.n_train_groups(cfg) * ro.group_size,
                   sum(g.n_groups for g in env_mix.val_groups(cfg)) * ro.val_group_size)
    keeps = any(g.env.max_turn > 1 for g in groups)  # the prefix cache (ragen.trainer.builders.build_engine)
    batch = HFEngine.__init__.__kwdefaults__["batch_size"]
    return EngineLoad("hf", weight_bytes=weight_bytes, kv_sequences=episodes if keeps else min(batch, episodes))


def memory_inputs(cfg: TrainConfig, shape: ModelShape, gpu_gib: float, offload: bool = False) -> MemoryInputs:
    """The plan's inputs for ``cfg`` (rows of up to ``agent.max_model_len`` tokens: a trajectory row, or a turn's
    prompt and response, stays within it)."""
    actor, critic, ref = role_loads(cfg, shape)
    return MemoryInputs(shape=shape, gpu_gib=gpu_gib, seq_len=cfg.agent.max_model_len,
                        chunk=cfg.actor.log_prob_chunk_size, checkpoint_lm_head=cfg.actor.checkpoint_lm_head,
                        actor=actor, critic=critic, ref_world=ref, engine=engine_load(cfg), offload=offload)


def memory_plan(cfg: TrainConfig, shape: ModelShape) -> tuple[MemoryPlan, str]:
    """(the plan of ``cfg``'s GPU 0, where the GPU's size comes from)."""
    gib, source = gpu_size(cfg)
    return plan_memory(memory_inputs(cfg, shape, gib)), source


def memory_lines(cfg: TrainConfig, plan: MemoryPlan, source: str) -> list[str]:
    """The plan's console lines, headed by what GPU 0 holds and its size."""
    roles = ["actor"] + (["critic"] if run_shape.critic_worker_needed(cfg) else []) + (
        ["reference"] if run_shape.needs_ref(cfg) else [])
    engine = cfg.rollout.engine
    where = (f"the {engine} engine" if engine == "hf" or cfg.rollout.vllm.placement == "colocated"
             else "no engine (placement=separate)")
    head = (f"per GPU: GPU 0 holds rank 0 of {', '.join(roles)} and {where}; a GPU of {plan.gpu_gib:g} GiB "
            f"({source})")
    lines = plan_lines(plan, head)
    if cfg.trainer.memory_check == "warn" and not plan.fits:
        lines.append("[ragen]   trainer.memory_check=warn: the run starts anyway")
    return lines


def knobs(cfg: TrainConfig, plan: MemoryPlan) -> list[str]:
    """What lowers the peak of ``plan``, with the current values, those that act on its peak phase first."""
    a, c, v = cfg.actor, cfg.critic, cfg.rollout.vllm
    critic = run_shape.critic_worker_needed(cfg)
    update = []
    off = [f"{r}.gradient_checkpointing=true" for r, s in (("actor", a), ("critic", c))
           if (r == "actor" or critic) and not s.gradient_checkpointing]
    if off:
        update.append(f"{' / '.join(off)} (each layer keeps its input instead of its activations)")
    micro = f"actor.micro_batch_size (now {a.micro_batch_size})" + (
        f" / critic.micro_batch_size (now {c.micro_batch_size})" if critic else "")
    update += [f"a smaller {micro}: rows per pass, the update is the same",
               f"a lower agent.max_model_len (now {cfg.agent.max_model_len}): activations grow with the row length"]
    resident = [f"more GPUs (trainer.n_gpus_per_node={cfg.trainer.n_gpus_per_node} x trainer.nnodes="
                f"{cfg.trainer.nnodes}, world size {run_shape.world_size(cfg, 'actor')}): weights, gradients and AdamW "
                "state shard over them"]
    if not a.lora:
        resident.append("actor.lora_rank=16 (LoRA: gradients and AdamW state for the adapters only, no reference "
                        "worker)")
    engine = []
    if cfg.rollout.engine == "vllm" and v.placement == "colocated":
        engine.append(f"a lower rollout.vllm.gpu_memory_utilization (now {v.gpu_memory_utilization}): the engine's "
                      "share while it rolls out")
        if not v.enable_sleep_mode:
            engine.append("rollout.vllm.enable_sleep_mode=true: the engine frees its memory while the workers train")
    order = {ROLLOUT: engine + resident + update, ACTOR_UPDATE: update + resident + engine,
             CRITIC_UPDATE: update + resident + engine}
    return order.get(plan.peak_phase, resident + update + engine)


def memory_problems(cfg: TrainConfig, plan: MemoryPlan, source: str) -> list[str]:
    """The refusal of a plan that cannot fit (none with ``trainer.memory_check=warn``), naming what lowers it."""
    if cfg.trainer.memory_check == "warn":
        return []
    override = ("; if the plan overestimates this setup (the --check plan shows each term), trainer.memory_check="
                "warn starts it anyway")
    out = [p + override for p in plan.problems]
    if plan.peak > plan.gpu_gib:
        top = sorted((t for t in plan.terms if plan.peak_phase in t.phases), key=lambda t: -t.gib)[:3]
        largest = ", ".join(f"{t.name} {t.gib:.2f}" for t in top)
        out.append(f"memory plan: GPU 0 needs {plan.peak:.2f} GiB in the {plan.peak_phase} phase (largest: "
                   f"{largest} GiB), more than a GPU of {plan.gpu_gib:g} GiB ({source}); lower it with: "
                   + "; ".join(knobs(cfg, plan)) + override)
    return out
