"""critic.share_backbone: a value head on the policy's backbone. Its values follow ValueModel's position convention
(``values[:, t]`` = V of the context before token t), it learns returns in the actor's joint update, and it is
saved and restored with the actor."""

from __future__ import annotations

import pytest
import torch
from factories import random_train_batch
from worker_helpers import make_lm, random_batch

from ragen.models.value_head import ValueModel
from ragen.workers import ActorConfig, LocalWorkerGroup, PolicyWorker, TrainBatch
from ragen.workers.config import SharedValueHead


def _actor(model_dir, **kw) -> LocalWorkerGroup:
    cfg = ActorConfig(lr=0.0, mini_batch_size=8, micro_batch_size=4, mixed_precision="fp32")
    return LocalWorkerGroup(PolicyWorker, model_name_or_path=model_dir, cfg=cfg,
                            value_head=SharedValueHead(**{"coef": 1.0, "clip": None, "lr": 5e-2, **kw}))


def test_values_follow_the_critic_position_convention(model_dir):
    g = _actor(model_dir)
    head = g.worker.module.value_head
    with torch.no_grad():
        head.weight.normal_(0, 1.0, generator=torch.Generator().manual_seed(0))
        head.bias.fill_(0.3)
    ids, attn, resp = random_batch(B=4, T=16, seed=2)
    batch = TrainBatch(ids, attn, resp)
    values, last = g.call("compute_values", batch)
    from transformers import AutoModelForCausalLM

    critic = ValueModel.from_causal_lm(AutoModelForCausalLM.from_pretrained(model_dir))
    critic.head.load_state_dict(head.state_dict())
    with torch.no_grad():
        ref_values, ref_last = critic(ids, attn)
    torch.testing.assert_close(values, ref_values, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(last, ref_last, atol=1e-5, rtol=1e-5)
    assert (values[:, 0] == 0).all() and (values[attn == 0] == 0).all()
    # by hand for row 1, position 5: the head on the hidden state of position 4
    lm = make_lm(seed=1)
    with torch.no_grad():
        hidden = lm.model(input_ids=ids[1:2, :5]).last_hidden_state[0, 4]
    assert float(values[1, 5]) == pytest.approx(float(hidden @ head.weight[0] + 0.3), abs=1e-4)


def test_joint_update_fits_returns_and_checkpoint_round_trips(model_dir, tmp_path):
    g = _actor(model_dir)
    ids, attn, resp = random_batch(B=8, T=16, seed=3)
    returns = torch.where(resp.bool(), torch.linspace(-1, 1, 16).expand(8, 16), 0.0)
    batch = TrainBatch(ids, attn, resp, advantages=torch.zeros(8, 16), returns=returns)
    old = g.call("compute_log_probs", batch)
    losses = []
    for _ in range(20):
        values, _ = g.call("compute_values", batch)
        m = g.call("update", batch.with_fields(old_log_probs=old, values=values))
        losses.append(m["critic/vf_loss"])
    assert losses[-1] < 0.5 * losses[0], losses
    assert m["actor/lr"] == 0.0  # the backbone's lr: only the head (lr 5e-2) moved
    torch.testing.assert_close(g.call("compute_log_probs", batch), old, atol=0, rtol=0)
    with pytest.raises(ValueError, match="values"):
        g.call("update", batch.with_fields(old_log_probs=old))
    g.call("save", dir=str(tmp_path / "ck"))
    assert (tmp_path / "ck" / "value_head.safetensors").is_file()
    fresh = _actor(model_dir)
    assert float(fresh.call("compute_values", batch)[0].abs().max()) == 0.0  # zero head before loading
    fresh.call("load", dir=str(tmp_path / "ck"))
    torch.testing.assert_close(fresh.call("compute_values", batch), g.call("compute_values", batch), atol=0, rtol=0)


def test_one_pass_log_probs_and_values_equal_the_two_passes(model_dir):
    """The trainer's old-log-prob phase takes log-probs and values from one forward when the head is shared."""
    g = _actor(model_dir)
    with torch.no_grad():
        g.worker.module.value_head.weight.normal_(0, 1.0, generator=torch.Generator().manual_seed(4))
    batch = random_train_batch(6, 16, seed=5)
    resp = batch.response_mask
    lp, values, last = g.call("compute_log_probs_and_values", batch)
    torch.testing.assert_close(lp, g.call("compute_log_probs", batch), atol=0, rtol=0)
    ref_values, ref_last = g.call("compute_values", batch)
    torch.testing.assert_close(values, ref_values, atol=0, rtol=0)
    torch.testing.assert_close(last, ref_last, atol=0, rtol=0)
    assert float(values.abs().max()) > 0 and (lp[resp == 0] == 0).all()
    plain = LocalWorkerGroup(PolicyWorker, model_name_or_path=model_dir,
                             cfg=ActorConfig(lr=0.0, mini_batch_size=8, micro_batch_size=4, mixed_precision="fp32"))
    with pytest.raises(RuntimeError, match="share_backbone"):
        plain.call("compute_log_probs_and_values", batch)


@pytest.mark.parametrize("grad", ["backbone", "head"])
def test_value_grad_reaches_the_backbone_only_when_asked(model_dir, grad):
    """critic.shared_value_grad: with zero advantages the policy loss has no gradient, so an update at a backbone lr
    > 0 moves the policy's log-probs only through the value loss: it must with ``backbone`` and must not with
    ``head`` (detached hidden states), while the head fits the returns in both."""
    cfg = ActorConfig(lr=1e-3, weight_decay=0.0, mini_batch_size=8, micro_batch_size=4, mixed_precision="fp32")
    g = LocalWorkerGroup(PolicyWorker, model_name_or_path=model_dir, cfg=cfg,
                         value_head=SharedValueHead(coef=1.0, clip=None, lr=5e-2, grad=grad))
    ids, attn, resp = random_batch(B=8, T=16, seed=6)
    returns = torch.where(resp.bool(), 1.0, 0.0)
    batch = TrainBatch(ids, attn, resp, advantages=torch.zeros(8, 16), returns=returns)
    old = g.call("compute_log_probs", batch)
    values, _ = g.call("compute_values", batch)
    first = g.call("update", batch.with_fields(old_log_probs=old, values=values))["critic/vf_loss"]
    after = g.call("update", batch.with_fields(old_log_probs=old, values=g.call("compute_values", batch)[0]))
    assert after["critic/vf_loss"] < first
    moved = float((g.call("compute_log_probs", batch) - old)[resp.bool()].abs().max())
    assert (moved > 1e-4) is (grad == "backbone"), moved
    if grad == "head":
        assert moved == 0.0


def test_unknown_value_grad_is_named():
    with pytest.raises(ValueError, match="shared_value_grad='both'"):
        SharedValueHead(grad="both")
