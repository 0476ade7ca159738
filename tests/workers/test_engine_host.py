"""The rollout engine an actor rank hosts (``ragen.workers.engine_host``): built and put to sleep before the training
model; its sleep state; its weight sync (the actor's weights at the engine's dtype, LoRA merged, one tensor at a
time, no full state dict, a summary back); one hosting rank samples exactly what an engine in the driver did."""

from __future__ import annotations

import os

import pytest
import torch
from factories import random_train_batch
from worker_helpers import sharded_world_of_one

from ragen.rollout.base import Sample, SamplingParams, SleepState
from ragen.workers import ActorConfig, LocalWorkerGroup, PolicyWorker, TrainBatch
from ragen.workers.engine_host import EngineHost, EngineSpec, engine_kwargs_for

CFG = {"lr": 1e-2, "mini_batch_size": 8, "micro_batch_size": 8, "mixed_precision": "fp32"}


class LoggedEngine:
    """A fake engine that logs its construction and calls into ``log``."""

    def __init__(self, log: list, **kwargs):
        self.log, self.kwargs = log, kwargs
        self.sleep_state = SleepState()
        log.append("engine")
        self.environ = {k: os.environ.get(k) for k in ("VLLM_ENABLE_V1_MULTIPROCESSING", "RANK", "LOCAL_RANK")}

    def generate(self, prompts, sampling):
        self.log.append("generate")
        return [Sample([1], [-0.5], "length") for _ in prompts]

    def update_weights(self, items):
        self.log.append(("update_weights", [name for name, _ in items]))

    @property
    def asleep(self):
        return self.sleep_state.asleep

    def sleep(self):  # the engine's own sleep state (ragen.rollout.base) decides what reaches the log
        self.sleep_state.sleep(lambda: self.log.append("engine.sleep"))

    def wake(self, tags=None):
        self.sleep_state.wake(tags, lambda parts: self.log.append(("engine.wake", parts)))


def _batch() -> TrainBatch:
    return random_train_batch(8, 24, seed=7, draw=("advantages",))


def _update(group: LocalWorkerGroup) -> None:
    b = _batch()
    group.call("update", b.with_fields(old_log_probs=group.call("compute_log_probs", b)))


def test_engine_is_built_and_put_to_sleep_before_the_model_and_optimizer(model_dir, monkeypatch):
    log: list = []
    import ragen.workers.actor as actor_mod

    real_open, real_trainable = actor_mod.M.open_model, actor_mod.Trainable
    monkeypatch.setattr("ragen.rollout.make_engine", lambda name, **kw: LoggedEngine(log, **kw))
    monkeypatch.setattr(actor_mod.M, "open_model", lambda *a, **kw: log.append("model") or real_open(*a, **kw))
    monkeypatch.setattr(actor_mod, "Trainable", lambda *a, **kw: log.append("optimizer") or real_trainable(*a, **kw))
    worker = PolicyWorker(model_dir, ActorConfig(**CFG), engine=EngineSpec("hf", {"model": model_dir}))
    assert log == ["engine", "engine.sleep", "model", "optimizer"]
    assert worker.engine_host.engine.kwargs == {"model": model_dir, "device": "cpu"}  # the rank's own device
    with pytest.raises(ValueError, match="only the actor hosts"):
        PolicyWorker(model_dir, ActorConfig(**CFG), role="ref", engine=EngineSpec("hf", {}))
    with pytest.raises(RuntimeError, match="hosts no rollout engine"):
        PolicyWorker(model_dir, ActorConfig(**CFG)).engine_generate([[1]], SamplingParams())


def test_the_host_knows_what_is_asleep():
    log: list = []
    host = EngineHost(EngineSpec("hf"), torch.device("cpu"), make=lambda name, **kw: LoggedEngine(log, **kw))
    assert log == ["engine", "engine.sleep"] and host.asleep == {"weights", "kv_cache"}
    with pytest.raises(RuntimeError, match="asleep"):
        host.generate([[1]], SamplingParams())
    with pytest.raises(RuntimeError, match="weights are asleep"):
        host.load_weights([])
    host.wake(("weights",))
    host.load_weights([("w", torch.ones(2))])
    host.wake(("weights",))  # already awake: not forwarded
    host.wake(None)  # only the KV cache is left
    host.ensure_awake()
    host.sleep()
    host.sleep()  # asleep already: not forwarded
    host.ensure_awake()
    assert log[2:] == [("engine.wake", ("weights",)), ("update_weights", ["w"]), ("engine.wake", ("kv_cache",)),
                       "engine.sleep", ("engine.wake", None)]
    with pytest.raises(ValueError, match="unknown engine parts"):
        host.wake(("cache",))


def test_vllm_is_built_in_process_and_joins_the_ranks_process_group():
    """vLLM in the worker: its engine core in-process while it is built (the variable is restored afterwards);
    several ranks: the executor that joins the existing process group, told the rank."""
    log: list = []
    before = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    host = EngineHost(EngineSpec("vllm", {"model": "/m", "device": "cuda"}), torch.device("cpu"), rank=1,
                      world_size=2, make=lambda name, **kw: LoggedEngine(log, **kw))
    assert host.engine.environ == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "RANK": "1", "LOCAL_RANK": "0"}
    assert host.engine.kwargs == {"model": "/m", "device": "cpu", "distributed_executor_backend": "external_launcher"}
    assert os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == before
    one = engine_kwargs_for(EngineSpec("vllm", {"model": "/m"}), torch.device("cuda", 0), world_size=1)
    assert one == {"model": "/m", "device": "cuda"}  # one rank: vLLM's uniprocess executor
    assert engine_kwargs_for(EngineSpec("hf", {}), torch.device("cuda", 0), 1) == {"device": "cuda:0"}
    with pytest.raises(ValueError, match="cannot be hosted"):
        EngineHost(EngineSpec("openai"), torch.device("cpu"), make=lambda name, **kw: None)


def _hosted(model_dir: str, dtype: str, **cfg) -> LocalWorkerGroup:
    return LocalWorkerGroup(PolicyWorker, model_name_or_path=model_dir, cfg=ActorConfig(**{**CFG, **cfg}),
                            engine=EngineSpec("hf", {"model": model_dir, "dtype": dtype}))


@pytest.mark.parametrize("sharded", [False, True], ids=["plain", "fsdp2"])
@pytest.mark.parametrize("lora", [0, 4])
def test_sync_gives_the_engine_the_actors_weights_at_rollout_dtype(model_dir, monkeypatch, lora, sharded):
    """After an update the engine holds exactly the actor's weights (LoRA merged, value head left out) cast to the
    rollout dtype; the sync never builds a full state dict and returns three numbers."""
    from contextlib import nullcontext

    from ragen.workers import dist as D

    with sharded_world_of_one("cpu") if sharded else nullcontext():
        group = _hosted(model_dir, "bfloat16", lora_rank=lora, lora_alpha=8.0)
        _update(group)
        worker = group.worker
        want = {k: v.to(torch.bfloat16) for k, v in worker._policy_weights(D.full_state_dict(worker.module)).items()}
        engine = worker.engine_host.engine
        stale = engine.model.state_dict()
        assert any(not torch.equal(stale[k], want[k]) for k in want)  # the update moved the weights

        def no_full_state(*a, **kw):
            raise AssertionError("the weight sync built a full state dict")

        monkeypatch.setattr(D, "full_state_dict", no_full_state)
        worker.engine_wake(("weights",))
        summary = group.call("sync_engine_weights")
        monkeypatch.undo()
    got = engine.model.state_dict()
    assert set(got) == set(want)
    for k in want:
        assert got[k].dtype == torch.bfloat16 and torch.equal(got[k], want[k]), k
    assert set(summary) == {"tensors", "bytes", "seconds"}
    assert summary["tensors"] == len(want)  # every tensor once, at 2 bytes a value
    assert summary["bytes"] == sum(v.numel() * 2 for v in want.values())


def test_one_hosting_rank_samples_what_the_driver_engine_sampled(model_dir):
    """The same weights and seed: the engine in the actor's rank (synced in place) and an engine in the driver
    (given the actor's full state dict) sample the same tokens with the same log-probs, at every temperature."""
    from ragen.rollout.hf import HFEngine
    from ragen.trainer.hosted import HostedEngines

    group = _hosted(model_dir, "float32")
    _update(group)
    hosted = HostedEngines(group)
    hosted.wake(("weights",))
    hosted.sync_weights()
    hosted.wake(("kv_cache",))
    driver = HFEngine(model_dir, group.worker.engine_host.engine.tokenizer, dtype="float32")
    driver.update_weights(group.call_rank0("full_state_dict"))
    prompts = [[5, 17, 230, 4], [9, 9], [5, 17, 230, 4], [300, 2, 44, 61, 7, 8]]
    for sampling in (SamplingParams(temperature=1.0, max_new_tokens=8, seed=11),
                     SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=8, seed=3),
                     SamplingParams(temperature=0.0, max_new_tokens=8)):
        got, want = hosted.generate(prompts, sampling), driver.generate(prompts, sampling)
        assert [s.token_ids for s in got] == [s.token_ids for s in want]
        assert [s.log_probs for s in got] == [s.log_probs for s in want]
        assert [s.finish_reason for s in got] == [s.finish_reason for s in want]
    with pytest.raises(TypeError, match="from the actor's ranks"):
        hosted.update_weights({})


def test_engines_keep_their_own_sleep_state(model_dir):
    """The engine records what is asleep (``ragen.rollout.base.SleepState``), so the host, the driver's handle and
    restarts ask it: the hf engine in the driver, the OpenAI engine (recorded only) and the hosted ones."""
    from ragen.rollout.hf import HFEngine
    from ragen.rollout.openai_engine import OpenAIEngine
    from ragen.trainer import placement
    from ragen.trainer.hosted import HostedEngines

    group = _hosted(model_dir, "float32")
    engine = HFEngine(model_dir, group.worker.engine_host.engine.tokenizer, dtype="float32")
    assert engine.asleep == frozenset()  # built awake
    engine.sleep()
    assert engine.asleep == {"weights", "kv_cache"}
    engine.wake(("weights",))
    assert engine.asleep == {"kv_cache"}
    with pytest.raises(ValueError, match="unknown engine parts"):
        engine.wake(("cache",))
    engine.wake(None)
    assert engine.asleep == frozenset()
    served = OpenAIEngine("m", transport=lambda *a: None)
    served.sleep()
    assert served.asleep == {"weights", "kv_cache"}

    hosted = HostedEngines(group)
    assert hosted.asleep == {"weights", "kv_cache"} == group.worker.engine_host.engine.asleep  # asleep when built
    placement.wake_and_sync(hosted, hosted.sync_weights)
    assert hosted.asleep == frozenset() == group.worker.engine_host.engine.asleep
    hosted.sleep()
    hosted.wake(("weights",))
    assert hosted.asleep == {"kv_cache"} == group.worker.engine_host.engine.asleep
