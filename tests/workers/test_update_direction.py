"""The direction of one PPO update (catches sign errors in the policy loss, the optimizer step or the log-probs).

A tiny fp32 policy takes exactly one optimizer step on a batch whose advantages are +1 on the response tokens of
some rows and -1 on others: afterwards the log-probs of the positive-advantage tokens must have risen and those of
the negative-advantage tokens fallen (on average), and flipping the advantages must flip both.
"""

from __future__ import annotations

import pytest
import torch

from ragen.workers import ActorConfig, LocalWorkerGroup, PolicyWorker, TrainBatch

B, T, VOCAB = 8, 20, 1000


def _batch(adv_sign: torch.Tensor) -> TrainBatch:
    """B rows of distinct random ids, prompt = first 8 tokens, response = the rest up to a per-row length;
    advantages = adv_sign[row] on the response tokens."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, VOCAB, (B, T), generator=g)
    lengths = torch.tensor([T, T - 2, T - 4, T - 1, T, T - 3, T - 5, T])
    pos = torch.arange(T)[None]
    attn = (pos < lengths[:, None]).long()
    resp = ((pos >= 8) & (attn > 0)).long()
    adv = adv_sign[:, None].float() * resp
    return TrainBatch(ids * attn, attn, resp, advantages=adv)


def _actor(model_dir: str, **cfg) -> LocalWorkerGroup:
    base = {"lr": 1e-3, "mini_batch_size": B, "micro_batch_size": 4, "mixed_precision": "fp32", "ppo_epochs": 1,
            "grad_clip": 1.0, "weight_decay": 0.0}
    return LocalWorkerGroup(PolicyWorker, model_name_or_path=model_dir, cfg=ActorConfig(**{**base, **cfg}))


def _one_update(model_dir: str, signs: torch.Tensor, **cfg) -> tuple[TrainBatch, torch.Tensor, dict]:
    """(batch with old log-probs, change of each token's log-prob after one update, update metrics)."""
    actor = _actor(model_dir, **cfg)
    batch = _batch(signs)
    old = actor.call("compute_log_probs", batch)
    batch = batch.with_fields(old_log_probs=old)
    metrics = actor.call("update", batch)
    assert metrics["actor/skipped_steps"] == 0.0
    return batch, actor.call("compute_log_probs", batch) - old, metrics


SIGNS = torch.tensor([1, -1, 1, -1, -1, 1, 1, -1])


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-sum"])
def test_one_update_raises_positive_and_lowers_negative_advantage_tokens(model_dir, loss_agg):
    batch, delta, m = _one_update(model_dir, SIGNS, loss_agg=loss_agg)
    pos = batch.advantages > 0
    neg = batch.advantages < 0
    assert pos.sum() > 20 and neg.sum() > 20
    up, down = delta[pos].mean(), delta[neg].mean()
    assert up > 1e-3, (up, down)
    assert down < -1e-3, (up, down)
    # most rows move their own way, and the surrogate sum(A * delta) rises
    row_means = torch.stack([delta[r][batch.response_mask[r].bool()].mean() for r in range(B)])
    assert int((torch.sign(row_means) == SIGNS).sum()) >= 6, row_means
    assert float((delta * batch.advantages).sum()) > 0
    # log-probs off the response are not part of the loss: they stay 0 in both passes
    assert not delta[~batch.response_mask.bool()].any()
    # at ratio 1 the surrogate is -A aggregated: token mean, or per-sequence sums averaged over sequences
    mask = batch.response_mask.bool()
    a_sum = float(batch.advantages[mask].sum())
    expected = -a_sum / float(mask.sum()) if loss_agg == "token-mean" else -a_sum / B
    assert m["actor/pg_loss"] == pytest.approx(expected, rel=1e-5)


def test_flipped_advantages_flip_the_update(model_dir):
    batch, delta, _ = _one_update(model_dir, SIGNS)
    _, flipped, _ = _one_update(model_dir, -SIGNS)
    pos = batch.advantages > 0
    # the same tokens now move the other way
    assert delta[pos].mean() > 1e-3 and flipped[pos].mean() < -1e-3
    assert delta[~pos & batch.response_mask.bool()].mean() < -1e-3
    assert flipped[~pos & batch.response_mask.bool()].mean() > 1e-3


def test_zero_advantages_and_zero_lr_leave_log_probs(model_dir):
    _, still, m = _one_update(model_dir, SIGNS, lr=0.0)
    assert still.abs().max() < 1e-6 and m["actor/grad_norm"] > 0
    _, zero, m0 = _one_update(model_dir, torch.zeros(B))
    assert zero.abs().max() < 1e-6 and m0["actor/grad_norm"] == pytest.approx(0.0, abs=1e-8)
