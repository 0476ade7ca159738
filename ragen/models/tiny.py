"""A tiny random model of the default model's family, for fast tests (docs/design.md, the default model).

Same architecture as SmolLM2 (``LlamaForCausalLM``, grouped-query attention, tied embeddings) and the default
tokenizer's vocab (49152), so token ids, chat templates and special tokens behave exactly like the real model.
With the defaults it has 3,145,728 embedding parameters (49152 x 64, shared with the LM head) and 123,200
others (2 layers x 61,568 + final norm 64).
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from ragen.models.loader import DEFAULT_MODEL, load_tokenizer


def tiny_model(
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    seed: int = 0,
    tokenizer: PreTrainedTokenizerBase | None = None,
    attn_implementation: str | None = None,
) -> PreTrainedModel:
    """Build a random ``LlamaForCausalLM`` (fp32, CPU) with the vocab and special-token ids of ``tokenizer``.

    ``tokenizer`` defaults to ``load_tokenizer(DEFAULT_MODEL)``. ``seed`` fixes the weights without touching the
    global RNG state. MLP width is 4 x hidden, key/value heads are half the query heads (at least 1).
    ``attn_implementation`` as in ``load_model`` (None: ``sdpa``).
    """
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size={hidden_size} must be divisible by num_heads={num_heads}")
    tok = tokenizer if tokenizer is not None else load_tokenizer(DEFAULT_MODEL)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=max(1, num_heads // 2),
        max_position_embeddings=8192,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        attn_implementation=attn_implementation,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        setattr(model.generation_config, key, getattr(config, key))
    return model
