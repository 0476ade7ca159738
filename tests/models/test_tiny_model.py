"""tiny_model: architecture family, parameter count, special ids, seeding, forward."""

import torch
from transformers import LlamaForCausalLM

from ragen.models import tiny_model


def test_tiny_model_parameter_count_and_ids(default_tokenizer):
    model = tiny_model(tokenizer=default_tokenizer)
    assert isinstance(model, LlamaForCausalLM)
    total = sum(p.numel() for p in model.parameters())
    embedding = model.model.embed_tokens.weight.numel()
    assert embedding == 49152 * 64
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied, counted once
    # per layer: q 64*64 + k 64*32 + v 64*32 + o 64*64 + mlp 3*64*256 + 2 norms * 64; final norm 64
    per_layer = 4096 + 2048 + 2048 + 4096 + 3 * 64 * 256 + 2 * 64
    assert total - embedding == 2 * per_layer + 64 == 123200
    for key in ("eos_token_id", "pad_token_id", "bos_token_id"):
        assert getattr(model.config, key) == getattr(model.generation_config, key)
    assert (model.config.eos_token_id, model.config.pad_token_id, model.config.bos_token_id) == (2, 0, 1)


def test_tiny_model_forward_and_seeding(default_tokenizer):
    torch.manual_seed(123)
    before = torch.rand(1).item()
    torch.manual_seed(123)
    a = tiny_model(tokenizer=default_tokenizer, seed=0)
    assert torch.rand(1).item() == before  # global RNG untouched
    b = tiny_model(tokenizer=default_tokenizer, seed=0)
    c = tiny_model(tokenizer=default_tokenizer, seed=1)
    ids = torch.tensor([[1, 200, 300, 2], [5, 6, 7, 8]])
    with torch.no_grad():
        la, lb, lc = (m(ids).logits for m in (a, b, c))
    assert la.shape == (2, 4, 49152) and torch.isfinite(la).all()
    assert torch.equal(la, lb)
    assert not torch.allclose(la, lc)


def test_tiny_model_custom_size(default_tokenizer):
    model = tiny_model(hidden_size=32, num_layers=1, num_heads=2, tokenizer=default_tokenizer)
    assert (model.config.hidden_size, model.config.num_hidden_layers, model.config.num_key_value_heads) == (32, 1, 1)
