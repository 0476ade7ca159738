"""Stand-ins for what documented commands name but a test machine lacks: model folders without weights, run and
checkpoint folders, a Z-machine game, placeholder values. No network.

A model named in a command (a hub id such as ``Qwen/Qwen2.5-7B-Instruct`` or a path such as
``/models/Qwen2.5-3B-Instruct``) becomes a folder with the ``config.json`` of its architecture at its real sizes
(:data:`ARCHITECTURES`: Qwen2 / Qwen2.5, Qwen3, Llama 3; unknown names get the default model's Llama sizes) and the
default tokenizer's files standing in for its own (no weights: the dry run reads config and tokenizer only).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

# Placeholders of the docs -> fixed values (a new placeholder fails the test until it is added here).
PLACEHOLDERS = {"<head-ip>": "10.0.0.1", "<run>": "runs/doc_run", "<policy-dir>": "/models/policy",
                "<sft-run-dir>": "/models/sft-run"}
GAME_PLACEHOLDER = re.compile(r"^/path/to/[\w.-]+\.z[358]$")

_QWEN2 = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "rope_theta": 1000000.0,
          "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "vocab_size": 151936}
_QWEN3 = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "rope_theta": 1000000.0,
          "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "vocab_size": 151936, "head_dim": 128}
_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "rope_theta": 500000.0,
          "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "vocab_size": 128256}


def _size(h: int, layers: int, heads: int, kv: int, inter: int, tied: bool, **extra) -> dict:
    return {"hidden_size": h, "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv,
            "intermediate_size": inter, "tie_word_embeddings": tied, **extra}


# (family, size tag) -> config.json fields, from the models' published config.json files.
ARCHITECTURES = {
    ("qwen2", "0.5b"): {**_QWEN2, **_size(896, 24, 14, 2, 4864, True)},
    ("qwen2", "1.5b"): {**_QWEN2, **_size(1536, 28, 12, 2, 8960, True)},
    ("qwen2", "3b"): {**_QWEN2, **_size(2048, 36, 16, 2, 11008, True)},
    ("qwen2", "7b"): {**_QWEN2, **_size(3584, 28, 28, 4, 18944, False, vocab_size=152064)},
    ("qwen3", "0.6b"): {**_QWEN3, **_size(1024, 28, 16, 8, 3072, True)},
    ("qwen3", "1.7b"): {**_QWEN3, **_size(2048, 28, 16, 8, 6144, True)},
    ("qwen3", "4b"): {**_QWEN3, **_size(2560, 36, 32, 8, 9728, True)},
    ("qwen3", "8b"): {**_QWEN3, **_size(4096, 36, 32, 8, 12288, False)},
    ("llama", "1b"): {**_LLAMA, **_size(2048, 16, 32, 8, 8192, True)},
    ("llama", "3b"): {**_LLAMA, **_size(3072, 28, 24, 8, 8192, True, head_dim=128)},
    ("llama", "8b"): {**_LLAMA, **_size(4096, 32, 32, 8, 14336, False)},
    # names without a known family: SmolLM2-135M's sizes (the default tokenizer's own model)
    ("default", ""): {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "rope_theta": 100000.0,
                      "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "vocab_size": 49152,
                      **_size(576, 30, 9, 3, 1536, True)},
}
FAMILY_DEFAULT = {"qwen2": "7b", "qwen3": "8b", "llama": "8b", "default": ""}


def architecture(name: str) -> tuple[str, str]:
    """(family, size tag) of a model name: ``Qwen/Qwen2.5-3B-Instruct`` -> (qwen2, 3b)."""
    low = name.lower()
    family = ("qwen3" if "qwen3" in low else "qwen2" if "qwen" in low else "llama" if "llama" in low
              else "default")
    size = re.search(r"(\d+(?:\.\d+)?)b\b", low)
    tag = size.group(1) + "b" if size else ""
    return (family, tag) if (family, tag) in ARCHITECTURES else (family, FAMILY_DEFAULT[family])


def model_folder(root: Path, name: str, tokenizer_dir: str | Path) -> Path:
    """A weightless model folder for ``name`` under ``root`` (made once): its architecture's config.json and the
    default tokenizer's files."""
    folder = root / re.sub(r"[^\w.-]+", "_", name.strip("/"))
    if not (folder / "config.json").is_file():
        shutil.copytree(tokenizer_dir, folder, dirs_exist_ok=True)
        (folder / "config.json").write_text(json.dumps(ARCHITECTURES[architecture(name)], indent=2))
    return folder


def checkpoint(folder: Path, model: Path, step: int) -> Path:
    """A complete checkpoint folder ``global_step_N`` whose ``actor/`` is a copy of the (weightless) ``model``."""
    shutil.copytree(model, folder / "actor", dirs_exist_ok=True)
    (folder / "COMPLETE").write_text(json.dumps({"step": step}))
    return folder


def run_paths(path: str, model: Path) -> None:
    """Make the relative ``runs/...`` path of a command exist: an ``actor`` folder, a ``global_step_N`` checkpoint
    or a run folder (metrics.jsonl, config.json, one checkpoint)."""
    p = Path(path)
    if p.name == "actor":
        step = re.search(r"global_step_(\d+)", p.parent.name)
        checkpoint(p.parent, model, int(step.group(1)) if step else 1)
    elif m := re.fullmatch(r"global_step_(\d+)", p.name):
        checkpoint(p, model, int(m.group(1)))
    else:
        from ragen.trainer.compose import load_train_config

        checkpoint(p / "checkpoints" / "global_step_1", model, 1)
        (p / "metrics.jsonl").write_text(json.dumps({"step": 1, "val/reward/mean": 0.0}) + "\n")
        (p / "config.json").write_text(json.dumps(load_train_config("base").to_dict(), default=str))
