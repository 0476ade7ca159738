"""Which rows form each global mini-batch is decided once (``ragen.workers.data.mini_batch_plan``: prompt order,
then consecutive blocks), for any world size; the ranks only shard it. Tested with repeated, interleaved prompts (the
bandit's two prompt variants, the ``turn`` layout's turn-0 rows between later turns), where regrouping rows by
prompt after sharding would give world size 2 other mini-batches than world size 1. Also: a mini-batch without a
loss token runs no optimizer or lr-schedule step."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from factories import padding_train_batch, prompt_response, random_train_batch, train_batch

from ragen.workers import ActorConfig, CriticConfig, CriticWorker, LocalWorkerGroup, PolicyWorker, TrainBatch
from ragen.workers.data import mini_batch_plan

P = [[5, 6, 7, 8, 9, 10, 11, 12], [5, 6, 7, 8, 9, 10, 11, 99]]  # two prompts differing in their last token


def interleaved(n: int = 16, seed: int = 3, block: int = 4) -> TrainBatch:
    """``n`` rows whose prompts alternate in blocks of ``block`` rows (4: groups of 4 episodes on two prompt variants,
    as the bandit's; 1: every other row), with random responses of 2-6 tokens, plus advantages, returns and values."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 7, (n,), generator=g).tolist()
    responses = [torch.randint(20, 900, (k,), generator=g).tolist() for k in lengths]
    batch = train_batch(prompt_response([P[(i // block) % 2] for i in range(n)], responses))
    noise = torch.randn(3, *batch.input_ids.shape, generator=g) * batch.response_mask
    return batch.with_fields(advantages=noise[0], returns=noise[1], values=noise[2] * 0.1)


@pytest.mark.parametrize("block", [1, 4])
def test_plan_is_the_same_mini_batches_at_every_world_size(block):
    b = interleaved(block=block)
    one = mini_batch_plan(b, 1, 8)
    a_rows = [i for i in range(16) if (i // block) % 2 == 0]
    assert one[0].tolist() == a_rows + [i for i in range(16) if i not in a_rows]  # prompt order
    two = mini_batch_plan(b, 2, 8)
    # rank r's i-th local mini-batch (4 rows) is its share of the i-th global one
    assert [r.tolist() for r in two] == [a_rows[:4] + one[0][8:12].tolist(), a_rows[4:] + one[0][12:].tolist()]
    for ws in (2, 4):
        parts = mini_batch_plan(b, ws, 8)
        local = 8 // ws
        for m in range(2):
            union = sorted(x for p in parts for x in p[m * local:(m + 1) * local].tolist())
            assert union == sorted(one[0][m * 8:(m + 1) * 8].tolist())


def test_worker_sees_the_planned_mini_batches(model_dir):
    """World size 1 through the group: each optimizer step's rows are one prompt's rows (the plan), whatever the
    batch order."""
    cfg = ActorConfig(lr=1e-3, mini_batch_size=8, micro_batch_size=4, mixed_precision="fp32")
    actor = LocalWorkerGroup(PolicyWorker, model_name_or_path=model_dir, cfg=cfg)
    b = interleaved(block=1)
    seen = []
    real = actor.worker._sft_micro_loss

    def spy(micro, *a, **kw):
        seen.append(micro.input_ids[:, 7].tolist())
        return real(micro, *a, **kw)

    actor.worker._sft_micro_loss = spy
    actor.call("sft_update", b, lr=1e-3)
    assert seen == [[12] * 4, [12] * 4, [99] * 4, [99] * 4]


def test_all_padding_mini_batch_takes_no_step(model_dir):
    """The ``turn`` layout pads the batch with rows that hold no model token; a mini-batch made only of them (or of
    failed episodes) must not move the weights (AdamW's momentum would) nor advance the lr schedule."""
    real = random_train_batch(4, 16, seed=2, draw=("advantages",), draw_seed=9)
    pad = padding_train_batch(4, 16, advantages=torch.zeros(4, 16))
    cfg = ActorConfig(lr=1e-2, mini_batch_size=4, micro_batch_size=4, mixed_precision="fp32", ppo_epochs=2)
    runs = {}
    for name, batch in (("real", real), ("padded", TrainBatch.cat([real, pad]))):
        actor = LocalWorkerGroup(PolicyWorker, model_name_or_path=model_dir, cfg=cfg)
        batch = batch.with_fields(old_log_probs=actor.call("compute_log_probs", batch))
        metrics = actor.call("update", batch)
        runs[name] = (actor.call_rank0("full_state_dict"), actor.worker.trainable.steps, metrics)
    (w_real, steps_real, m_real), (w_pad, steps_pad, m_pad) = runs["real"], runs["padded"]
    assert steps_real == steps_pad == 2  # one optimizer + schedule step per epoch: the padding block skipped
    assert m_pad["actor/empty_mini_batches"] == 2.0 and m_real["actor/empty_mini_batches"] == 0.0
    for k, v in w_real.items():
        assert torch.equal(v, w_pad[k]), k
    assert m_pad["actor/pg_loss"] == pytest.approx(m_real["actor/pg_loss"], rel=1e-6)


@pytest.mark.slow
def test_world_size_2_equals_1_with_interleaved_prompts(ray_cluster, model_dir):
    """Actor and critic updates over two mini-batches of 16 rows with alternating prompts: world size 2 (FSDP2,
    gloo) trains on the same mini-batches as world size 1, so the updated weights agree."""
    from ragen.workers import WorkerGroup

    b = interleaved()
    kw = {"model_name_or_path": model_dir}
    acfg = ActorConfig(lr=1e-2, mini_batch_size=8, micro_batch_size=2, mixed_precision="fp32", clip_high=0.2)
    one = LocalWorkerGroup(PolicyWorker, cfg=dataclasses.replace(acfg, micro_batch_size=4), **kw)
    two = WorkerGroup(PolicyWorker, 2, resources_per_worker={"CPU": 1}, cfg=acfg, **kw)
    try:
        lp = one.call("compute_log_probs", b)
        torch.testing.assert_close(two.call("compute_log_probs", b), lp, atol=1e-5, rtol=1e-5)
        ab = b.with_fields(old_log_probs=lp)
        m1, m2 = one.call("update", ab), two.call("update", ab)
        assert m2["actor/ppo_kl"] == pytest.approx(m1["actor/ppo_kl"], rel=1e-3, abs=1e-7)
        assert m1["actor/ppo_kl"] != 0  # the second mini-batch ran on moved weights: which rows it holds matters
        s1, s2 = one.call_rank0("full_state_dict"), two.call_rank0("full_state_dict")
        for k in s1:
            torch.testing.assert_close(s2[k], s1[k], atol=2e-5, rtol=1e-4, msg=k)
    finally:
        two.shutdown()
    ccfg = CriticConfig(lr=1e-2, mini_batch_size=8, micro_batch_size=2, mixed_precision="fp32")
    c1 = LocalWorkerGroup(CriticWorker, cfg=ccfg, **kw)
    c2 = WorkerGroup(CriticWorker, 2, cfg=ccfg, **kw)
    try:
        c1.call("update", b)
        c2.call("update", b)
        torch.testing.assert_close(c2.call("compute_values", b), c1.call("compute_values", b), atol=2e-5, rtol=1e-4)
    finally:
        c2.shutdown()
