"""GPU twin of the packing checks: variable-length attention against sdpa in bf16 (``device`` fixture: ``cpu`` every
run, ``cuda`` under the ``gpu`` marker).

On ``cuda`` the policy and the critic run with ``flash_attention_2`` (position-id packing: the rows concatenated
without padding, flash-attn's varlen kernel) and with ``sdpa`` (the 4D-mask packing of the rows' shared prompt); on
``cpu``, where flash-attn does not run, the same position-id layout runs under ``sdpa`` with the mask transformers
builds from the positions. Both sides compute in bf16 autocast over fp32 weights, as the workers do, on the same
micro-batch (two episode groups, ragged responses, right padding).

Bound: log-probs, entropy and values within 0.05 + |x| / 64 of the sdpa side at every real position (x: the sdpa
side's number). bf16 keeps 8 significant bits: a number is stored to within 2^-8 of itself relative, and the values
(|x| up to ~14 from a random head) come out of a bf16 matmul with a spacing of 2^-7 |x| (0.0625 at 14), so |x| / 64
is two such steps; the two sides otherwise round attention scores, softmax and the packed sums in different orders,
through 2 layers to log-probs of ~7 (vocab 1000): measured on CPU (position-id vs 4D-mask packing, both sdpa, bf16
autocast) 2e-3 on log-probs, 5e-5 on entropy, 0.0625 on values. Each side also stays within 0.1 + |x| / 64 of the
fp32 sdpa result (the bf16 log-prob bound of tests/workers/test_gpu_workers.py).
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import ragen.models.forward as forward_mod
import ragen.models.packing as packing
from ragen.models.attention import FLASH_INSTALL, flash_attn_installed
from ragen.models.value_head import ValueModel
from ragen.workers.logprob import token_log_probs

BF16_PAIR_ATOL = 0.05  # varlen side vs sdpa side, both bf16, plus BF16_RTOL * |x|
BF16_FP32_ATOL = 0.1  # either bf16 side vs fp32 sdpa, plus BF16_RTOL * |x|
BF16_RTOL = 2.0 ** -6


def _models(device: str, attn: str) -> tuple[LlamaForCausalLM, ValueModel]:
    """A 2-layer Llama (hidden 128, 4 heads of 32: a head size flash-attn takes) and a critic on another one, fp32."""
    cfg = LlamaConfig(vocab_size=1000, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, pad_token_id=0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        lm = LlamaForCausalLM(cfg)
        critic = ValueModel(LlamaForCausalLM(cfg).model, head_init_std=0.5)
    lm, critic = lm.to(device), critic.to(device)
    if attn != "sdpa":
        lm.set_attn_implementation(attn)
        critic.backbone.set_attn_implementation(attn)
    return lm, critic


def _batch(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    system = torch.randint(3, 1000, (24,), generator=g).tolist()
    prompts = [system + torch.randint(3, 1000, (40,), generator=g).tolist() for _ in range(2)]
    lengths = [(5, 60, 33), (1, 90, 17)]
    rows = [p + torch.randint(3, 1000, (n,), generator=g).tolist() for p, ns in zip(prompts, lengths, strict=True)
            for n in ns]
    T = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r)
        mask[i, :len(r)] = 1
    return ids.to(device), mask.to(device)


def _run(lm, critic, ids, mask, device: str, bf16: bool) -> list[torch.Tensor]:
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=bf16)
    with torch.no_grad(), autocast:
        lp, ent = token_log_probs(lm, ids, mask, with_entropy=True)
        values, last = critic(ids, mask)
    return [t.float().cpu() for t in (lp, ent, values, last)]


def test_varlen_attention_matches_sdpa_in_bf16(device, monkeypatch):
    if device == "cuda" and not flash_attn_installed():
        pytest.skip(f"flash_attn is not installed: {FLASH_INSTALL}")
    ids, mask = _batch(device)
    sdpa_lm, sdpa_critic = _models(device, "sdpa")
    fp32 = _run(sdpa_lm, sdpa_critic, ids, mask, device, bf16=False)
    plans = []
    real_plan = forward_mod.plan_packing
    monkeypatch.setattr(forward_mod, "plan_packing", lambda *a: plans.append(real_plan(*a)) or plans[-1])
    reference = _run(sdpa_lm, sdpa_critic, ids, mask, device, bf16=True)
    assert all(p is not None and p.mask is not None for p in plans)  # sdpa: the 4D-mask packing ran
    if device == "cuda":
        lm, critic = _models(device, "flash_attention_2")
    else:
        lm, critic = sdpa_lm, sdpa_critic
        monkeypatch.setitem(packing.PACKING_BY_ATTENTION, "sdpa", packing.POSITION_IDS)
    varlen = _run(lm, critic, ids, mask, device, bf16=True)
    assert len(plans) == 4 and all(p is not None and p.mask is None for p in plans[2:])  # position-id packing ran
    real = mask.cpu().bool()
    for name, ref, got, exact in zip(("log-probs", "entropy", "values", "last values"), reference, varlen, fp32,
                                     strict=True):
        pick = (lambda t: t[real]) if ref.dim() == 2 else (lambda t: t)
        ref, got, exact = pick(ref), pick(got), pick(exact)
        torch.testing.assert_close(got, ref, atol=BF16_PAIR_ATOL, rtol=BF16_RTOL,
                                   msg=lambda m, name=name: f"{name}, varlen vs sdpa in bf16 on {device}: {m}")
        for side, out in (("sdpa", ref), ("varlen", got)):
            torch.testing.assert_close(
                out, exact, atol=BF16_FP32_ATOL, rtol=BF16_RTOL,
                msg=lambda m, name=name, side=side: f"{name}, bf16 {side} vs fp32 on {device}: {m}")
            assert float((out - exact).abs().max()) > 0  # the side did compute in bf16
