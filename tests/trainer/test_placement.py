"""GPU placement and the engine's sleep / wake schedule, through fakes that record calls and their order (no GPU,
no vLLM): one shared placement group with a {"GPU": 1, "CPU": k} bundle per GPU, rank r of every role and the
colocated engine in bundle r / 0, the separate engine on its own GPUs, and rollout -> sleep -> train -> wake
weights -> sync -> wake KV cache in a real (tiny, in-process) training step."""

from types import SimpleNamespace

import pytest
from trainer_helpers import tiny_overrides

from ragen.trainer import builders, placement
from ragen.trainer.compose import compose, load_train_config, to_train_config
from ragen.trainer.derived import world_size

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
    """Every role's group gets the same placement group (WorkerGroup puts rank r in bundle r) and a GPU fraction;
    the fractions of one bundle, with the colocated engine's, add up to one GPU."""
    made = []

    class RecordingGroup:
        def __init__(self, worker_cls, world_size, resources_per_worker, placement_group, **kw):
            made.append((kw["role"] if "role" in kw else "critic", world_size, resources_per_worker, placement_group))

    monkeypatch.setattr("ragen.workers.WorkerGroup", RecordingGroup)
    cfg = _cfg(*GPU8, "critic.enable=true", "ref.enable=true")
    builders.build_workers(cfg, "model-dir", placement_group="shared-pg")
    assert sorted(made) == [("actor", 8, {"CPU": 1.0, "GPU": 0.4}, "shared-pg"),
                            ("critic", 8, {"CPU": 1.0, "GPU": 0.3}, "shared-pg"),
                            ("ref", 8, {"CPU": 1.0, "GPU": 0.2}, "shared-pg")]
    assert sum(placement.GPU_SHARE.values()) + placement.ENGINE_SHARE == pytest.approx(1.0)
    assert placement.engine_bundle(cfg) == (0, placement.ENGINE_SHARE)


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
               "rollout.vllm.max_num_seqs=64", "agent.max_model_len=4096", "agent.max_new_tokens=256")
    engine = placement.start_engine_actor(cfg, "pg", VLLMEngine, "tok", "/m", "bfloat16", remote=remote,)
    (_, name, opts), (_, kwargs) = log
    assert name == "VLLMEngine" and opts["num_gpus"] == placement.ENGINE_SHARE and opts["num_cpus"] == 1
    assert opts["scheduling_strategy"].placement_group == "pg"
    assert opts["scheduling_strategy"].placement_group_bundle_index == 0
    assert opts["runtime_env"] == {"env_vars": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}}
    assert kwargs == {"tokenizer": "tok", "model": "/m", "device": "cuda", "dtype": "bfloat16",
                      "gpu_memory_utilization": 0.35, "tensor_parallel_size": 1, "enforce_eager": False,
                      "enable_sleep_mode": True, "max_num_seqs": 64, "max_model_len": 4096, "seed": 42}
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
    placement.wake_and_sync(rec, lambda: {"w": 1})
    placement.wake_and_sync(rec, None)
    assert rec.calls == ["wake('weights',)", "update_weights", "wake('kv_cache',)", "wake"]


def test_train_step_sleeps_after_rollout_and_wakes_weights_before_the_sync(tmp_path, monkeypatch):
    from ragen.trainer.ppo_trainer import PPOTrainer

    real_build = builders.build_engine
    recorders = []

    def build(*args, **kwargs):
        recorders.append(Recorder(real_build(*args, **kwargs)))
        return recorders[-1]

    monkeypatch.setattr(builders, "build_engine", build)
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
