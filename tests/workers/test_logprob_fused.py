"""The fused lm_head chunk (``_HeadChunk``): its closed-form backward must equal autograd through a full log-softmax,
keep no (N, V) tensor for backward under ``checkpoint``, and leave heads it cannot read to the generic path."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from worker_helpers import make_lm, random_batch

from ragen.workers.logprob import _HeadChunk, log_probs_from_hidden, token_log_probs
from ragen.workers.lora import add_lora

V, H = 50, 16


class Toy(nn.Module):
    """Embedding -> mixing matrix -> lm_head, with the head's weight optionally tied to the embedding (its gradient
    then has two sources)."""

    def __init__(self, tied: bool, bias: bool, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.emb = nn.Embedding(V, H)
        self.mix = nn.Parameter(torch.randn(H, H, generator=g) / H ** 0.5)
        self.head = nn.Linear(H, V, bias=bias)
        with torch.no_grad():
            self.emb.weight.copy_(torch.randn(V, H, generator=g))
            self.head.weight.copy_(torch.randn(V, H, generator=g) / 2)
            if bias:
                self.head.bias.copy_(torch.randn(V, generator=g))
        if tied:
            self.head.weight = self.emb.weight

    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.emb(ids) @ self.mix)


def reference(toy: Toy, ids: torch.Tensor, mask: torch.Tensor, temperature: float):
    """Full (B, T-1, V) logits, log_softmax + gather, entropy from softmax; zeros where not predicted."""
    logp = torch.log_softmax(toy.head(toy.hidden(ids)[:, :-1]).float() / temperature, dim=-1)
    lp = logp.gather(-1, ids[:, 1:, None]).squeeze(-1)
    ent = -(logp.exp() * logp).sum(-1)
    sel = mask[:, 1:].float()
    zero = torch.zeros(ids.shape[0], 1)
    return torch.cat([zero, lp * sel], 1), torch.cat([zero, ent * sel], 1)


def batch(seed: int = 0, B: int = 3, T: int = 20):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (B, T), generator=g)
    mask = (torch.rand(B, T, generator=g) < 0.8).long()
    return ids, mask


def run(toy: Toy, ids, mask, temperature, with_entropy, checkpoint, fused=True, chunk=7):
    lp, ent = log_probs_from_hidden(toy.head, toy.hidden(ids), ids, mask, temperature=temperature, chunk_size=chunk,
                                    with_entropy=with_entropy, checkpoint=checkpoint, fused=fused)
    w = torch.randn(ids.shape, generator=torch.Generator().manual_seed(5)).to(ids.device)
    loss = (lp * w).sum() + (0.3 * (ent * w.flip(0)).sum() if with_entropy else 0.0)
    toy.zero_grad()
    loss.backward()
    return lp.detach(), None if ent is None else ent.detach(), {n: p.grad.clone() for n, p in toy.named_parameters()}


def assert_near(a: torch.Tensor, b: torch.Tensor, rel: float, what: str) -> None:
    """max |a - b| <= rel * max |b|: float rounding of sums over many tokens, relative to the tensor's scale."""
    err, scale = (a - b).abs().max().item(), b.abs().max().item()
    assert err <= rel * scale, f"{what}: max error {err:.3g} > {rel} * {scale:.3g}"


def sel_mask(mask: torch.Tensor) -> torch.Tensor:
    m = mask.clone()
    m[:, 0] = 0
    return m


@pytest.mark.parametrize("tied,bias", [(True, False), (False, False), (False, True)])
@pytest.mark.parametrize("with_entropy", [True, False])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("checkpoint", [True, False])
def test_values_and_grads_match_full_log_softmax(tied, bias, with_entropy, temperature, checkpoint):
    ids, mask = batch()
    toy = Toy(tied, bias)
    lp, ent, grads = run(toy, ids, mask, temperature, with_entropy, checkpoint)
    ref_lp, ref_ent = reference(toy, ids, sel_mask(mask), temperature)
    w = torch.randn(ids.shape, generator=torch.Generator().manual_seed(5))
    loss = (ref_lp * w).sum() + (0.3 * (ref_ent * w.flip(0)).sum() if with_entropy else 0.0)
    toy.zero_grad()
    loss.backward()
    torch.testing.assert_close(lp, ref_lp.detach(), rtol=1e-6, atol=1e-6)
    if with_entropy:
        torch.testing.assert_close(ent, ref_ent.detach(), rtol=1e-5, atol=1e-5)  # lse - sum p z cancels
    assert set(grads) == {n for n, _ in toy.named_parameters()}
    for n, p in toy.named_parameters():
        assert_near(grads[n], p.grad, 1e-6, n)
        assert grads[n].abs().max() > 1e-3, n  # every parameter is reached


@pytest.mark.parametrize("with_entropy", [True, False])
def test_checkpoint_is_a_memory_knob_with_identical_numbers(with_entropy):
    """``checkpoint`` True and False: values and gradients bitwise equal; the forward also equals the generic path
    (autograd through head(h)) bitwise, op for op."""
    ids, mask = batch(seed=2)
    toy = Toy(tied=True, bias=False)
    a = run(toy, ids, mask, 0.7, with_entropy, checkpoint=True)
    b = run(toy, ids, mask, 0.7, with_entropy, checkpoint=False)
    g = run(toy, ids, mask, 0.7, with_entropy, checkpoint=True, fused=False)
    assert torch.equal(a[0], b[0]) and torch.equal(a[0], g[0])
    if with_entropy:
        assert torch.equal(a[1], b[1]) and torch.equal(a[1], g[1])
    for n in a[2]:
        assert torch.equal(a[2][n], b[2][n]), n
        assert_near(a[2][n], g[2][n], 1e-6, n)


@pytest.mark.parametrize("keep_logits", [True, False])
@pytest.mark.parametrize("inv_temp,with_entropy", [(1.0, True), (1 / 0.7, True), (1 / 0.7, False)])
def test_gradcheck_float64(keep_logits, inv_temp, with_entropy):
    g = torch.Generator().manual_seed(1)
    h = torch.randn(5, 4, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(7, 4, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(7, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.tensor([0, 6, 3, 3, 1])

    def f(h, w, b):
        return _HeadChunk.apply(h, w, b, t, inv_temp, with_entropy, keep_logits)

    assert torch.autograd.gradcheck(f, (h, w, b))


def test_empty_selection_reaches_every_parameter_with_zeros():
    ids, mask = batch()
    toy = Toy(tied=False, bias=True)
    lp, ent, grads = run(toy, ids, torch.zeros_like(mask), 1.0, True, checkpoint=True)
    assert (lp == 0).all() and (ent == 0).all()
    assert all((g == 0).all() for g in grads.values()) and set(grads) == {n for n, _ in toy.named_parameters()}


def saved_logit_tensors(toy: Toy, ids, mask, checkpoint: bool) -> list[tuple[int, ...]]:
    """Shapes of the tensors autograd keeps for backward whose last dim is the vocabulary."""
    shapes = []

    def pack(t):
        if t.dim() and t.shape[-1] == V:
            shapes.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        log_probs_from_hidden(toy.head, toy.hidden(ids), ids, mask, chunk_size=7, with_entropy=True,
                              checkpoint=checkpoint)
    return shapes


def test_graph_keeps_at_most_one_chunk_of_logits():
    """With ``checkpoint`` nothing (N, V) is kept for backward; without it exactly one (n, V) tensor per chunk, its
    logits (autograd through log-softmax, gather and softmax would keep several)."""
    ids, mask = batch()
    toy = Toy(tied=True, bias=False)
    n = int(sel_mask(mask).sum())
    assert saved_logit_tensors(toy, ids, mask, checkpoint=True) == []
    kept = saved_logit_tensors(toy, ids, mask, checkpoint=False)
    assert kept == [(min(7, n - s), V) for s in range(0, n, 7)]


def test_bf16_autocast_matches_generic_path():
    """Under CPU bf16 autocast the logits are computed in bf16 (as head(h) would) and upcast: the forward equals the
    generic path bitwise, gradients within bf16 rounding, and parameter gradients keep the parameter's dtype."""
    ids, mask = batch(seed=3, T=40)
    toy = Toy(tied=True, bias=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a = run(toy, ids, mask, 0.7, True, checkpoint=True)
        g = run(toy, ids, mask, 0.7, True, checkpoint=True, fused=False)
    r = run(toy, ids, mask, 0.7, True, checkpoint=True)  # fp32
    assert torch.equal(a[0], g[0]) and torch.equal(a[1], g[1])
    assert not torch.equal(a[0], r[0])  # bf16 logits indeed
    torch.testing.assert_close(a[0], r[0], rtol=0.05, atol=0.05)
    for n in a[2]:
        assert a[2][n].dtype == torch.float32
        assert_near(a[2][n], g[2][n], 1e-2, n)
        assert_near(a[2][n], r[2][n], 3e-2, n)


def test_bf16_weights_match_generic_path():
    """bf16 parameters and hidden states without autocast (as FSDP2's mixed-precision policy computes): the same
    forward bits as the generic path, bf16 gradients within bf16 rounding of its."""
    ids, mask = batch(seed=3, T=40)
    toy = Toy(tied=True, bias=False).to(torch.bfloat16)
    a = run(toy, ids, mask, 0.7, True, checkpoint=True)
    b = run(toy, ids, mask, 0.7, True, checkpoint=False)
    g = run(toy, ids, mask, 0.7, True, checkpoint=True, fused=False)
    assert torch.equal(a[0], g[0]) and torch.equal(a[1], g[1]) and a[0].dtype == torch.float32
    for n in a[2]:
        assert a[2][n].dtype == torch.bfloat16 and torch.equal(a[2][n], b[2][n]), n
        assert_near(a[2][n].float(), g[2][n].float(), 2e-2, n)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_device_twin_fused_equals_generic(device, dtype):
    """On the device (CUDA twin under the ``gpu`` marker): forward bits equal the generic path's, ``checkpoint``
    True / False give equal gradients, gradients near the generic path's (fp32: rounding; bf16 autocast: bf16)."""
    ids, mask = (t.to(device) for t in batch(seed=7, T=40))
    toy = Toy(tied=True, bias=False).to(device)
    with torch.autocast(device, dtype=torch.bfloat16, enabled=dtype == "bf16"):
        a = run(toy, ids, mask, 0.7, True, checkpoint=True)
        b = run(toy, ids, mask, 0.7, True, checkpoint=False)
        g = run(toy, ids, mask, 0.7, True, checkpoint=True, fused=False)
    assert torch.equal(a[0], g[0]) and torch.equal(a[1], g[1])
    for n in a[2]:
        assert torch.equal(a[2][n], b[2][n]), n
        assert_near(a[2][n], g[2][n], 1e-5 if dtype == "fp32" else 1e-2, n)


def test_hooked_or_wrapped_heads_take_the_generic_path():
    """A head with a forward hook or a subclass of nn.Linear is called, not read: its own forward counts."""
    ids, mask = batch(seed=4)
    toy = Toy(tied=False, bias=False)
    plain = run(toy, ids, mask, 1.0, False, checkpoint=True)[0]
    doubled = run(toy, ids, mask, 0.5, False, checkpoint=True)[0]  # logits / 0.5
    toy.head.register_forward_hook(lambda m, i, out: 2 * out)
    hooked = run(toy, ids, mask, 1.0, False, checkpoint=True)[0]
    torch.testing.assert_close(hooked, doubled)
    assert not torch.allclose(hooked, plain)

    class Halved(nn.Linear):
        def forward(self, x):
            return super().forward(x) / 2

    wrapped = Halved(H, V, bias=False)
    wrapped.weight = toy.head.weight
    toy.head = wrapped
    halved = run(toy, ids, mask, 1.0, False, checkpoint=True)[0]
    torch.testing.assert_close(halved, run(Toy(tied=False, bias=False), ids, mask, 2.0, False, True)[0])


def test_lora_lm_head_gets_gradients_through_the_generic_path():
    """lm_head as a LoRA target (peft wraps it): the adapter must be in the forward and receive gradients."""
    ids, attn, _ = random_batch(B=2, T=12, seed=6)
    lm = add_lora(make_lm(seed=1, tied=False), rank=2, alpha=4.0, target_modules=["lm_head"])
    with torch.no_grad():
        for n, p in lm.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(0))
    lp, _ = token_log_probs(lm, ids, attn, chunk_size=5)
    logits = lm(input_ids=ids, attention_mask=attn).logits.float()
    ref = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    valid = (attn[:, 1:] * attn[:, :-1]).bool()
    torch.testing.assert_close(lp[:, 1:][valid], ref[valid], rtol=1e-5, atol=1e-5)
    lp.sum().backward()
    lora_grads = [p.grad for n, p in lm.named_parameters() if "lora_" in n]
    assert lora_grads and all(g is not None and g.abs().max() > 0 for g in lora_grads)
