"""The sizes of a decoder-only transformer read from its transformers config, without weights.

:class:`ModelShape` holds what memory depends on (hidden and MLP widths, layers, query and key/value heads, head
size, vocabulary, tied output head, biases) and counts parameters part by part: the token embedding, each decoder
layer (attention with grouped key/value heads, the gated MLP's three matrices, two RMSNorms, Qwen3's per-head
query/key norms), the final norm and an output head unless it is tied to the embedding. The count equals the
``numel`` sum of the model transformers builds from the same config (tests/models/test_shape.py checks Qwen2, Qwen3
and Llama shapes on the meta device). Read by the model summary of the pre-start checks and by the memory plan
(``ragen.trainer.config.memory_plan``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# model types whose q / k / v projections carry a bias whatever the config says (transformers' Qwen2Attention)
QKV_BIAS_TYPES = ("qwen2",)
# model types with an RMSNorm over each head's queries and keys (head_dim weights each)
QK_NORM_TYPES = ("qwen3", "qwen3_moe")


@dataclass(frozen=True)
class ModelShape:
    """Sizes of a decoder-only transformer (see the module docstring).

    ``qkv_bias``: biases on the query / key / value projections; ``o_bias``: on the output projection;
    ``mlp_bias``: on the three MLP matrices; ``qk_norm``: per-head query / key RMSNorms.
    """

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False

    @property
    def attention_params(self) -> int:
        """One layer's q, k, v and o projections (and their biases / query-key norms)."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        weights = h * q + 2 * h * kv + q * h
        biases = (q + 2 * kv if self.qkv_bias else 0) + (h if self.o_bias else 0)
        return weights + biases + (2 * self.head_dim if self.qk_norm else 0)

    @property
    def mlp_params(self) -> int:
        """One layer's gate, up and down matrices (and biases)."""
        h, i = self.hidden, self.intermediate
        return 3 * h * i + ((2 * i + h) if self.mlp_bias else 0)

    @property
    def layer_params(self) -> int:
        """One decoder layer: attention + MLP + its two RMSNorms."""
        return self.attention_params + self.mlp_params + 2 * self.hidden

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def head_params(self) -> int:
        """The output head's own parameters: 0 when tied to the embedding."""
        return 0 if self.tied else self.vocab * self.hidden

    @property
    def root_params(self) -> int:
        """Everything outside the decoder layers: embedding, final norm, output head."""
        return self.embedding_params + self.hidden + self.head_params

    @property
    def params(self) -> int:
        """All parameters of the ``*ForCausalLM`` model."""
        return self.root_params + self.layers * self.layer_params

    def linear_dims(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear map of a decoder layer, by module name (LoRA's targets)."""
        h, q, kv, i = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h), "gate_proj": (h, i),
                "up_proj": (h, i), "down_proj": (i, h)}

    def lora_params(self, rank: int, targets: tuple[str, ...] | list[str]) -> int:
        """Adapter parameters of rank-``rank`` LoRA on the ``targets`` linears of every layer: r x (in + out) each
        (``ragen.workers.lora``); names that are no linear map of the layer count 0."""
        dims = self.linear_dims()
        return self.layers * sum(rank * sum(dims[t]) for t in targets if t in dims)

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """KV-cache bytes one token takes over all layers: a key and a value vector per key/value head."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


def model_shape(config: Any) -> ModelShape | None:
    """The :class:`ModelShape` of a transformers config of a decoder-only model; None when a size is missing."""
    try:
        h, layers, heads = int(config.hidden_size), int(config.num_hidden_layers), int(config.num_attention_heads)
        inter, vocab = int(config.intermediate_size), int(config.vocab_size)
    except (AttributeError, TypeError):
        return None
    kind = str(getattr(config, "model_type", ""))
    attention_bias = bool(getattr(config, "attention_bias", False))
    return ModelShape(
        hidden=h, intermediate=inter, layers=layers, heads=heads,
        kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(config, "head_dim", None) or h // heads), vocab=vocab,
        tied=bool(getattr(config, "tie_word_embeddings", False)),
        qkv_bias=attention_bias or kind in QKV_BIAS_TYPES, o_bias=attention_bias and kind not in QKV_BIAS_TYPES,
        mlp_bias=bool(getattr(config, "mlp_bias", False)), qk_norm=kind in QK_NORM_TYPES)


def tiny_shape(hidden: int, layers: int, heads: int, vocab: int) -> ModelShape:
    """The shape of ``ragen.models.tiny_model`` (MLP 4 x hidden, half as many key/value heads, tied head)."""
    return ModelShape(hidden=hidden, intermediate=4 * hidden, layers=layers, heads=heads,
                      kv_heads=max(1, heads // 2), head_dim=hidden // heads, vocab=vocab, tied=True)
