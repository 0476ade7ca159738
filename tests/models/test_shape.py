"""``ragen.models.shape``: parameter counts from a config equal the real model's, part by part."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from ragen.models.shape import model_shape, tiny_shape

MODELS = Path(__file__).resolve().parents[1] / "data" / "models"
# (model type, sizes) of other families at small sizes, with every bias / norm option the count distinguishes
SMALL = [
    ("llama", {"hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 3, "num_attention_heads": 8,
               "num_key_value_heads": 2, "vocab_size": 1000, "tie_word_embeddings": False}),
    ("llama", {"hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2, "num_attention_heads": 4,
               "num_key_value_heads": 4, "vocab_size": 999, "tie_word_embeddings": True, "attention_bias": True,
               "mlp_bias": True, "head_dim": 32}),
    ("qwen2", {"hidden_size": 96, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 6,
               "num_key_value_heads": 2, "vocab_size": 1234, "tie_word_embeddings": True}),
    ("qwen3", {"hidden_size": 64, "intermediate_size": 192, "num_hidden_layers": 2, "num_attention_heads": 4,
               "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 777, "tie_word_embeddings": False}),
]


def _numel(config) -> int:
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())  # a tied head is one parameter


@pytest.mark.parametrize("name", ["Qwen2.5-0.5B-Instruct", "Qwen2.5-3B-Instruct", "Qwen2.5-7B-Instruct"])
def test_qwen25_counts_equal_the_model_built_from_the_vendored_config(name):
    """Qwen2.5's q / k / v biases, grouped key/value heads, tied (0.5B, 3B) or untied (7B) head: the count is the
    meta-device model's numel; the published sizes (0.49B, 3.09B, 7.62B)."""
    config = AutoConfig.from_pretrained(MODELS / name)
    shape = model_shape(config)
    assert shape.params == _numel(config)
    assert round(shape.params / 1e9, 2) == {"Qwen2.5-0.5B-Instruct": 0.49, "Qwen2.5-3B-Instruct": 3.09,
                                            "Qwen2.5-7B-Instruct": 7.62}[name]


def test_qwen25_7b_by_hand():
    """7B: embedding 152064 x 3584, per layer q 3584x3584 + 3584, k and v 3584x512 + 512, o 3584x3584, MLP
    3 x 3584 x 18944, two norms; final norm; untied head."""
    shape = model_shape(AutoConfig.from_pretrained(MODELS / "Qwen2.5-7B-Instruct"))
    layer = 3584 * 3584 + 3584 + 2 * (3584 * 512 + 512) + 3584 * 3584 + 3 * 3584 * 18944 + 2 * 3584
    assert shape.layer_params == layer == 233_057_792
    assert shape.params == 2 * 152064 * 3584 + 3584 + 28 * layer == 7_615_616_512
    assert shape.kv_bytes_per_token(2) == 2 * 28 * 4 * 128 * 2 == 57344
    raw = json.loads((MODELS / "Qwen2.5-7B-Instruct" / "config.json").read_text())
    assert (raw["bos_token_id"], raw["eos_token_id"], raw["sliding_window"]) == (151643, 151645, 131072)


@pytest.mark.parametrize("kind,sizes", SMALL, ids=[f"{k}-{i}" for i, (k, _) in enumerate(SMALL)])
def test_other_families_count_their_biases_and_norms(kind, sizes):
    config = AutoConfig.for_model(kind, **sizes)
    assert model_shape(config).params == _numel(config)


def test_tiny_shape_is_the_tiny_model():
    from ragen.models.loader import load_tokenizer
    from ragen.models.tiny import tiny_model

    tok = load_tokenizer()
    model = tiny_model(hidden_size=32, num_layers=3, num_heads=4, tokenizer=tok)
    assert tiny_shape(32, 3, 4, len(tok)).params == sum(p.numel() for p in model.parameters())


def test_lora_params_are_what_peft_adds():
    """LoRA adapters: r x (in + out) per targeted linear per layer, as ``ragen.workers.lora.add_lora`` injects."""
    from ragen.workers.lora import add_lora

    config = AutoConfig.for_model("qwen2", **SMALL[2][1])
    shape = model_shape(config)
    every = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    for targets in (every, ("q_proj", "v_proj")):
        model = AutoModelForCausalLM.from_config(config)
        add_lora(model, 4, 8.0, targets)
        trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
        assert shape.lora_params(4, targets) == trained
    assert shape.lora_params(4, ("q_proj", "v_proj")) == 2 * (4 * (96 + 96) + 4 * (96 + 32))
