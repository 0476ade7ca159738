"""Chunked token log-probs / entropy must equal the naive full log-softmax, values and gradients."""

from __future__ import annotations

import pytest
import torch
from worker_helpers import make_lm, random_batch

from ragen.models.forward import is_right_padded, position_ids_from_mask
from ragen.workers.logprob import LogProbModel, token_log_probs


def naive(model, ids, attn, temperature=1.0):
    logits = model(input_ids=ids, attention_mask=attn, position_ids=position_ids_from_mask(attn)).logits.float()
    logp = torch.log_softmax(logits[:, :-1] / temperature, dim=-1)
    lp = logp.gather(-1, ids[:, 1:, None]).squeeze(-1)
    ent = -(logp.exp() * logp).sum(-1)
    valid = (attn[:, 1:] * attn[:, :-1]).float()
    zero = torch.zeros(ids.shape[0], 1)
    return torch.cat([zero, lp * valid], 1), torch.cat([zero, ent * valid], 1)


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("chunk,ckpt", [(7, True), (1000, False), (5, False)])
def test_matches_naive_values_and_grads(tied, chunk, ckpt):
    ids, attn, _ = random_batch(B=3, T=20, seed=1)
    m1, m2 = make_lm(seed=3, tied=tied), make_lm(seed=3, tied=tied)
    lp, ent = token_log_probs(m1, ids, attn, temperature=0.7, chunk_size=chunk, with_entropy=True, checkpoint=ckpt)
    ref_lp, ref_ent = naive(m2, ids, attn, temperature=0.7)
    torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=1e-5)
    assert lp[:, 0].abs().sum() == 0 and (lp[attn == 0] == 0).all()
    w = torch.randn(ids.shape, generator=torch.Generator().manual_seed(0))
    ((lp * w).sum() + 0.3 * (ent * w).sum()).backward()
    ((ref_lp * w).sum() + 0.3 * (ref_ent * w).sum()).backward()
    for (n, p1), p2 in zip(m1.named_parameters(), m2.parameters(), strict=True):
        torch.testing.assert_close(p1.grad, p2.grad, atol=1e-5, rtol=1e-4, msg=n)


def test_target_mask_and_no_entropy():
    ids, attn, resp = random_batch(B=4, T=16, seed=2)
    m = make_lm()
    full, none_ent = token_log_probs(m, ids, attn, chunk_size=4)
    part, _ = token_log_probs(m, ids, attn, chunk_size=4, target_mask=resp)
    assert none_ent is None
    sel = resp.bool()
    sel[:, 0] = False
    torch.testing.assert_close(part[sel], full[sel])
    assert (part[~sel] == 0).all() and (full[sel] != 0).all()


def test_left_padding_equals_right_padding():
    m = make_lm()
    ids = torch.tensor([[5, 6, 7, 8, 0, 0]])
    left = torch.tensor([[0, 0, 5, 6, 7, 8]])
    lp_r, _ = token_log_probs(m, ids, torch.tensor([[1, 1, 1, 1, 0, 0]]))
    lp_l, _ = token_log_probs(m, left, torch.tensor([[0, 0, 1, 1, 1, 1]]))
    assert is_right_padded(torch.tensor([[1, 1, 0]])) and not is_right_padded(torch.tensor([[0, 1, 1]]))
    torch.testing.assert_close(lp_r[:, 1:4], lp_l[:, 3:6], atol=1e-5, rtol=1e-5)
    assert lp_l[0, 2] == 0  # first real token has no real predecessor


def test_wrapper_forward_matches_function():
    ids, attn, _ = random_batch(B=2, T=10, seed=4)
    m = make_lm()
    a, _ = LogProbModel(m)(ids, attn, chunk_size=3)
    b, _ = token_log_probs(m, ids, attn)
    torch.testing.assert_close(a, b)


def test_empty_selection_still_backpropagates():
    """A micro-batch without response tokens must still produce a graph (FSDP ranks backward in lockstep)."""
    ids, attn, _ = random_batch(B=2, T=8)
    m = make_lm()
    lp, ent = token_log_probs(m, ids, attn, target_mask=torch.zeros_like(attn), with_entropy=True)
    assert (lp == 0).all() and (ent == 0).all() and lp.requires_grad
    (lp.sum() + ent.sum()).backward()
    assert all(p.grad is not None and (p.grad == 0).all() for p in m.parameters())
