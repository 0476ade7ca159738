"""GPU placement and the engines' sleep / wake schedule, through fakes that record calls and their order (no GPU,
no vLLM): one shared placement group with a {"GPU": 1, "CPU": k} bundle per GPU, rank r of every role in bundle r,
one engine hosted by every actor rank (data parallel) or a separate engine on its own GPUs, the layouts that are
refused, and rollout -> sleep -> train -> wake weights -> sync -> wake KV cache in a real (tiny, in-process)
training step."""

from types import SimpleNamespace

import pytest
from trainer_helpers import tiny_overrides

from ragen.trainer import builders, placement
from ragen.trainer.compose import compose, load_train_config, to_train_config
from ragen.trainer.derived import world_size
from ragen.trainer.hosted import HostedEngines

GPU8 = ["trainer=gpu"]  # 8 GPUs, world sizes = all (training) GPUs, engine vllm


def _cfg(*overrides):
    return to_train_config(compose("base", list(overrides)))


def test_shared_placement_group_one_bundle_per_gpu():
    made = []

    def make_pg(bundles, strategy):
        made.append((bundles, strategy))
        return "pg"

    cfg = _cfg(*GPU8, "trainer.cpus_per_worker=2", "critic.enable=true", "ref.enable=false")
    assert placement.shared_placement_group(cfg, make_pg) == "pg"
    # actor + critic ranks (2 CPUs each) + 1 CPU for the engine / helpers, on each of the 8 GPUs
    assert made == [([{"GPU": 1.0, "CPU": 5.0}] * 8, "PACK")]
    assert placement.shared_placement_group(_cfg("trainer.device=cpu"), make_pg) is None
    assert placement.shared_placement_group(_cfg(*GPU8, "trainer.use_ray=false"), make_pg) is None
    with pytest.raises(ValueError, match="at least one GPU"):
        placement.gpu_bundles(0, 1)


def test_worker_groups_share_the_placement_group(monkeypatch):
    """Every role's group gets the same placement group (WorkerGroup puts rank r in bundle r) and a GPU fraction
    (the fractions of one bundle fit one GPU); the actor group comes first and its ranks get the engine to host."""
    made = []

    class RecordingGroup:
        def __init__(self, worker_cls, world_size, resources_per_worker, placement_group, **kw):
            made.append((kw["role"] if "role" in kw else "critic", world_size, resources_per_worker, placement_group,
                         kw.get("engine")))
            timeouts.add((kw["call_timeout_s"], kw["ready_timeout_s"]))

    timeouts = set()
    monkeypatch.setattr("ragen.workers.WorkerGroup", RecordingGroup)
    cfg = _cfg(*GPU8, "critic.enable=true", "ref.enable=true", "trainer.worker_start_timeout_s=90")
    spec = builders.hosted_engine_spec(cfg, "model-dir", "tok")
    builders.build_workers(cfg, "model-dir", placement_group="shared-pg", engine=spec)
    assert timeouts == {(3600.0, 90.0)}  # every group: the call and start timeouts of the config
    assert made == [("actor", 8, {"CPU": 1.0, "GPU": 0.4}, "shared-pg", spec),
                    ("ref", 8, {"CPU": 1.0, "GPU": 0.2}, "shared-pg", None),
                    ("critic", 8, {"CPU": 1.0, "GPU": 0.3}, "shared-pg", None)]
    assert sum(placement.GPU_SHARE.values()) <= 1.0
    assert spec.name == "vllm" and spec.kwargs["enable_sleep_mode"] and spec.kwargs["tensor_parallel_size"] == 1


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
    from ragen.trainer.checks import check_engine_placement, check_trainer

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


def test_engine_actor_is_started_in_its_bundle_with_the_vllm_settings():
    log = []

    def remote(cls):
        def options(**opts):
            log.append(("options", cls.__name__, opts))
            return SimpleNamespace(remote=lambda **kw: log.append(("init", kw)) or FakeActorHandle(log))

        return SimpleNamespace(options=options)

    class VLLMEngine:
        pass

    cfg = _cfg(*GPU8, "rollout.vllm.gpu_memory_utilization=0.35", "rollout.vllm.tensor_parallel_size=1",
               "rollout.vllm.max_num_seqs=64", "agent.max_model_len=4096", "agent.max_new_tokens=256",
               "rollout.vllm.placement=separate", "rollout.vllm.rollout_gpus=1")
    engine = placement.start_engine_actor(cfg, "pg", VLLMEngine, "tok", "/m", "bfloat16", remote=remote,)
    (_, name, opts), (_, kwargs) = log
    assert name == "VLLMEngine" and opts["num_gpus"] == 1.0 and opts["num_cpus"] == 1
    assert opts["scheduling_strategy"].placement_group == "pg"
    assert opts["scheduling_strategy"].placement_group_bundle_index == 7
    assert opts["runtime_env"] == {"env_vars": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}}
    assert kwargs == {"tokenizer": "tok", "model": "/m", "device": "cuda", "dtype": "bfloat16",
                      "gpu_memory_utilization": 0.35, "tensor_parallel_size": 1, "enforce_eager": False,
                      "enable_sleep_mode": False, "max_num_seqs": 64, "max_model_len": 4096, "seed": 42}
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
    from ragen.trainer.ppo_trainer import PPOTrainer

    real_make = ragen.rollout.make_engine
    recorders = []

    def make(*args, **kwargs):
        recorders.append(Recorder(real_make(*args, **kwargs)))
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
    assert len(recorders) == 1 and isinstance(trainer.engine, HostedEngines)  # no engine in the driver
