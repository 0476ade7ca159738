"""``trainer.offload=phase``: the between-phase offload in the real PPO step (``PPOTrainer.train_step`` with
``placement.wake_and_sync``), and the per-phase memory metrics the step logs.

The step runs on CPU with in-process workers whose offloads really move their storages (``host_copies``), wrapped
in a fake CUDA memory accountant (``memory_accountant.py``) that sizes what each owner would hold on a GPU. The
property: when the engine wakes its KV cache no parameter, gradient or optimizer state of the actor, critic or
reference is resident, so the run's peak is the larger of the engine's and the training's memory, not their sum;
and the steps' results are bitwise those of the same run without offload.
"""

from __future__ import annotations

import pytest
import torch
from memory_accountant import Accountant
from trainer_helpers import tiny_overrides

from ragen.trainer import placement
from ragen.trainer.config.compose import load_train_config

# Sizes (any unit) of what each owner would hold on the GPU.
SIZES = {"actor/params": 10, "actor/grads": 10, "actor/optim": 20, "critic/params": 10, "critic/grads": 10,
         "critic/optim": 20, "ref/params": 10, "engine/weights": 10, "engine/kv_cache": 40}
ENGINE = 10 + 40
TRAINING = (10 + 10 + 20) + (10 + 20) + 10  # in the actor's update: its params, grads and Adam; critic; reference
RESIDENT_STATE = (10 + 20) + (10 + 20) + 10  # between phases: params and Adam of actor and critic; reference
STEPS = 2


def _run(tmp_path, offload: str) -> dict:
    """Two PPO steps of the bandit config (actor, critic, reference: KL loss) with the accountant around the groups
    and the engine; the workers' offloads move bytes. Returns the accountant, the steps' metrics, the final weights
    and what each worker has offloaded at the end."""
    from ragen.ppo.trainer import PPOTrainer

    acc = Accountant(dict(SIZES))
    cfg = load_train_config("ppo_bandit", [*tiny_overrides(tmp_path, STEPS), "trainer.use_ray=false",
                                           "trainer.val_before_train=false", "rollout.val_n_groups=1",
                                           "actor.use_kl_loss=true", f"trainer.offload={offload}"])
    trainer = PPOTrainer(cfg)
    trainer.setup()
    try:
        assert {r for r, g in trainer.run.workers.items() if g is not None} == {"actor", "critic", "ref"}
        trainer.run.workers = {r: acc.group(r, g) for r, g in trainer.run.workers.items()}
        # the engines live in the actor's ranks: their handle drives the accounted group, and is accounted itself
        trainer.run.engine.rebind(trainer.run.workers["actor"])
        run = trainer.run
        run.engine = run.proxy.engine = run.val_proxy.engine = acc.engine(run.engine)
        for group in trainer.run.workers.values():
            group.inner.worker.state_offload().host_copies = True  # CPU: really move the storages
        metrics = [trainer.train_step() for _ in range(STEPS)]
        weights = {r: _weights(trainer.run.workers[r].inner.worker) for r in ("actor", "critic")}
        offloaded = {r: g.inner.worker.state_offload().offloaded for r, g in trainer.run.workers.items()}
    finally:
        trainer.shutdown()
    return {"acc": acc, "metrics": metrics, "weights": weights, "offloaded": offloaded}


def _weights(worker) -> dict[str, torch.Tensor]:
    with worker.state_offload().resident(optimizer=False):  # back on the "GPU" for the copy, then off again
        return {k: v.clone() for k, v in worker.module.state_dict().items()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    return {mode: _run(tmp_path_factory.mktemp(mode), mode) for mode in ("phase", "none")}


def test_nothing_of_the_updates_is_resident_when_the_kv_cache_wakes(runs):
    acc = runs["phase"]["acc"]
    assert acc.violations == [], acc.violations  # every pass found its state on the GPU: reloaded in time
    assert acc.at_kv_wake == [frozenset()] * STEPS, acc.at_kv_wake
    assert acc.peak == max(ENGINE, TRAINING) == TRAINING
    assert runs["phase"]["offloaded"] == {r: ("params", "optimizer") for r in ("actor", "critic", "ref")}
    # the schedule of one step: reload after the sleep; before the weights wake everything but the actor's
    # parameters leaves (the sync reads them), those leave before the KV cache wakes
    events = acc.events[len(acc.events) - 1 - acc.events[::-1].index("engine.sleep"):]  # the last step's
    assert events[:4] == ["engine.sleep", "actor.reload", "critic.reload", "ref.reload"], events
    tail = events[events.index("actor.update done") + 1:]
    assert tail == ["actor.offload", "critic.offload", "ref.offload", "engine.wake('weights',)",
                    "actor.sync_engine_weights", "actor.offload", "critic.offload", "ref.offload",
                    "engine.wake('kv_cache',)"], tail


def test_without_offload_the_engine_wakes_on_top_of_the_training_state(runs):
    """The same accountant on the step without offload (the behaviour before ``trainer.offload``): the KV cache
    wakes while the parameters and Adam states stay, and the peak is their sum."""
    acc = runs["none"]["acc"]
    assert acc.violations == []
    assert acc.at_kv_wake[-1] == frozenset({"actor/params", "actor/optim", "critic/params", "critic/optim",
                                            "ref/params"})
    assert acc.peak == ENGINE + RESIDENT_STATE > max(ENGINE, TRAINING)


def test_offload_changes_no_number(runs):
    on, off = runs["phase"], runs["none"]
    for role in ("actor", "critic"):
        a, b = on["weights"][role], off["weights"][role]
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), role
    for m_on, m_off in zip(on["metrics"], off["metrics"], strict=True):
        for key in [k for k in m_off if k.split("/")[0] in ("actor", "critic", "reward", "rollout")]:
            assert m_on[key] == m_off[key], key


def test_each_phase_logs_its_memory_peak(runs):
    """Worker phases are recorded by the workers, engine phases by the driver; on CPU: the RSS at the phase's end
    and, where the kernel lets the peak be reset, the phase's peak RSS."""
    metrics = runs["phase"]["metrics"][-1]
    phases = ("rollout", "weight_sync", "actor_log_probs", "ref_log_probs", "critic_values", "critic_update",
              "actor_update")
    for phase in phases:
        assert 0.05 < metrics[f"memory/{phase}/rss"] < 8.0, phase
        if f"memory/{phase}/rss_peak" in metrics:
            assert metrics[f"memory/{phase}/rss_peak"] >= metrics[f"memory/{phase}/rss"] - 1e-3, phase
    assert {k.split("/")[1] for k in metrics if k.startswith("memory/")} == set(phases)
    assert metrics["timing/reload"] >= 0.0 and metrics["timing/offload"] >= 0.0
    assert "timing/offload" not in runs["none"]["metrics"][-1]


class Schedule:
    def __init__(self, log):
        self.log = log

    def before_wake(self, tags):
        self.log.append(f"offload before wake{tags}")


def test_wake_and_sync_offloads_before_each_wake():
    log = []
    engine = type("E", (), {"wake": lambda self, tags=None: log.append(f"wake{tags}")})()
    placement.wake_and_sync(engine, lambda: log.append("sync"), Schedule(log))
    placement.wake_and_sync(engine, None, Schedule(log))
    assert log == ["offload before wake('weights',)", "wake('weights',)", "sync",
                   "offload before wake('kv_cache',)", "wake('kv_cache',)", "offload before wakeNone", "wakeNone"]
