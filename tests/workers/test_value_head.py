"""ValueModel: shapes, zero-initialised head, padding, save/load round trip."""

from __future__ import annotations

import torch
from transformers import AutoModel

from ragen.models.value_head import ValueModel
from tests.workers.conftest import make_lm, random_batch


def test_shapes_zero_init_and_padding():
    lm = make_lm(seed=2)
    vm = ValueModel.from_causal_lm(lm)
    assert vm.backbone is lm.model
    ids, attn, _ = random_batch(B=3, T=12)
    v = vm(ids, attn)
    assert v.shape == (3, 12) and v.dtype == torch.float32 and (v == 0).all()
    with torch.no_grad():
        vm.head.weight.normal_()
        vm.head.bias.fill_(0.5)
    v = vm(ids, attn)
    assert (v[attn == 0] == 0).all() and (v[attn == 1] != 0).all()
    hidden = lm.model(input_ids=ids).last_hidden_state  # right padding: real positions match the unmasked run
    ref = hidden @ vm.head.weight[0] + 0.5
    torch.testing.assert_close(v[attn == 1], ref[attn == 1], atol=1e-5, rtol=1e-5)


def test_save_load_round_trip(tmp_path):
    vm = ValueModel.from_causal_lm(make_lm(seed=3), head_init_std=0.1)
    assert vm.head.weight.abs().sum() > 0
    vm.save(tmp_path)
    loaded = ValueModel.load(tmp_path)
    ids, attn, _ = random_batch(B=2, T=10, seed=1)
    torch.testing.assert_close(loaded(ids, attn), vm(ids, attn))
    backbone = AutoModel.from_pretrained(tmp_path)
    torch.testing.assert_close(backbone.embed_tokens.weight, vm.backbone.embed_tokens.weight)
