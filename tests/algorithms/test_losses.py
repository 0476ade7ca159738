"""PPO losses: hand-computed values and micro-batch invariance of losses and gradients."""

import math

import pytest
import torch

from ragen.algorithms.losses import (
    AGG_MODES,
    aggregate_loss,
    entropy_loss,
    kl_estimate,
    kl_loss,
    kl_penalties,
    policy_loss,
    value_loss,
)

D = torch.float64


def test_hand_computed_surrogate_with_clip_higher():
    # ratios 1.5, 0.5, 1.1, 0.7; advantages +1, +1, -2, -1; clip_low 0.2, clip_high 0.28
    ratio = torch.tensor([[1.5, 0.5, 1.1, 0.7]], dtype=D)
    adv = torch.tensor([[1.0, 1.0, -2.0, -1.0]], dtype=D)
    old = torch.zeros(1, 4, dtype=D)
    loss, m = policy_loss(ratio.log(), old, adv, torch.ones(1, 4), clip_low=0.2, clip_high=0.28)
    # per token max(-A r, -A clip(r)): 1.5 -> max(-1.5, -1.28) = -1.28 (clipped); 0.5 -> max(-0.5, -0.8) = -0.5;
    # 1.1 -> max(2.2, 2.2) = 2.2; 0.7 -> max(0.7, 0.8) = 0.8 (clipped)
    assert math.isclose(float(loss), (-1.28 - 0.5 + 2.2 + 0.8) / 4, rel_tol=1e-12)
    assert m["actor/pg_clipfrac"] == 0.5
    assert math.isclose(m["actor/ppo_kl"], -float(ratio.log().mean()), rel_tol=1e-12)
    assert m["actor/pg_loss"] == float(loss)


def test_dual_clip_caps_negative_advantages():
    lp = torch.tensor([[math.log(10.0), math.log(10.0)]], dtype=D)
    adv = torch.tensor([[-1.0, 1.0]], dtype=D)
    old = torch.zeros(1, 2, dtype=D)
    loss, _ = policy_loss(lp, old, adv, torch.ones(1, 2), dual_clip=3.0, agg="seq-mean-token-sum")
    # A<0: max(10, 1.2) = 10 capped at 3; A>0: max(-10, -1.2) = -1.2
    assert math.isclose(float(loss), 3.0 - 1.2, rel_tol=1e-12)
    with pytest.raises(ValueError, match="dual_clip"):
        policy_loss(lp, lp, adv, torch.ones(1, 2), dual_clip=0.5)


def test_aggregation_modes_by_hand():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [9.0, 9.0, 9.0]], dtype=D)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    assert float(aggregate_loss(x, mask, "token-mean")) == 10.0 / 4
    assert float(aggregate_loss(x, mask, "seq-mean-token-sum")) == (6.0 + 4.0) / 2  # empty rows do not count
    assert float(aggregate_loss(x, mask, "seq-mean-token-mean")) == (2.0 + 4.0) / 2
    assert float(aggregate_loss(x, mask, "token-mean", num_tokens=8.0)) == 10.0 / 8
    with pytest.raises(ValueError, match="token-mean"):
        aggregate_loss(x, mask, "mean")


@pytest.mark.parametrize("agg", AGG_MODES)
def test_gradient_is_invariant_to_micro_batch_split(agg):
    g = torch.Generator().manual_seed(0)
    B, T = 6, 7
    logits = torch.randn(B, T, generator=g, dtype=D)
    old = logits + 0.3 * torch.randn(B, T, generator=g, dtype=D)
    adv = torch.randn(B, T, generator=g, dtype=D)
    mask = (torch.rand(B, T, generator=g) < 0.6).long()
    mask[0] = 0  # an empty row
    values = torch.randn(B, T, generator=g, dtype=D)
    returns = torch.randn(B, T, generator=g, dtype=D)

    def grads(splits):
        lp = logits.clone().requires_grad_(True)
        v = values.clone().requires_grad_(True)
        n_tok, n_seq = float(mask.sum()), float((mask.sum(1) > 0).sum())
        total = 0.0
        for idx in splits:
            pl, _ = policy_loss(lp[idx], old[idx], adv[idx], mask[idx], clip_low=0.1, clip_high=0.3, dual_clip=2.0,
                                agg=agg, num_tokens=n_tok, num_seqs=n_seq)
            vl, _ = value_loss(v[idx], values[idx] + 0.1, returns[idx], mask[idx], clip=0.05, agg=agg,
                               num_tokens=n_tok, num_seqs=n_seq)
            loss = pl + vl - 0.01 * entropy_loss(lp[idx].exp(), mask[idx], agg=agg, num_tokens=n_tok, num_seqs=n_seq)
            loss.backward()
            total += float(loss.detach())
        return total, lp.grad.clone(), v.grad.clone()

    whole = grads([torch.arange(B)])
    for splits in ([torch.tensor([0, 1]), torch.tensor([2, 3, 4, 5])], [torch.tensor([i]) for i in range(B)]):
        part = grads(splits)
        assert math.isclose(part[0], whole[0], rel_tol=1e-12)
        torch.testing.assert_close(part[1], whole[1])
        torch.testing.assert_close(part[2], whole[2])
    assert float(whole[1].abs().sum()) > 0


def test_value_loss_clipping_by_hand():
    v = torch.tensor([[1.0, 0.0]], dtype=D)
    old = torch.tensor([[0.0, 0.0]], dtype=D)
    ret = torch.tensor([[1.0, 2.0]], dtype=D)
    loss, m = value_loss(v, old, ret, torch.ones(1, 2), clip=0.2)
    # token 0: plain 0, clipped (0.2 - 1)^2 = 0.64 -> 0.64; token 1: plain 4 = clipped 4 -> 4
    assert math.isclose(float(loss), 0.5 * (0.64 + 4.0) / 2, rel_tol=1e-12)
    assert m["critic/vf_clipfrac"] == 0.5
    loss, _ = value_loss(v, old, ret, torch.tensor([[1, 0]]), clip=None)  # masked to the first token
    assert float(loss) == 0.0


def test_kl_estimators():
    lp = torch.tensor([[math.log(0.5), math.log(0.2)]], dtype=D)
    ref = torch.tensor([[math.log(0.25), math.log(0.4)]], dtype=D)
    d = lp - ref
    torch.testing.assert_close(kl_estimate(lp, ref, "k1"), d)
    torch.testing.assert_close(kl_estimate(lp, ref, "k2"), 0.5 * d**2)
    k3 = kl_estimate(lp, ref, "k3")
    torch.testing.assert_close(k3, torch.tensor([[0.5 - 1 + math.log(2), 2 - 1 - math.log(2)]], dtype=D))
    assert bool((k3 >= 0).all())
    torch.testing.assert_close(kl_estimate(lp, ref, "low_var_kl"), k3)
    with pytest.raises(ValueError, match="k3"):
        kl_estimate(lp, ref, "k4")
    penalties, metrics = kl_penalties(lp, ref, torch.tensor([[1, 1]]), coef=0.1, kind="k1")
    torch.testing.assert_close(penalties, -0.1 * d)
    assert math.isclose(metrics["actor/reward_kl_penalty"], float(d.mean()), rel_tol=1e-12)
    assert math.isclose(float(kl_loss(lp, ref, torch.tensor([[1, 0]]), kind="k2")), 0.5 * float(d[0, 0]) ** 2)


@pytest.mark.parametrize("adv", [-1.0, 1.0])
def test_extreme_log_ratio_gives_a_finite_loss_and_gradient(adv):
    # float32, as the workers compute: exp(100) overflows to inf without the clamp, and inf * 0-gradient is NaN
    lp = torch.tensor([[100.0, 0.1]], requires_grad=True)
    old = torch.zeros(1, 2)
    a = torch.tensor([[adv, 1.0]])
    loss, m = policy_loss(lp, old, a, torch.ones(1, 2))
    loss.backward()
    assert math.isfinite(float(loss)) and bool(torch.isfinite(lp.grad).all())
    # the extreme token: ratio e^20 (clamped); A < 0 -> -A * e^20, A > 0 -> the clip at 1.2; no gradient through it
    extreme = -adv * math.exp(20.0) if adv < 0 else -adv * 1.2
    assert float(loss) == pytest.approx((extreme - math.exp(0.1) * 1.0) / 2, rel=1e-5)
    assert float(lp.grad[0, 0]) == 0.0 and float(lp.grad[0, 1]) == pytest.approx(-math.exp(0.1) / 2, rel=1e-5)
    assert math.isfinite(m["actor/ppo_kl"])
