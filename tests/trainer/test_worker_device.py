"""Every worker computes on the run's device (``trainer.device``, resolved by
``ragen.trainer.config.run_shape.device``), also ``cpu`` on a machine where CUDA is visible. CUDA is faked
(``torch.cuda.is_available`` answers True, ``set_device`` records its device), so this runs on any machine: a worker
that took CUDA would fail on a CPU-only torch build."""

from __future__ import annotations

import pytest
import torch
from trainer_helpers import tiny_overrides

from ragen.trainer import builders
from ragen.trainer.config.compose import compose, to_train_config
from ragen.workers import dist as D


@pytest.fixture
def fake_cuda(monkeypatch) -> list[torch.device]:
    """CUDA answers as visible with one device; returns the devices ``torch.cuda.set_device`` was called with."""
    chosen: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    return chosen


def _cfg(tmp_path, *overrides):
    return to_train_config(compose("base", [*tiny_overrides(tmp_path), "trainer.use_ray=false", *overrides]))


class RecordingWorker:
    """Records the device it was given and the device ``init_distributed`` picks for it."""

    def __init__(self, rank: int = 0, world_size: int = 1, device: str | None = None, **_):
        self.given = device
        self.device = D.init_distributed(rank, world_size, device=device)


@pytest.mark.parametrize(("overrides", "expected"), [
    (["trainer.device=cpu", "trainer.n_gpus_per_node=1"], "cpu"),    # cpu asked for, CUDA visible
    (["trainer.device=auto", "trainer.n_gpus_per_node=0"], "cpu"),   # auto without configured GPUs
    (["trainer.device=auto", "trainer.n_gpus_per_node=1"], "cuda"),  # auto with a configured, visible GPU
    (["trainer.device=cuda", "trainer.n_gpus_per_node=1"], "cuda"),
])
def test_worker_groups_pass_the_run_device_to_their_workers(tmp_path, fake_cuda, overrides, expected):
    cfg = _cfg(tmp_path, *overrides)
    worker = builders.make_group(cfg, RecordingWorker, "actor").worker
    assert worker.given == expected
    assert worker.device == (torch.device("cuda", 0) if expected == "cuda" else torch.device("cpu"))
    assert fake_cuda == ([torch.device("cuda", 0)] if expected == "cuda" else [])


def test_policy_and_critic_workers_compute_on_cpu_when_the_run_says_cpu(tmp_path, fake_cuda):
    """The real workers, built by ``build_workers`` for trainer.device=cpu with CUDA visible: every parameter and
    every result is on the CPU (a worker that took CUDA fails on a CPU-only torch, or computes on the GPU)."""
    from ragen.workers import TrainBatch

    cfg = _cfg(tmp_path, "trainer.device=cpu", "trainer.n_gpus_per_node=1", "critic.enable=true", "ref.enable=true",
               "actor.use_kl_loss=true")
    model_path, _ = builders.prepare_model(cfg)
    groups = builders.build_workers(cfg, model_path)
    assert sorted(r for r, g in groups.items() if g is not None) == ["actor", "critic", "ref"]
    ids = torch.randint(3, 1000, (4, 12), generator=torch.Generator().manual_seed(0))
    attn, resp = torch.ones_like(ids), torch.ones_like(ids)
    batch = TrainBatch(ids, attn, resp)
    for role, group in groups.items():
        w = group.worker
        assert w.device == torch.device("cpu"), role
        assert {p.device.type for p in w.module.parameters()} == {"cpu"}, role
        out = group.call("compute_values" if role == "critic" else "compute_log_probs", batch)
        assert (out[0] if isinstance(out, tuple) else out).isfinite().all(), role
    assert fake_cuda == []


def test_archer_critic_worker_follows_the_device(fake_cuda):
    from ragen.archer.critic import ArcherCriticWorker, CriticSettings

    worker = ArcherCriticWorker(CriticSettings(encoder="tiny", hidden=16, batch_size=4), device="cpu")
    assert worker.device == torch.device("cpu")
    assert {p.device.type for p in worker.online.parameters()} == {"cpu"}
    assert fake_cuda == []


def test_a_cuda_worker_without_cuda_fails_naming_the_setting(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="trainer.device=cuda.*sees no CUDA device.*trainer.device=cpu"):
        D.init_distributed(0, 1, device="cuda")
