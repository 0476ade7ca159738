"""A separately placed vLLM engine (``rollout.vllm.placement=separate``) that dies is replaced by a restart
(``trainer.max_restarts``), through fakes (no GPU, no Ray cluster, no vLLM): the Ray actors are recording handles,
and the one blocking wait (``ragen.workers.group.remote_get``) resolves their calls, raising the ``WorkerFailure`` a
dead actor gives.

1. ``rebuild_workers`` kills the old engine actor, starts a new one in the engine's bundle before the worker groups,
   binds the run's engine handle (the same object the proxies and the ``VersionedEngine`` hold) to it, and forms the
   NCCL weight-sync group of the new actor's rank 0 and the new engine.
2. Asynchronous training: the engine dies under the rollout thread; the trainer's next step sees the failure as a
   ``WorkerFailure`` in phase ``rollout``, restarts once, replays the discarded batch's seeds and goes on with the
   new engine, whose version restarts at the rewound step and whose weights come over NCCL.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from ragen.ppo.restarts import InitialState, rebuild_workers
from ragen.rollout.base import VERSION_KEY, Sample, SamplingParams
from ragen.rollout.versioned import VersionedEngine
from ragen.trainer import builders, placement
from ragen.trainer.config.compose import compose, to_train_config
from ragen.workers.group import WorkerFailure

SEPARATE = ["trainer=gpu", "rollout.vllm.placement=separate", "rollout.vllm.rollout_gpus=1", "rollout.dtype=bfloat16",
            "critic.enable=false", "ref.enable=false"]
NCCL_ADDRESS = ("10.0.0.5", 29511)


class Ref:
    """What a fake actor's ``method.remote(*args)`` returns: the call, resolved by :func:`fake_remote_get`."""

    def __init__(self, actor, method, args):
        self.actor, self.method, self.args = actor, method, args


class FakeActor:
    """A Ray actor handle: records every call in ``log`` as (name, method, args); dead after ``dies_at`` generate
    calls (the call numbered ``dies_at`` and every later one fail)."""

    def __init__(self, name, log, results=None, dies_at=None):
        self.name, self.log, self.results, self.dies_at = name, log, results or {}, dies_at
        self.generates = 0

    @property
    def dead(self):
        return self.dies_at is not None and self.generates >= self.dies_at

    def __getattr__(self, method):
        def remote(*args, **kwargs):
            self.log.append((self.name, method, args))
            if method == "generate":
                self.generates += 1
            return Ref(self, method, args)

        return SimpleNamespace(remote=remote)


def fake_remote_get(refs, who, method, timeout_s, *_, **__):
    """``remote_get`` over :class:`Ref`: a dead actor's call raises ``WorkerFailure`` naming ``who``."""
    if isinstance(refs, list):
        return [fake_remote_get(r, who, method, timeout_s) for r in refs]
    if refs.actor.dead:
        raise WorkerFailure(f"{who} died during {method}() (simulated)")
    if refs.method == "generate":
        return [Sample([7], [-0.5], "stop") for _ in refs.args[0]]
    return refs.actor.results.get(refs.method)


def fake_actor_group(name, log):
    """The actor's worker group: rank 0 (the NCCL sender, ``sync_address``) and the weight plan of one bucket."""
    from ragen.rollout.vllm_nccl import plan_buckets

    plan = plan_buckets([("w", "bfloat16", (4,))], bucket_bytes=8)
    rank0 = FakeActor(f"{name}.rank0", log, {"sync_address": NCCL_ADDRESS})
    return SimpleNamespace(name=name, workers=[rank0], world_size=1, call_rank0=lambda method, *a: plan,
                           shutdown=lambda: log.append((name, "shutdown", ())))


def install_fakes(monkeypatch, log, engines_started):
    """Engine actors start as :class:`FakeActor` (recording the bundle Ray would place them in), worker groups as
    :func:`fake_actor_group`, and the blocking wait resolves fake calls."""
    real_start = placement.start_engine_actor

    def remote(cls):
        def options(num_gpus, num_cpus, scheduling_strategy, **_):
            def start(**kwargs):
                actor = FakeActor(f"engine{len(engines_started) + 1}", log)
                engines_started.append((scheduling_strategy.placement_group_bundle_index, num_gpus, actor))
                log.append((actor.name, "start", ()))
                return actor

            return SimpleNamespace(remote=start)

        return SimpleNamespace(options=options)

    def build_workers(cfg, model_path, pg, engine=None):
        n = sum(1 for entry in log if entry[1] == "build_workers")
        log.append(("driver", "build_workers", (pg, engine)))
        return {"actor": fake_actor_group(f"actors{n + 1}", log)}

    monkeypatch.setattr(placement, "start_engine_actor", lambda *a, **kw: real_start(*a, **kw, remote=remote))
    monkeypatch.setattr(builders, "build_workers", build_workers)
    monkeypatch.setattr("ragen.workers.group.remote_get", fake_remote_get)


def test_a_restart_replaces_the_separate_engine_in_its_bundle_and_keeps_the_handle(monkeypatch):
    """The dead engine's actor is killed; a new one starts in bundle 7 (GPUs 0-6 train) on a whole GPU before the
    worker groups; the handle the proxies hold (inside the ``VersionedEngine``) is the same object, now driving the
    new actor; the new actor's rank 0 and the new engine form the NCCL group (world 1 + tensor parallel 1)."""
    cfg = to_train_config(compose("base", SEPARATE))
    log, started, killed = [], [], []
    install_fakes(monkeypatch, log, started)
    dead = FakeActor("engine0", log, dies_at=0)
    handle = placement.RemoteEngine(dead, timeout_s=cfg.trainer.worker_call_timeout_s)
    versioned = VersionedEngine(handle)
    proxy = SimpleNamespace(engine=versioned)  # what the agent proxies keep

    def stop_workers():
        for group in run.workers.values():
            group.shutdown()
        run.workers = {}

    run = SimpleNamespace(cfg=cfg, model_path="/m", tokenizer="tok", engine=versioned, record_placement=lambda: None,
                          workers={"actor": fake_actor_group("actors0", log)}, stop_workers=stop_workers)
    rebuild_workers(run, "pg", None, nccl=True, kill_engine=killed.append)

    [(bundle, gpus, new)] = started
    assert (bundle, gpus) == (7, 1.0) and killed == [dead]
    assert run.engine is versioned and versioned.engine is handle and handle.actor is new
    assert handle.timeout_s == cfg.trainer.worker_call_timeout_s
    host, port = NCCL_ADDRESS
    assert log == [("actors0", "shutdown", ()), ("engine1", "start", ()), ("driver", "build_workers", ("pg", None)),
                   ("actors1.rank0", "sync_address", ()),
                   ("actors1.rank0", "init_weight_sender", (host, port, 2)),
                   ("engine1", "rpc", ("ragen_init_weight_group", host, port, 1, 2))]
    samples = proxy.engine.generate([[1, 2]], SamplingParams())
    assert samples[0].token_ids == [7] and samples[0].extra[VERSION_KEY] == 0
    assert log[-1] == ("engine1", "generate", ([[1, 2]], SamplingParams()))
    assert dead.generates == 0  # nothing reached the dead actor


class FakeProxy:
    """The train proxy: each batch is one group of two episodes with seed ``counter``, played through ``engine``;
    its tokens carry the version the engine stamped. ``played`` lists the seeds each batch was played with."""

    def __init__(self, engine):
        self.engine, self.seed, self.played = engine, 0, []

    def rollout(self, mode):
        self.played.append(self.seed)
        samples = self.engine.generate([[1, 2], [1, 3]], SamplingParams())
        self.seed += 1
        versions = torch.tensor([[s.extra[VERSION_KEY]] for s in samples])
        return SimpleNamespace(sample_versions=versions, group_ids=torch.tensor([0, 0]), seed=self.played[-1])

    def state_dict(self):
        return {"seed": self.seed}

    def load_state_dict(self, state):
        self.seed = state["seed"]


def _async_trainer(tmp_path, first_engine, max_restarts=1):
    """A ``PPOTrainer`` of an asynchronous run with a separate engine, set up by hand around fakes: its step is the
    real rollout phase (the queue's next batch) and the real weight publication (NCCL sync to the engine)."""
    from ragen.ppo.trainer import PPOTrainer

    cfg = to_train_config(compose("base", [*SEPARATE, "trainer.async_rollout=true", "trainer.max_staleness=0",
                                           "trainer.total_steps=2", f"trainer.max_restarts={max_restarts}",
                                           "trainer.val_before_train=false", "trainer.progress_bar=false",
                                           f"trainer.output_dir={tmp_path}"]))
    trainer = PPOTrainer(cfg)
    run = trainer.run
    run.model_path, run.tokenizer = "/m", "tok"
    run.engine = VersionedEngine(placement.RemoteEngine(first_engine, timeout_s=60.0))
    run.workers = builders.build_workers(cfg, "/m", "pg")
    run.proxy = FakeProxy(run.engine)
    trainer.placement_group, trainer.nccl, trainer.initial_state = "pg", True, InitialState.now(run.proxy)
    consumed = []

    def step():
        metrics, t = {}, {}
        with trainer._timed("rollout", t):
            batch = trainer._train_rollout(metrics)
        consumed.append((batch.seed, batch.sample_versions.flatten().tolist()))
        with trainer._timed("weight_sync", t):
            run.engine.publish(run.step + 1, trainer._weight_sync)
        return metrics

    trainer.train_step = step
    trainer.validate = trainer.write_report = trainer.save_checkpoint = dict
    run.memory_metrics = run.plot = run.record_placement = dict
    return trainer, consumed


def test_an_engine_dying_under_the_rollout_thread_restarts_the_run_once(tmp_path, monkeypatch, capsys):
    """The first engine serves batch 0 and step 1's weights, then dies playing batch 1 in the rollout thread: step 2
    sees a ``WorkerFailure`` in phase ``rollout`` and restarts (no checkpoint: from the initial state); the queue is
    replayed from seed 0 with the new engine, whose version restarts at 0, and both steps complete."""
    log, started, killed = [], [], []
    install_fakes(monkeypatch, log, started)
    monkeypatch.setattr("ray.kill", lambda actor, no_restart=True: killed.append((actor, no_restart)))
    first = FakeActor("engine0", log, dies_at=2)
    trainer, consumed = _async_trainer(tmp_path, first)
    handle = trainer.run.engine.engine
    try:
        trainer.fit()
    finally:
        trainer.shutdown()
    said = capsys.readouterr().out
    assert "rollout engine died during generate() (simulated); in phase 'rollout' of step 2" in said
    assert "restart 1/1: rebuilding the worker groups and the rollout engine" in said
    assert trainer.restarts == 1 and killed == [(first, True)] and [s[:2] for s in started] == [(7, 1.0)]
    new = started[0][2]
    assert trainer.run.engine.engine is handle and handle.actor is new
    assert trainer.run.proxy.engine is trainer.run.engine  # the proxy's engine, never rebuilt
    assert trainer.run.proxy.played == [0, 1, 0, 1]  # the dead batch's seed, then a replay from the initial state
    assert consumed == [(0, [0, 0]), (0, [0, 0]), (1, [1, 1])]  # versions: reset to 0 by the restart
    assert [r["trainer/restarts"] for r in trainer.run.history] == [1.0, 1.0]  # step 1's first record dropped
    assert trainer.run.engine.version == 2
    new_calls = [(m, a[0] if a else None) for name, m, a in log if name == "engine1"]
    # the new engine joins the new actor's NCCL group, gets the initial weights, serves, gets step 1's, serves
    rpc = [a for m, a in new_calls if m == "rpc"]
    assert rpc == ["ragen_init_weight_group", *["ragen_begin_weight_update", "ragen_receive_bucket",
                                                 "ragen_finish_weight_update"] * 3]
    assert [m for m, _ in new_calls if m in ("generate", "start")] == ["start", "generate", "generate"]
    assert first.generates == 2 and "engine0" not in {name for name, _, _ in log[log.index(("engine1", "start", ())):]}


def test_without_restarts_left_a_dead_engine_stops_the_run_named(tmp_path, monkeypatch):
    """Control: the same death with ``trainer.max_restarts=0`` stops the run with the engine's ``WorkerFailure``."""
    log, started = [], []
    install_fakes(monkeypatch, log, started)
    trainer, _ = _async_trainer(tmp_path, FakeActor("engine0", log, dies_at=2), max_restarts=0)
    with pytest.raises(WorkerFailure, match=r"rollout engine died during generate\(\) \(simulated\); in phase "
                                            r"'rollout' of step 2"):
        try:
            trainer.fit()
        finally:
            trainer.shutdown()
    assert started == [] and trainer.restarts == 0
