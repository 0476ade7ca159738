"""Between-phase offload of a worker's state (``ragen.workers.offload``) on CPU, with the storage moves a CUDA device
makes (``host_copies``): parameters (plain and FSDP2 DTensor shards), gradients and AdamW state leave their
storages empty and come back bitwise; the next update is bitwise the update without the round trip; host buffers
are allocated once; a call made while offloaded brings the state back for that call only. Without
``host_copies`` (the CPU default) the calls only record themselves."""

from __future__ import annotations

import contextlib

import pytest
import torch
from factories import random_train_batch
from worker_helpers import sharded_world_of_one

from ragen.workers import ActorConfig, CriticConfig, CriticWorker, LocalWorkerGroup, PolicyWorker, TrainBatch

CFG = {"lr": 1e-3, "mini_batch_size": 4, "micro_batch_size": 2, "mixed_precision": "fp32"}


def _batch() -> TrainBatch:
    return random_train_batch(8, 24, seed=3, draw=("advantages", "returns"), values=torch.zeros(8, 24))


def _group(model_dir: str, role: str = "actor", host_copies: bool | None = True) -> LocalWorkerGroup:
    if role == "critic":
        group = LocalWorkerGroup(CriticWorker, model_name_or_path=model_dir, cfg=CriticConfig(**CFG))
    else:
        group = LocalWorkerGroup(PolicyWorker, model_name_or_path=model_dir, cfg=ActorConfig(**CFG), role=role)
    if host_copies is not None:
        group.worker.state_offload().host_copies = host_copies
    return group


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _state(worker) -> dict[str, torch.Tensor]:
    """Every parameter, gradient and optimizer-state tensor of the worker (local shards), cloned."""
    out = {f"param:{n}": _local(p.detach()).clone() for n, p in worker.module.named_parameters()}
    trainable = getattr(worker, "trainable", None)
    if trainable is not None:
        names = {id(p): n for n, p in worker.module.named_parameters()}
        for p, state in trainable.optimizer.state.items():
            out.update({f"optim:{names[id(p)]}:{k}": _local(v).clone() for k, v in state.items()})
    return out


def _device_bytes(worker) -> int:
    """Bytes held by the storages of the worker's parameters and optimizer state (0 when all are offloaded)."""
    tensors = [_local(p.detach()) for p in worker.module.parameters()]
    if getattr(worker, "trainable", None) is not None:
        tensors += [_local(v) for s in worker.trainable.optimizer.state.values() for v in s.values()]
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _updated(group: LocalWorkerGroup, batch: TrainBatch) -> tuple[TrainBatch, dict]:
    """The batch with its old log-probs, and the metrics of one update on it (AdamW state exists afterwards)."""
    if isinstance(group.worker, CriticWorker):
        return batch, group.call("update", batch)
    batch = batch.with_fields(old_log_probs=group.call("compute_log_probs", batch))
    return batch, group.call("update", batch)


@pytest.mark.parametrize("sharded", [False, True], ids=["plain", "fsdp2"])
@pytest.mark.parametrize("role", ["actor", "critic"])
def test_round_trip_is_bitwise_and_the_next_update_equals_the_update_without_it(model_dir, sharded, role):
    with sharded_world_of_one("cpu") if sharded else contextlib.nullcontext():
        moved, kept = _group(model_dir, role), _group(model_dir, role)
        worker = moved.worker
        if sharded:
            assert all(hasattr(p, "to_local") for p in worker.module.parameters())  # DTensor shards
        batch, _ = _updated(moved, _batch())
        _updated(kept, _batch())
        before, held = _state(worker), _device_bytes(worker)
        assert held > 0 and sum(k.startswith("optim:") for k in before) == 3 * sum(
            k.startswith("param:") for k in before)  # exp_avg, exp_avg_sq, step per parameter
        moved.call("offload")
        assert _device_bytes(worker) == 0  # every storage emptied
        assert worker.state_offload().host_bytes() == held
        moved.call("reload")
        assert _device_bytes(worker) == held and _equal(_state(worker), before)
        metrics_moved, metrics_kept = moved.call("update", batch), kept.call("update", batch)
        assert metrics_moved == metrics_kept
        assert _equal(_state(worker), _state(kept.worker))


def test_host_buffers_are_allocated_once(model_dir):
    group = _group(model_dir)
    offloader = group.worker.state_offload()
    batch, _ = _updated(group, _batch())
    group.call("offload")
    buffers = {k: b.data_ptr() for k, b in offloader._host.items()}
    for _ in range(3):
        group.call("reload")
        group.call("update", batch)
        group.call("offload")
    assert {k: b.data_ptr() for k, b in offloader._host.items()} == buffers


def test_a_call_while_offloaded_brings_the_state_back_for_that_call_only(model_dir, tmp_path):
    group = _group(model_dir)
    worker, offloader = group.worker, group.worker.state_offload()
    batch, _ = _updated(group, _batch())
    log_probs = group.call("compute_log_probs", batch)
    group.call("save", dir=str(tmp_path / "resident"))
    group.call("offload")
    assert torch.equal(group.call("compute_log_probs", batch), log_probs)
    assert offloader.events[-2:] == ["reload:params", "offload:params"]  # parameters only, then away again
    group.call("save", dir=str(tmp_path / "offloaded"))  # weights and optimizer state, back for the save
    assert offloader.offloaded == ("params", "optimizer") and _device_bytes(worker) == 0
    for name in ("model.safetensors", "optimizer.pt"):
        assert (tmp_path / "offloaded" / name).read_bytes() == (tmp_path / "resident" / name).read_bytes(), name


def test_the_weight_sync_keeps_the_parameters_while_the_optimizer_state_leaves(model_dir):
    group = _group(model_dir)
    batch, _ = _updated(group, _batch())
    weights = group.call_rank0("full_state_dict")
    group.call("offload", params=False)
    assert group.worker.state_offload().offloaded == ("optimizer",)
    assert _equal(group.call_rank0("full_state_dict"), weights)
    assert group.worker.state_offload().events == ["offload:optimizer"]  # the sync needed no reload
    group.call("offload")
    assert group.worker.state_offload().events == ["offload:optimizer", "offload:params"]


def test_the_reference_offloads_its_parameters(model_dir):
    group, batch = _group(model_dir, "ref"), _batch()
    log_probs = group.call("compute_log_probs", batch)
    before = _state(group.worker)
    group.call("offload")
    assert _device_bytes(group.worker) == 0
    group.call("reload")
    assert _equal(_state(group.worker), before)
    assert torch.equal(group.call("compute_log_probs", batch), log_probs)


def test_on_cpu_the_calls_only_record_themselves(model_dir):
    group = _group(model_dir, host_copies=None)
    assert group.worker.state_offload().host_copies is False  # the CPU default: the host is the device
    _updated(group, _batch())
    held = _device_bytes(group.worker)
    group.call("offload")
    assert group.worker.state_offload().offloaded == ("params", "optimizer")
    assert _device_bytes(group.worker) == held and group.worker.state_offload().host_bytes() == 0
    group.call("reload")
    assert group.worker.state_offload().events == ["offload:params", "offload:optimizer", "reload:params",
                                                   "reload:optimizer"]
