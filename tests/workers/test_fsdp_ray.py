"""FSDP2 world size 2 (Ray actors, gloo) must match world size 1 (in-process, unsharded): same losses,
same updated parameters (also over several mini-batches, for every loss aggregation), and checkpoints
interchangeable between the two."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from factories import random_train_batch
from transformers import AutoModelForCausalLM

from ragen.workers import (
    ActorConfig,
    CriticConfig,
    CriticWorker,
    LocalWorkerGroup,
    PolicyWorker,
    TrainBatch,
    WorkerGroup,
)
from ragen.workers.config import LOSS_AGG

pytestmark = pytest.mark.slow  # multi-process or minutes-long: bash scripts/test.sh -m slow


def _batch() -> TrainBatch:
    return random_train_batch(8, 24, seed=5, draw=("advantages", "returns"))


def _close(a: dict, b: dict, atol=2e-5):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=atol, rtol=1e-4, msg=k)


@pytest.mark.slow
def test_actor_and_critic_world_size_2_equals_1(ray_cluster, model_dir, tmp_path):
    batch = _batch()
    acfg = ActorConfig(lr=1e-3, mini_batch_size=8, micro_batch_size=2, ppo_epochs=2, mixed_precision="fp32",
                       entropy_coef=0.01, clip_high=0.2)
    ccfg = CriticConfig(lr=1e-3, mini_batch_size=8, micro_batch_size=4, ppo_epochs=2, mixed_precision="fp32")
    kw = {"model_name_or_path": model_dir}
    one = LocalWorkerGroup(PolicyWorker, cfg=ActorConfig(**{**acfg.__dict__, "micro_batch_size": 8}), **kw)
    two = WorkerGroup(PolicyWorker, 2, resources_per_worker={"CPU": 1}, cfg=acfg, **kw)
    try:
        _close(two.call_rank0("full_state_dict"), one.call_rank0("full_state_dict"), atol=0)
        lp1, lp2 = one.call("compute_log_probs", batch), two.call("compute_log_probs", batch)
        torch.testing.assert_close(lp2, lp1, atol=1e-5, rtol=1e-5)
        b = batch.with_fields(old_log_probs=lp1)
        m1, m2 = one.call("update", b), two.call("update", b)
        for k in ("actor/pg_loss", "actor/entropy", "actor/grad_norm", "actor/ppo_kl", "actor/pg_clipfrac"):
            assert m2[k] == pytest.approx(m1[k], rel=1e-4, abs=1e-6), k
        assert m1["actor/grad_norm"] > 0
        s1, s2 = one.call_rank0("full_state_dict"), two.call_rank0("full_state_dict")
        initial = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
        assert max(float((s1[k] - v).abs().max()) for k, v in initial.items()) > 1e-4  # parameters moved
        _close(s2, s1)
        # a checkpoint written by the sharded group loads into the unsharded one (and back)
        two.call("save", dir=str(tmp_path / "a2"))
        one.call("load", dir=str(tmp_path / "a2"))
        _close(one.call_rank0("full_state_dict"), s2, atol=0)
        two.call("load", dir=str(tmp_path / "a2"))
        m1, m2 = one.call("update", b), two.call("update", b)  # optimizer state restored on both sides
        assert m2["actor/pg_loss"] == pytest.approx(m1["actor/pg_loss"], rel=1e-4, abs=1e-6)
        _close(two.call_rank0("full_state_dict"), one.call_rank0("full_state_dict"))
    finally:
        two.shutdown()

    c1 = LocalWorkerGroup(CriticWorker, cfg=ccfg, **kw)
    c2 = WorkerGroup(CriticWorker, 2, cfg=ccfg, **kw)
    try:
        (v1, last1), (v2, last2) = c1.call("compute_values", batch), c2.call("compute_values", batch)
        torch.testing.assert_close((v2, last2), (v1, last1), atol=1e-6, rtol=1e-5)  # (values, last_values)
        b = batch.with_fields(values=v1)
        m1, m2 = c1.call("update", b), c2.call("update", b)
        assert m2["critic/vf_loss"] == pytest.approx(m1["critic/vf_loss"], rel=1e-4)
        assert m2["critic/grad_norm"] == pytest.approx(m1["critic/grad_norm"], rel=1e-4)
        torch.testing.assert_close(c2.call("compute_values", batch), c1.call("compute_values", batch),
                                   atol=2e-5, rtol=1e-4)
    finally:
        c2.shutdown()


def test_group_rejects_uneven_split():
    from ragen.workers.group import _split

    with pytest.raises(ValueError, match="multiple of 4"):
        _split(random_train_batch(6, 8), 4)


@pytest.mark.slow
@pytest.mark.parametrize("agg", LOSS_AGG)
def test_two_mini_batches_world_size_2_equals_1(ray_cluster, model_dir, agg):
    """Two optimizer steps per update (mini_batch_size 4 of 8 rows): the ranks must train on shards of the same
    global mini-batches as world size 1 (rows 0-3, then 4-7), not on mini-batches mixed from their halves."""
    batch = _batch()
    acfg = ActorConfig(lr=1e-3, mini_batch_size=4, micro_batch_size=1, mixed_precision="fp32", clip_high=0.2,
                       loss_agg=agg)
    kw = {"model_name_or_path": model_dir}
    one = LocalWorkerGroup(PolicyWorker, cfg=dataclasses.replace(acfg, micro_batch_size=2), **kw)
    two = WorkerGroup(PolicyWorker, 2, resources_per_worker={"CPU": 1}, cfg=acfg, **kw)
    try:
        lp1, lp2 = one.call("compute_log_probs", batch), two.call("compute_log_probs", batch)
        torch.testing.assert_close(lp2, lp1, atol=1e-5, rtol=1e-5)  # per-row results come back in row order
        b = batch.with_fields(old_log_probs=lp1)
        m1, m2 = one.call("update", b), two.call("update", b)
        for k in ("actor/pg_loss", "actor/grad_norm", "actor/ppo_kl", "actor/pg_clipfrac"):
            assert m2[k] == pytest.approx(m1[k], rel=1e-4, abs=1e-6), k
        assert m1["actor/ppo_kl"] != 0  # the second mini-batch ran on moved weights: its data matters
        _close(two.call_rank0("full_state_dict"), one.call_rank0("full_state_dict"))
    finally:
        two.shutdown()


@pytest.mark.slow
def test_lora_actor_world_size_2_equals_1(ray_cluster, model_dir, tmp_path):
    """LoRA under FSDP2 (frozen base and trainable adapters in the same units): the update, the merged weights the
    engine receives, the adapters-off reference and a checkpoint all match world size 1."""
    batch = _batch()
    acfg = ActorConfig(lora_rank=4, lora_alpha=8.0, lr=1e-2, mini_batch_size=8, micro_batch_size=2,
                       ppo_epochs=2, mixed_precision="fp32", clip_high=0.2)
    kw = {"model_name_or_path": model_dir}
    one = LocalWorkerGroup(PolicyWorker, cfg=dataclasses.replace(acfg, micro_batch_size=8), **kw)
    two = WorkerGroup(PolicyWorker, 2, resources_per_worker={"CPU": 1}, cfg=acfg, **kw)
    try:
        b = batch.with_fields(old_log_probs=one.call("compute_log_probs", batch))
        m1, m2 = one.call("update", b), two.call("update", b)
        for k in ("actor/pg_loss", "actor/grad_norm", "actor/ppo_kl"):
            assert m2[k] == pytest.approx(m1[k], rel=1e-4, abs=1e-6), k
        s1, s2 = one.call_rank0("full_state_dict"), two.call_rank0("full_state_dict")
        initial = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
        assert set(s1) == set(initial) and max(float((s1[k] - v).abs().max()) for k, v in initial.items()) > 1e-4
        _close(s2, s1)
        torch.testing.assert_close(two.call("compute_ref_log_probs", b), b.old_log_probs, atol=1e-5, rtol=1e-5)
        two.call("save", dir=str(tmp_path / "lora2"))
        one.call("load", dir=str(tmp_path / "lora2"))
        _close(one.call_rank0("full_state_dict"), s2, atol=1e-5)
    finally:
        two.shutdown()


@pytest.mark.slow
def test_collapse_cross_world_size_2_equals_1(ray_cluster, model_dir):
    """Every rank of a sharded actor scores the same pairs (its forwards are collectives): rank 0's cross matrix
    equals the unsharded actor's, NaN off the turns alike."""
    prompts = [[1, 40, 41, 42], [1, 50], [1, 60, 61], [1, 70, 71, 72, 73], [1, 80]]
    responses = [[100, 101], [102], [103, 104, 105], [106, 2], [107, 108]]
    turns = [0, 0, 1, 1, 1]
    cfg = ActorConfig(mini_batch_size=2, micro_batch_size=1, infer_micro_batch_size=3, mixed_precision="fp32",
                      temperature=0.7)
    one = LocalWorkerGroup(PolicyWorker, model_name_or_path=model_dir, cfg=cfg)
    two = WorkerGroup(PolicyWorker, 2, resources_per_worker={"CPU": 1}, model_name_or_path=model_dir, cfg=cfg)
    try:
        c1 = one.call_rank0("collapse_cross", prompts, responses, turns, 0)
        c2 = two.call_rank0("collapse_cross", prompts, responses, turns, 0)
    finally:
        two.shutdown()
    same = torch.tensor(turns)[:, None] == torch.tensor(turns)[None, :]
    assert bool(torch.isnan(c2[~same]).all()) and not bool(torch.isnan(c2[same]).any())
    torch.testing.assert_close(c2[same], c1[same], atol=1e-4, rtol=1e-5)
