"""Shared fixtures for worker tests: tiny random Llama models built from a config (no downloads)."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB = 1000


def make_lm(seed: int = 0, tied: bool = True, vocab: int = VOCAB) -> LlamaForCausalLM:
    """A 2-layer, hidden-32 Llama causal LM with random weights (fp32, CPU)."""
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=tied, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForCausalLM(cfg)


def random_batch(B: int = 4, T: int = 24, seed: int = 0, vocab: int = VOCAB):
    """Right-padded ids with varied lengths; response mask on the second half of each real sequence."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (B, T), generator=g)
    lengths = torch.randint(T // 2, T + 1, (B,), generator=g)
    lengths[0] = T
    pos = torch.arange(T)[None]
    attn = (pos < lengths[:, None]).long()
    ids = ids * attn
    resp = ((pos >= lengths[:, None] // 2) & (attn > 0)).long()
    return ids, attn, resp


@pytest.fixture
def lm():
    return make_lm()


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> str:
    """A saved tiny model folder (vocab 1000, with the default tokenizer's files so ``load_model`` works):
    workers load it through the real ``model_name_or_path`` path, and it is far cheaper than the 49k vocab."""
    from ragen.models import DEFAULT_MODEL, load_tokenizer

    path = tmp_path_factory.mktemp("tiny_lm")
    make_lm(seed=1).save_pretrained(path)
    load_tokenizer(DEFAULT_MODEL).save_pretrained(path)
    return str(path)
