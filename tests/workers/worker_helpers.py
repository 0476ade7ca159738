"""Helpers of the worker tests: tiny random Llama models built from a config (no downloads) and random batches.

Imported as ``from worker_helpers import ...`` (pytest puts this folder on ``sys.path``); fixtures live in
conftest.py.
"""

from __future__ import annotations

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
