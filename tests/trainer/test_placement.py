"""GPU placement and the engines' sleep / wake schedule, through fakes (no GPU, no vLLM): what runs where in a
cluster that admits actors as Ray does (every rank and engine fits the GPU bundles, ranks of one role on distinct
GPUs), one engine hosted by every actor rank (data parallel) or a separate engine on its own GPUs, the layouts that
are refused, and rollout -> sleep -> train -> wake weights -> sync -> wake KV cache in a real (tiny, in-process)
training step."""

from types import SimpleNamespace

import pytest
from trainer_helpers import tiny_overrides

from ragen.trainer import builders, placement
from ragen.trainer.config.compose import compose, load_train_config, to_train_config
from ragen.trainer.config.run_shape import world_size
from ragen.trainer.hosted import HostedEngines

GPU8 = ["trainer=gpu"]  # 8 GPUs, world sizes = all (training) GPUs, engine vllm


def _cfg(*overrides):
    return to_train_config(compose("base", list(overrides)))


class FakeCluster:
    """The GPU bundles of a run's shared placement group, and Ray's admission rule inside them: an actor asking for
    ``num_gpus`` / ``num_cpus`` in bundle i starts only while bundle i has that much of each left. ``where`` maps each
    started actor to its bundle (= GPU index)."""

    def __init__(self, bundles):
        self.bundles, self.free, self.where = bundles, [dict(b) for b in bundles], {}

    def start(self, name, bundle, num_gpus, num_cpus):
        free = self.free[bundle]
        assert free["GPU"] >= num_gpus - 1e-9 and free["CPU"] >= num_cpus - 1e-9, (
            f"{name} asks for GPU {num_gpus}, CPU {num_cpus} in bundle {bundle}, which has {free} left")
        free["GPU"] -= num_gpus
        free["CPU"] -= num_cpus
        self.where[name] = bundle


def _start_run(cfg, monkeypatch):
    """Everything a Ray run of ``cfg`` on GPUs starts, in a :class:`FakeCluster`: the shared placement group, the
    worker groups of ``build_workers`` (rank r in bundle r, as ``WorkerGroup`` places them; a 0-CPU port probe in
    bundle 0) and, with a separate engine, the engine actor of ``start_engine_actor``. Returns (cluster, {role:
    (the engine spec its ranks host, timeouts)}) in start order."""
    cluster = None

    def make_pg(bundles, strategy):
        nonlocal cluster
        cluster = FakeCluster(bundles)
        return cluster

    groups = {}

    class PlacedGroup:
        def __init__(self, worker_cls, world_size, resources_per_worker, placement_group, **kw):
            assert placement_group is cluster  # every role in the run's one placement group
            role = kw["label"]
            groups[role] = (kw.get("engine"), (kw["call_timeout_s"], kw["ready_timeout_s"]))
            placement_group.start(f"{role} port probe", 0, 0, 0)
            for r in range(world_size):
                placement_group.start(f"{role}{r}", r, resources_per_worker.get("GPU", 0),
                                      resources_per_worker.get("CPU", 0))

    monkeypatch.setattr("ragen.workers.WorkerGroup", PlacedGroup)
    pg = placement.shared_placement_group(cfg, make_pg)
    builders.build_workers(cfg, "model-dir", placement_group=pg, engine=builders.hosted_engine_spec(cfg, "m", "tok"))
    if placement.engine_placement(cfg).where == "separate":
        def remote(cls):
            def options(num_gpus, num_cpus, scheduling_strategy, **_):
                pg.start("engine", scheduling_strategy.placement_group_bundle_index, num_gpus, num_cpus)
                return SimpleNamespace(remote=lambda **kw: SimpleNamespace())

            return SimpleNamespace(options=options)

        placement.start_engine_actor(cfg, pg, type("VLLMEngine", (), {}), "tok", "/m", "bfloat16", remote=remote)
    return cluster, groups


LAYOUTS = {
    "colocated, critic and ref": [*GPU8, "critic.enable=true", "ref.enable=true"],
    "colocated, 2 CPUs per worker": [*GPU8, "trainer.cpus_per_worker=2", "critic.enable=true", "ref.enable=false"],
    "hf engine, 4 actor ranks": [*GPU8, "rollout.engine=hf", "trainer.actor_world_size=4", "critic.enable=true"],
    "separate engine": [*GPU8, "rollout.vllm.placement=separate", "rollout.vllm.rollout_gpus=1",
                        "critic.enable=true", "ref.enable=true"],
    "separate engine, tensor parallel 2": [*GPU8, "rollout.vllm.placement=separate", "rollout.vllm.rollout_gpus=2",
                                           "rollout.vllm.tensor_parallel_size=2", "critic.enable=true"],
    "two nodes": [*GPU8, "trainer.nnodes=2", "critic.enable=true", "ref.enable=true"],
}


@pytest.mark.parametrize("overrides", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_every_rank_and_engine_fits_its_gpu_and_no_two_ranks_of_a_role_share_one(overrides, monkeypatch):
    """What runs where: one bundle per declared GPU; every rank of every role and the separate engine start in the
    bundles (their GPU shares and CPUs fit); ranks of one role are on distinct GPUs (NCCL refuses two on one); each
    actor rank hosts an engine on its own GPU, or the separate engine has its GPUs to itself; the actor group
    starts first; every group waits with the config's call and start timeouts."""
    cfg = _cfg(*overrides, "trainer.worker_start_timeout_s=90")
    cluster, groups = _start_run(cfg, monkeypatch)
    assert len(cluster.bundles) == cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes
    assert all(b["GPU"] == 1.0 for b in cluster.bundles)
    assert list(groups)[0] == "actor" and set(groups) == {r for r in ("actor", "critic", "ref")
                                                           if r == "actor" or getattr(cfg, r).enable}
    for role in groups:
        gpus = [g for name, g in cluster.where.items() if name.startswith(role) and "probe" not in name]
        assert len(gpus) == len(set(gpus)) == world_size(cfg, role), role
    assert {timeouts for _, timeouts in groups.values()} == {(cfg.trainer.worker_call_timeout_s, 90.0)}
    hosted = groups["actor"][0]
    where = placement.engine_placement(cfg)
    if where.where == "separate":
        assert hosted is None and cluster.where["engine"] not in {g for n, g in cluster.where.items()
                                                                   if n != "engine" and "probe" not in n}
        assert cluster.where["engine"] == where.bundles[0]
    else:
        assert hosted.name == cfg.rollout.engine and where.bundles == tuple(range(world_size(cfg, "actor")))


def test_a_rank_that_does_not_fit_its_bundle_is_seen():
    """The fake cluster refuses what Ray would leave pending: a second whole-GPU actor in one bundle."""
    cluster = FakeCluster(placement.gpu_bundles(2, 2))
    cluster.start("a", 1, 1.0, 1)
    with pytest.raises(AssertionError, match="b asks for GPU 1.0, CPU 1 in bundle 1"):
        cluster.start("b", 1, 1.0, 1)


def test_no_placement_group_on_cpu_or_without_ray():
    made = []
    assert placement.shared_placement_group(_cfg("trainer.device=cpu"), made.append) is None
    assert placement.shared_placement_group(_cfg(*GPU8, "trainer.use_ray=false"), made.append) is None
    assert made == []
    with pytest.raises(ValueError, match="at least one GPU"):
        placement.gpu_bundles(0, 1)


def test_every_actor_rank_hosts_one_engine_on_its_own_gpu():
    """Colocated (vLLM's default, and the hf engine): one engine per actor rank, in bundle r = GPU r; a separate
    vLLM engine on the GPUs after the training ones; without workers, one engine in the driver."""
    eight = placement.engine_placement(_cfg(*GPU8))
    assert eight == placement.EnginePlacement("actor_ranks", ranks=tuple(range(8)), bundles=tuple(range(8)))
    hf = placement.engine_placement(_cfg(*GPU8, "rollout.engine=hf", "trainer.actor_world_size=4"))
    assert hf == placement.EnginePlacement("actor_ranks", ranks=(0, 1, 2, 3), bundles=(0, 1, 2, 3))
    separate = _cfg(*GPU8, "rollout.vllm.placement=separate", "rollout.vllm.rollout_gpus=1")
    assert placement.engine_placement(separate) == placement.EnginePlacement("separate", bundles=(7,))
    assert builders.hosted_engine_spec(separate, "m", "tok") is None  # the workers host nothing
    assert placement.engine_placement(_cfg()) == placement.EnginePlacement("actor_ranks", ranks=(0,))  # CPU
    assert placement.engine_placement(_cfg(), with_workers=False) == placement.EnginePlacement("driver")
    assert builders.hosted_engine_spec(_cfg(), "m", "tok").name == "hf"
    with pytest.raises(ValueError, match="colocated engines live in the actor's ranks"):
        placement.engine_bundle(_cfg(*GPU8))


@pytest.mark.parametrize("overrides, refusal", [
    (["rollout.vllm.tensor_parallel_size=2"],
     "rollout.vllm.tensor_parallel_size=2 with rollout.vllm.placement=colocated: colocated vLLM engines run one per "
     "actor rank, each on its rank's own GPU (data parallel), so one engine cannot span GPUs; set "
     "rollout.vllm.tensor_parallel_size=1"),
    (["rollout.vllm.placement=separate", "rollout.vllm.rollout_gpus=4"],
     "rollout.vllm.rollout_gpus=4 with rollout.vllm.tensor_parallel_size=1: a separate placement runs one engine, on "
     "1 GPU(s), and would leave 3 idle; set rollout.vllm.rollout_gpus=1"),
    (["rollout.vllm.placement=separate", "rollout.vllm.rollout_gpus=4", "rollout.vllm.tensor_parallel_size=2"],
     "rollout.vllm.rollout_gpus=4 with rollout.vllm.tensor_parallel_size=2: a separate placement runs one engine, on "
     "2 GPU(s), and would leave 2 idle; set rollout.vllm.rollout_gpus=2"),
    (["rollout.vllm.placement=separate", "rollout.vllm.rollout_gpus=1"], None),
    ([], None),
])
def test_engine_layouts_that_cannot_start_or_would_idle_gpus_are_refused(overrides, refusal):
    from ragen.trainer.config.shared_checks import check_engine_placement, check_trainer

    cfg = _cfg(*GPU8, *overrides)
    problems = check_engine_placement(cfg)
    if refusal is None:
        assert problems == []
        return
    assert len(problems) == 1 and problems[0].startswith(refusal), problems
    assert problems[0] in check_trainer(cfg)  # part of the checks every run passes before anything starts


def test_separate_placement_reserves_the_last_gpus_for_the_engine():
    cfg = _cfg(*GPU8, "rollout.vllm.placement=separate", "rollout.vllm.rollout_gpus=1")
    assert placement.engine_bundle(cfg) == (7, 1.0)  # bundles 0-6 train, bundle 7 serves
    assert [world_size(cfg, r) for r in ("actor", "critic", "ref")] == [7, 7, 7]
    colocated = _cfg(*GPU8)
    assert world_size(colocated, "actor") == 8


class FakeActorHandle:
    def __init__(self, log):
        self.log = log

    def __getattr__(self, name):
        return SimpleNamespace(remote=lambda *a, **kw: (name, a, kw))


def test_engine_actor_gets_the_vllm_settings_and_a_call_timeout():
    """The separate engine actor (where it starts: test_every_rank_and_engine_fits...) is built with the config's
    vLLM settings, runs vLLM's engine core in its own process, never sleeps (it has its GPUs to itself), and its
    calls wait at most the worker call timeout."""
    started = []

    def remote(cls):
        def options(**opts):
            return SimpleNamespace(remote=lambda **kw: started.append((cls.__name__, opts, kw)) or FakeActorHandle([]))

        return SimpleNamespace(options=options)

    class VLLMEngine:
        pass

    cfg = _cfg(*GPU8, "rollout.vllm.gpu_memory_utilization=0.35", "rollout.vllm.max_num_seqs=64",
               "agent.max_model_len=4096", "rollout.vllm.placement=separate", "rollout.vllm.rollout_gpus=1",
               "trainer.seed=7")
    engine = placement.start_engine_actor(cfg, "pg", VLLMEngine, "tok", "/m", "bfloat16", remote=remote)
    [(name, opts, kwargs)] = started
    assert name == "VLLMEngine" and opts["runtime_env"]["env_vars"]["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert (kwargs["model"], kwargs["tokenizer"], kwargs["dtype"], kwargs["device"]) == (
        "/m", "tok", "bfloat16", "cuda")
    assert (kwargs["gpu_memory_utilization"], kwargs["max_num_seqs"], kwargs["max_model_len"], kwargs["seed"]) == (
        0.35, 64, 4096, 7)
    assert kwargs["enable_sleep_mode"] is False  # its own GPUs: nothing else needs the memory
    assert engine.timeout_s == cfg.trainer.worker_call_timeout_s == 3600.0  # engine calls have a timeout too
    # the driver-side handle forwards each protocol call and waits for it
    engine._get = lambda ref: ref
    assert engine.generate([[1]], "sp") == ("generate", ([[1]], "sp"), {})
    assert engine.wake(("weights",)) is None
    assert placement.engine_kwargs(_cfg("rollout.engine=vllm", "trainer.device=cpu"), "/m", "float32")[
        "enable_sleep_mode"] is False  # sleep mode exists on GPUs only


class Recorder:
    """Records the engine calls of a training step, forwarding to a real engine."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    def generate(self, prompts, sampling):
        self.calls.append("generate")
        return self.engine.generate(prompts, sampling)

    def update_weights(self, state):
        self.calls.append("update_weights")
        return self.engine.update_weights(state)

    def sleep(self):
        self.calls.append("sleep")

    def wake(self, tags=None):
        self.calls.append(f"wake{tuple(tags) if tags else ''}")


class HostedRecorder(Recorder):
    """A :class:`Recorder` hosted by an actor rank: the engine keeps its own sleep state
    (``ragen.rollout.base.SleepState``), which decides what reaches its record, as in a real engine."""

    def __init__(self, engine):
        from ragen.rollout.base import SleepState

        super().__init__(engine)
        self.sleep_state = SleepState()

    @property
    def asleep(self):
        return self.sleep_state.asleep

    def sleep(self):
        self.sleep_state.sleep(super().sleep)

    def wake(self, tags=None):
        self.sleep_state.wake(tags, super().wake)


def test_wake_and_sync_order():
    rec = Recorder(SimpleNamespace(update_weights=lambda s: None))
    placement.wake_and_sync(rec, lambda: rec.update_weights({"w": 1}))
    placement.wake_and_sync(rec, None)
    assert rec.calls == ["wake('weights',)", "update_weights", "wake('kv_cache',)", "wake"]


class FakeRemote:
    """A Ray actor handle whose ``method.remote(*args)`` records the call and returns a named ref."""

    def __init__(self, name, log, results=None):
        self.name, self.log, self.results = name, log, results or {}

    def __getattr__(self, method):
        def remote(*args):
            self.log.append((self.name, method, args))
            return self.results.get(method, f"{self.name}.{method}")

        return SimpleNamespace(remote=remote)


def test_separate_engine_nccl_group_and_sync_with_fakes():
    import torch

    from ragen.rollout.vllm_nccl import plan_buckets

    log = []
    workers = [FakeRemote("rank0", log, {"sync_address": ("10.0.0.5", 29511)}), FakeRemote("rank1", log)]
    plan = plan_buckets([("a", "bfloat16", (4,)), ("b", "bfloat16", (4,))], bucket_bytes=8)
    group = SimpleNamespace(workers=workers,
                            call_rank0=lambda method, *a: log.append(("group", method, a)) or plan)
    engine = placement.RemoteEngine(FakeRemote("engine", log), get=lambda ref: ref)
    get = lambda refs: log.append(("get", refs)) or refs  # noqa: E731
    cfg = _cfg(*GPU8, "rollout.vllm.placement=separate", "rollout.vllm.rollout_gpus=2",
               "rollout.vllm.tensor_parallel_size=2")
    placement.init_nccl_sync(cfg, engine, group, get)
    # rendezvous on rank 0's node; every rank and the engine's 2 workers (ranks 1-2 of 3) join before any wait
    assert log == [("rank0", "sync_address", ()), ("get", ("10.0.0.5", 29511)),
                   ("rank0", "init_weight_sender", ("10.0.0.5", 29511, 3)),
                   ("rank1", "init_weight_sender", ("10.0.0.5", 29511, 3)),
                   ("engine", "rpc", ("ragen_init_weight_group", "10.0.0.5", 29511, 1, 3)),
                   ("get", ["rank0.init_weight_sender", "rank1.init_weight_sender", "engine.rpc"])]
    log.clear()
    assert placement.nccl_sync(engine, group, "bfloat16", 8, get) == 2
    assert log == [("group", "plan_weight_buckets", ("bfloat16", 8)),
                   ("engine", "rpc", ("ragen_begin_weight_update",)), ("get", ["engine.rpc"]),
                   ("engine", "rpc", ("ragen_receive_bucket", [("a", "bfloat16", (4,))])),
                   ("rank0", "broadcast_bucket", (0,)), ("get", ["engine.rpc", "rank0.broadcast_bucket"]),
                   ("engine", "rpc", ("ragen_receive_bucket", [("b", "bfloat16", (4,))])),
                   ("rank0", "broadcast_bucket", (1,)), ("get", ["engine.rpc", "rank0.broadcast_bucket"]),
                   ("engine", "rpc", ("ragen_finish_weight_update",)), ("get", ["engine.rpc"]),
                   ("engine", "reset_prefix_cache", ()), ("get", "engine.reset_prefix_cache")]
    assert placement.engine_kwargs(cfg, "/m", "bfloat16")["enable_sleep_mode"] is False  # own GPUs: never sleeps

    from ragen.workers.weight_broadcast import WeightBroadcaster

    sent = []
    b = WeightBroadcaster(SimpleNamespace(broadcast_bucket=lambda state, metas: sent.append([m[0] for m in metas])))
    with pytest.raises(RuntimeError, match="plan_weight_buckets must run"):
        b.send(0)
    state = {"w": torch.ones(4), "v": torch.ones(4), "steps": torch.tensor([1, 2])}
    assert b.make_plan(state, "bfloat16", 8).buckets == ((("w", "bfloat16", (4,)),), (("v", "bfloat16", (4,)),),
                                                        (("steps", "int64", (2,)),))
    assert [b.send(i) for i in range(3)] == [1, 1, 1] and sent == [["w"], ["v"], ["steps"]]
    assert b.state is None  # released after the last bucket


def test_train_step_sleeps_after_rollout_and_wakes_weights_before_the_sync(tmp_path, monkeypatch):
    """The engine the actor's rank hosts sees the step's schedule (recorded inside the worker)."""
    import ragen.rollout
    from ragen.ppo.trainer import PPOTrainer

    real_make = ragen.rollout.make_engine
    recorders = []

    def make(*args, **kwargs):
        recorders.append(HostedRecorder(real_make(*args, **kwargs)))
        return recorders[-1]

    monkeypatch.setattr(ragen.rollout, "make_engine", make)
    cfg = load_train_config("ppo_bandit", [*tiny_overrides(tmp_path, 1), "trainer.use_ray=false",
                                           "trainer.val_before_train=false", "rollout.val_n_groups=1"])
    trainer = PPOTrainer(cfg)
    trainer.setup()
    try:
        recorders[0].calls.clear()
        trainer.train_step()
    finally:
        trainer.shutdown()
    calls = recorders[0].calls
    assert calls == ["generate", "sleep", "wake('weights',)", "update_weights", "wake('kv_cache',)"], calls
    assert len(recorders) == 1 and isinstance(trainer.run.engine, HostedEngines)  # no engine in the driver



def test_async_with_a_separate_vllm_engine_publishes_versions_over_nccl_with_fakes():
    """Asynchronous training on GPUs: the separately placed engine keeps its own GPUs, the config passes the async
    checks, and a published version is loaded over the NCCL group (under the engine's lock) while the samples
    generated through the engine's Ray actor carry the version they were sampled under."""
    from ragen.rollout.base import VERSION_KEY, Sample, SamplingParams
    from ragen.rollout.versioned import VersionedEngine
    from ragen.rollout.vllm_nccl import plan_buckets
    from ragen.trainer.config.ppo_checks import check_async

    cfg = _cfg(*GPU8, "rollout.vllm.placement=separate", "rollout.vllm.rollout_gpus=1", "trainer.async_rollout=true",
               "trainer.max_staleness=1", "algorithm.rollout_correction.mode=token_tis")
    assert check_async(cfg) == []
    assert placement.engine_placement(cfg).where == "separate"
    log = []
    plan = plan_buckets([("a", "bfloat16", (4,))], bucket_bytes=8)
    group = SimpleNamespace(workers=[FakeRemote("rank0", log)], call_rank0=lambda method, *a: plan)
    samples = [Sample([5], [-0.1], "stop")]
    engine = VersionedEngine(placement.RemoteEngine(FakeRemote("engine", log, {"generate": samples}),
                                                    get=lambda ref: ref))
    assert engine.generate([[1, 2]], SamplingParams())[0].extra[VERSION_KEY] == 0
    engine.publish(1, lambda: placement.nccl_sync(engine, group, "bfloat16", 8, lambda refs: refs))
    assert ("rank0", "broadcast_bucket", (0,)) in log and engine.version == 1
    assert engine.generate([[1, 2]], SamplingParams())[0].extra[VERSION_KEY] == 1
