"""ValueModel: shapes, zero-initialised head, padding, save/load round trip."""

from __future__ import annotations

import torch
from transformers import AutoModel
from worker_helpers import make_lm, random_batch

from ragen.models.value_head import ValueModel


def test_shapes_zero_init_and_padding():
    lm = make_lm(seed=2)
    vm = ValueModel.from_causal_lm(lm)
    assert vm.backbone is lm.model
    ids, attn, _ = random_batch(B=3, T=12)
    v, last = vm(ids, attn)
    assert v.shape == (3, 12) and v.dtype == torch.float32 and (v == 0).all()
    assert last.shape == (3,) and (last == 0).all()
    with torch.no_grad():
        vm.head.weight.normal_()
        vm.head.bias.fill_(0.5)
    v, last = vm(ids, attn)
    prev_real = torch.nn.functional.pad(attn[:, :-1], (1, 0))  # the position before t is a real token
    assert (v[(attn * prev_real) == 0] == 0).all() and (v[(attn * prev_real) == 1] != 0).all()
    hidden = lm.model(input_ids=ids).last_hidden_state  # right padding: real positions match the unmasked run
    ref = hidden @ vm.head.weight[0] + 0.5  # the head after reading token t
    shifted = (attn * prev_real) == 1
    torch.testing.assert_close(v[:, 1:][shifted[:, 1:]], ref[:, :-1][shifted[:, 1:]], atol=1e-5, rtol=1e-5)
    n = attn.sum(dim=1)
    torch.testing.assert_close(last, ref[torch.arange(3), n - 1], atol=1e-5, rtol=1e-5)


def test_save_load_round_trip(tmp_path):
    vm = ValueModel.from_causal_lm(make_lm(seed=3), head_init_std=0.1)
    assert vm.head.weight.abs().sum() > 0
    vm.save(tmp_path)
    loaded = ValueModel.load(tmp_path)
    ids, attn, _ = random_batch(B=2, T=10, seed=1)
    for got, want in zip(loaded(ids, attn), vm(ids, attn), strict=True):
        torch.testing.assert_close(got, want)
    backbone = AutoModel.from_pretrained(tmp_path)
    torch.testing.assert_close(backbone.embed_tokens.weight, vm.backbone.embed_tokens.weight)
