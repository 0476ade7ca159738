"""PolicyWorker.sft_update (behaviour cloning): the demonstrated tokens become likely, nothing off the mask is
imitated, the RL lr schedule is untouched, and the optimizer can be reset before RL."""

from __future__ import annotations

import pytest
import torch

from ragen.algorithms.losses import bc_loss
from ragen.workers import ActorConfig, LocalWorkerGroup, PolicyWorker, TrainBatch

B, T = 4, 16


def demo_batch() -> TrainBatch:
    """Rows of random ids; the response (positions 10..) is the same 'demonstration' in every row."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 1000, (B, T), generator=g)
    ids[:, 10:] = torch.tensor([7, 8, 9, 10, 11, 12])
    resp = torch.zeros(B, T, dtype=torch.long)
    resp[:, 10:] = 1
    return TrainBatch(ids, torch.ones(B, T, dtype=torch.long), resp)


def test_bc_loss_hand_numbers():
    lp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -4.0]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 0]])
    assert float(bc_loss(lp, mask)) == pytest.approx((2 + 3 + 0.5 + 0.5) / 4)
    assert float(bc_loss(lp, mask, agg="seq-mean-token-sum")) == pytest.approx((5 + 1) / 2)
    assert float(bc_loss(lp, mask, num_tokens=8.0)) == pytest.approx(6 / 8)  # a share of a larger mini-batch


def test_sft_update_learns_the_demonstration_and_leaves_the_schedule(model_dir):
    cfg = ActorConfig(lr=1e-6, mini_batch_size=B, micro_batch_size=2, mixed_precision="fp32", temperature=0.5,
                      lr_schedule="cosine", total_steps=10, warmup_steps=2)
    actor = LocalWorkerGroup(PolicyWorker, model_name_or_path=model_dir, cfg=cfg)
    trainable = actor.worker.trainable
    batch = demo_batch()
    before = actor.call("compute_log_probs", batch)
    lr_before = trainable.scheduler.get_last_lr()[0]
    nll = [actor.call("sft_update", batch, epochs=3, lr=1e-2)["sft/nll"] for _ in range(5)]
    after = actor.call("compute_log_probs", batch)
    assert nll[-1] < 0.5 * nll[0], nll  # the demonstrated tokens become likely
    resp = batch.response_mask.bool()
    assert float((after - before)[resp].mean()) > 0.5
    assert not after[~resp].any() and not before[~resp].any()  # nothing off the mask is computed or imitated
    # the warm start's fixed lr neither reads nor advances the RL schedule
    assert trainable.steps == 0 and trainable.scheduler.get_last_lr()[0] == lr_before
    assert [g["lr"] for g in trainable.optimizer.param_groups] == [lr_before]
    m = actor.call("sft_update", batch, lr=3e-3)
    assert m["actor/lr"] == 3e-3 and m["sft/loss"] == pytest.approx(m["sft/nll"], rel=1e-5)  # token-mean
    assert len(trainable.optimizer.state) > 0
    actor.call("reset_optimizer")
    assert len(trainable.optimizer.state) == 0


def test_sft_on_the_ref_role_raises(model_dir):
    ref = LocalWorkerGroup(PolicyWorker, model_name_or_path=model_dir, role="ref",
                           cfg=ActorConfig(mini_batch_size=B, micro_batch_size=2, mixed_precision="fp32"))
    with pytest.raises(RuntimeError, match="frozen"):
        ref.call("sft_update", demo_batch())


def test_sft_lr_end_decays_linearly_over_the_calls_optimizer_steps(model_dir):
    """lr_end: optimizer step i of n runs at lr + (lr_end - lr) * i / n; two calls continuing one decay (the warm
    start's ``sft_rates``) give one linear decay; the RL rate is restored afterwards."""
    from ragen.trainer.config.schema import SftSection
    from ragen.trainer.warm_start import sft_rates

    cfg = ActorConfig(lr=1e-6, mini_batch_size=2, micro_batch_size=2, mixed_precision="fp32")
    actor = LocalWorkerGroup(PolicyWorker, model_name_or_path=model_dir, cfg=cfg)
    trainable = actor.worker.trainable
    seen: list[float] = []
    step = trainable.optimizer.step

    def recording_step(*args, **kwargs):
        seen.append(trainable.optimizer.param_groups[0]["lr"])
        return step(*args, **kwargs)

    trainable.optimizer.step = recording_step
    m = actor.call("sft_update", demo_batch(), epochs=2, lr=1e-3, lr_end=5e-4)  # 2 mini-batches x 2 epochs
    assert seen == pytest.approx([1e-3, 8.75e-4, 7.5e-4, 6.25e-4])
    assert m["actor/lr"] == pytest.approx(6.25e-4)
    assert [g["lr"] for g in trainable.optimizer.param_groups] == [1e-6]
    seen.clear()
    sft = SftSection(lr=8e-3, lr_schedule="linear")
    for k in range(2):
        actor.call("sft_update", demo_batch(), epochs=2, **sft_rates(sft, k, 2))
    assert seen == pytest.approx([8e-3 * (1 - i / 8) for i in range(8)])
    assert sft_rates(SftSection(lr=8e-3), 1, 2) == {"lr": 8e-3}  # constant: every update at sft.lr
    with pytest.raises(ValueError, match="lr_end needs lr"):
        actor.call("sft_update", demo_batch(), lr_end=1e-4)
    with pytest.raises(ValueError, match="sft.lr_schedule"):
        SftSection(lr_schedule="cosine")
