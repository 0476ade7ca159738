"""Stand-ins for what documented commands name but a test machine lacks: model folders without weights, run and
checkpoint folders, a Z-machine game, placeholder values. No network.

A model named in a command (a hub id such as ``Qwen/Qwen2.5-7B-Instruct`` or a path such as
``/models/Qwen2.5-3B-Instruct``) becomes a folder with the ``config.json`` of its architecture at its real sizes
(:data:`ARCHITECTURES`: Qwen2 / Qwen2.5, Qwen3, Llama 3; unknown names get the default model's Llama sizes) and the
default tokenizer's files standing in for its own (no weights: the dry run reads config and tokenizer only). The
Qwen2.5 0.5B, 3B and 7B Instruct models get their published config.json (tests/data/models, :data:`VENDORED`) and a
tokenizer of Qwen's size and special-token ids (:func:`qwen_sized_tokenizer`), since the pre-start checks match the
tokenizer against the model's config.
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
DATA = Path(__file__).resolve().parents[1] / "data" / "models"
# (family, size tag) -> the folder of tests/data/models holding that model's published config.json
VENDORED = {("qwen2", "0.5b"): "Qwen2.5-0.5B-Instruct", ("qwen2", "3b"): "Qwen2.5-3B-Instruct",
            ("qwen2", "7b"): "Qwen2.5-7B-Instruct"}
# Qwen2.5's special tokens and their ids (its tokenizer: 151643 ordinary tokens, then these, 151665 in all)
QWEN_SPECIALS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645}


def architecture(name: str) -> tuple[str, str]:
    """(family, size tag) of a model name: ``Qwen/Qwen2.5-3B-Instruct`` -> (qwen2, 3b)."""
    low = name.lower()
    family = ("qwen3" if "qwen3" in low else "qwen2" if "qwen" in low else "llama" if "llama" in low
              else "default")
    size = re.search(r"(\d+(?:\.\d+)?)b\b", low)
    tag = size.group(1) + "b" if size else ""
    return (family, tag) if (family, tag) in ARCHITECTURES else (family, FAMILY_DEFAULT[family])


def model_folder(root: Path, name: str, tokenizer_dir: str | Path, qwen_tokenizer_dir: str | Path | None = None
                 ) -> Path:
    """A weightless model folder for ``name`` under ``root`` (made once): its architecture's config.json and the
    default tokenizer's files; a :data:`VENDORED` model's own config.json and ``qwen_tokenizer_dir``'s tokenizer (a
    :func:`qwen_sized_tokenizer` folder; made under ``root`` when not given)."""
    folder = root / re.sub(r"[^\w.-]+", "_", name.strip("/"))
    if (folder / "config.json").is_file():
        return folder
    vendored = VENDORED.get(architecture(name))
    if vendored is None:
        shutil.copytree(tokenizer_dir, folder, dirs_exist_ok=True)
        (folder / "config.json").write_text(json.dumps(ARCHITECTURES[architecture(name)], indent=2))
        return folder
    qwen = qwen_tokenizer_dir or qwen_sized_tokenizer(root / "qwen-sized-tokenizer", tokenizer_dir)
    shutil.copytree(qwen, folder, dirs_exist_ok=True)
    shutil.copy(DATA / vendored / "config.json", folder / "config.json")
    return folder


def qwen_sized_tokenizer(out: Path, tokenizer_dir: str | Path) -> Path:
    """The default tokenizer renumbered to Qwen2.5's layout, in ``out`` (made once): its ChatML tokens at Qwen's ids
    (:data:`QWEN_SPECIALS`), its other special tokens right after them, and unreachable filler tokens for every id
    the default vocabulary leaves free below 151643, so ``len(tokenizer)`` is Qwen-sized (151660) and the chat
    template, end-of-turn token and special ids are those a Qwen2.5 config names. Texts tokenize as with the
    default tokenizer (the merges are unchanged), under other ids."""
    if (out / "tokenizer.json").is_file():
        return out
    data = json.loads((Path(tokenizer_dir) / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    specials = [t["content"] for t in sorted(data["added_tokens"], key=lambda t: t["id"])]
    new_ids = dict(QWEN_SPECIALS)
    for content in specials:
        new_ids.setdefault(content, 151643 + len(new_ids))
    freed = {vocab[c] for c in specials if c in vocab}
    for content in specials:
        vocab.pop(content, None)
    taken = set(vocab.values())
    for i in range(151643):
        if i not in taken or i in freed:
            vocab[f"<filler_{i}>"] = i
    vocab.update(new_ids)
    for token in data["added_tokens"]:
        token["id"] = new_ids[token["content"]]
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(json.dumps(data))
    for name in ("tokenizer_config.json", "chat_template.jinja"):
        if (Path(tokenizer_dir) / name).is_file():
            shutil.copy(Path(tokenizer_dir) / name, out / name)
    return out


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
        from ragen.trainer.config.compose import load_train_config

        checkpoint(p / "checkpoints" / "global_step_1", model, 1)
        (p / "metrics.jsonl").write_text(json.dumps({"step": 1, "val/reward/mean": 0.0}) + "\n")
        (p / "config.json").write_text(json.dumps(load_train_config("base").to_dict(), default=str))
