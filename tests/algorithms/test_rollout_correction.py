"""Rollout correction (``ragen.algorithms.rollout_correction``): hand-computed weights and metrics of every mode, the
weighted policy loss, and a Monte-Carlo check that the corrected gradient is the on-policy one."""

from __future__ import annotations

import math

import pytest
import torch

from ragen.algorithms.losses import policy_loss
from ragen.algorithms.rollout_correction import keys_read, rollout_correction_weights

D = torch.float64


def _close(x: torch.Tensor, expected: list) -> bool:
    return torch.allclose(x.double(), torch.tensor(expected, dtype=D), rtol=1e-6, atol=1e-7)


def _logs(ratios: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(old, engine) log-probs whose token ratios pi_old / mu are ``ratios``."""
    r = torch.tensor(ratios, dtype=D)
    engine = torch.full_like(r, -1.0)
    return engine + r.log(), engine


def test_token_tis_truncates_each_ratio_at_clip():
    old, engine = _logs([[0.5, 1.0, 3.0, 1.5]])
    mask = torch.tensor([[1, 1, 1, 0]])
    w, m = rollout_correction_weights(old, engine, mask, mode="token_tis", clip=2.0)
    assert _close(w, [[0.5, 1.0, 2.0, 0.0]])  # 0 off the mask
    assert not w.requires_grad and w.dtype == torch.float32
    assert m["rollout_correction/ratio_mean"] == pytest.approx((0.5 + 1.0 + 3.0) / 3)
    assert m["rollout_correction/ratio_max"] == pytest.approx(3.0)
    assert m["rollout_correction/ratio_min"] == pytest.approx(0.5)
    assert m["rollout_correction/weight_mean"] == pytest.approx(3.5 / 3)
    assert m["rollout_correction/clipped_frac"] == pytest.approx(1 / 3)


def test_token_mask_drops_tokens_outside_the_band():
    old, engine = _logs([[0.4, 1.0, 2.5], [1.9, 0.55, 1.99]])
    w, m = rollout_correction_weights(old, engine, torch.ones(2, 3), mode="token_mask", low=0.5, high=2.0)
    assert w.tolist() == [[0.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
    assert m["rollout_correction/masked_frac"] == pytest.approx(2 / 6)
    assert m["rollout_correction/weight_mean"] == pytest.approx(4 / 6)


def test_sequence_ratio_spans_the_rows_of_an_episode():
    # rows 0 and 1 are two turns of episode 7 (model tokens 2, 0.5, 4), row 2 is episode 3 (token 1.5)
    old, engine = _logs([[2.0, 0.5, 9.0], [4.0, 9.0, 9.0], [1.5, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 0, 0]])
    seq = torch.tensor([7, 7, 3])
    prod, m = rollout_correction_weights(old, engine, mask, mode="seq_tis", clip=3.0, seq_agg="product", seq_ids=seq)
    # episode 7: 2 * 0.5 * 4 = 4 -> truncated to 3 on its three tokens; episode 3: 1.5
    assert _close(prod, [[3.0, 3.0, 0.0], [3.0, 0.0, 0.0], [1.5, 0.0, 0.0]])
    assert m["rollout_correction/ratio_max"] == pytest.approx(4.0)  # each sequence once: 4 and 1.5
    assert m["rollout_correction/ratio_mean"] == pytest.approx(2.75)
    assert m["rollout_correction/clipped_frac"] == pytest.approx(3 / 4)
    geo, _ = rollout_correction_weights(old, engine, mask, mode="seq_tis", clip=3.0, seq_ids=seq)
    g = 4.0 ** (1 / 3)  # the geometric mean of 2, 0.5, 4
    assert _close(geo, [[g, g, 0.0], [g, 0.0, 0.0], [1.5, 0.0, 0.0]])
    own, _ = rollout_correction_weights(old, engine, mask, mode="seq_tis", clip=3.0, seq_agg="product")
    assert own[:, 0].tolist() == pytest.approx([1.0, 3.0, 1.5])  # without seq_ids each row is its own sequence


def test_seq_mask_drops_whole_episodes():
    old, engine = _logs([[2.0, 1.5], [1.0, 1.0], [0.9, 0.8]])
    seq = torch.tensor([0, 1, 1])
    w, m = rollout_correction_weights(old, engine, torch.ones(3, 2), mode="seq_mask", low=0.5, high=2.0,
                                      seq_agg="product", seq_ids=seq)
    # episode 0: 3.0 -> dropped; episode 1: 0.72 -> kept
    assert w.tolist() == [[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]
    assert m["rollout_correction/masked_frac"] == pytest.approx(2 / 6)
    geo, _ = rollout_correction_weights(old, engine, torch.ones(3, 2), mode="seq_mask", low=0.5, high=2.0,
                                        seq_ids=seq)
    assert geo.tolist() == [[1.0, 1.0], [1.0, 1.0], [1.0, 1.0]]  # sqrt(3) = 1.73 is inside the band


def test_none_mode_and_keys_each_mode_reads():
    old, engine = _logs([[3.0]])
    assert rollout_correction_weights(old, engine, torch.ones(1, 1), mode="none") == (None, {})
    with pytest.raises(ValueError, match="mode"):
        rollout_correction_weights(old, engine, torch.ones(1, 1), mode="tis")
    assert keys_read("none") == () and keys_read("token_tis") == ("clip",)
    assert keys_read("token_mask") == ("low", "high") and keys_read("seq_tis") == ("clip", "seq_agg")
    assert keys_read("seq_mask") == ("low", "high", "seq_agg")


def test_weights_multiply_the_per_token_policy_loss():
    # ratio 1 (log_probs = old): per token loss -A; weights 0.5, 2, 0 -> token-mean (-0.5*1 - 2*(-2) - 0*3) / 3
    lp = torch.zeros(1, 3, dtype=D, requires_grad=True)
    adv = torch.tensor([[1.0, -2.0, 3.0]], dtype=D)
    w = torch.tensor([[0.5, 2.0, 0.0]])
    loss, m = policy_loss(lp, lp.detach(), adv, torch.ones(1, 3), is_weights=w)
    assert float(loss.detach()) == pytest.approx((-0.5 + 4.0 + 0.0) / 3)
    loss.backward()
    assert _close(lp.grad, [[-0.5 / 3, 4.0 / 3, 0.0]])  # d/d lp of -w A r at r = 1
    plain, _ = policy_loss(lp, lp.detach(), adv, torch.ones(1, 3))
    assert float(plain.detach()) == pytest.approx((-1.0 + 2.0 - 3.0) / 3) and m["actor/pg_clipfrac"] == 0.0


# ---------------------------------------------------------------------------------------------- Monte Carlo
# A categorical policy pi = softmax(theta) (the trainer) sampled by an engine at temperature 2, mu = softmax(theta / 2),
# which reports log mu (the log-probs of the distribution it sampled from). The on-policy gradient of E_pi[A] is
# g*_j = pi_j (A_j - E_pi[A]). The estimate is the negated gradient of the library's policy loss at ratio 1, with and
# without the rollout-correction weights, from BATCHES batch means of BATCH samples each; the test asks for every
# component inside (corrected) or some component far outside (uncorrected) the simultaneous 99.9% confidence interval
# mean +- Z * se (Bonferroni over the 4 components: two-sided 99.975% each, Z = 3.48; se = std / sqrt(BATCHES)).
THETA = torch.tensor([1.0, 0.0, -0.5, 0.5], dtype=D)
ADV = torch.tensor([1.0, -0.5, 2.0, -1.0], dtype=D)
ENGINE_T, BATCHES, BATCH, Z = 2.0, 200, 500, 3.48


def _on_policy_gradient() -> torch.Tensor:
    pi = THETA.softmax(0)
    return pi * (ADV - (pi * ADV).sum())


def _batch_gradients(mode: str, tokens: int, seq_agg: str = "product", seed: int = 0) -> torch.Tensor:
    """(BATCHES, 4) gradient estimates: each from BATCH rows of ``tokens`` engine-sampled actions (one sequence per
    row, each token's advantage its action's A), token-mean policy loss with the ``mode`` weights (clip 100: never
    binding here, the largest token ratio is 1.3)."""
    g = torch.Generator().manual_seed(seed)
    log_mu = torch.log_softmax(THETA / ENGINE_T, 0)
    out = []
    for _ in range(BATCHES):
        actions = torch.multinomial(log_mu.exp(), BATCH * tokens, replacement=True, generator=g).view(BATCH, tokens)
        theta = THETA.clone().requires_grad_(True)
        lp = torch.log_softmax(theta, 0)[actions]
        mask = torch.ones(BATCH, tokens)
        w, _ = rollout_correction_weights(lp.detach(), log_mu[actions], mask, mode=mode, clip=100.0, seq_agg=seq_agg)
        loss, _ = policy_loss(lp, lp.detach(), ADV[actions], mask, is_weights=w)
        (grad,) = torch.autograd.grad(-loss, theta)
        out.append(grad)
    return torch.stack(out)


def _z_scores(estimates: torch.Tensor) -> torch.Tensor:
    se = estimates.std(dim=0) / math.sqrt(BATCHES)
    return (estimates.mean(dim=0) - _on_policy_gradient()) / se


@pytest.mark.parametrize(("mode", "tokens"), [("token_tis", 1), ("seq_tis", 2)])
def test_corrected_gradient_is_the_on_policy_gradient(mode, tokens):
    corrected = _z_scores(_batch_gradients(mode, tokens))
    assert corrected.abs().max() < Z, corrected
    uncorrected = _z_scores(_batch_gradients("none", tokens))
    assert uncorrected.abs().max() > 5 * Z, uncorrected  # the engine's own gradient: ~0.11 off in two components
