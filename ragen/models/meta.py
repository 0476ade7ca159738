"""Models built on the meta device: the module tree and config of a checkpoint without any weight memory.

A worker builds its model here, shards it, allocates only its own shards and then reads its slices of the
weights (``ragen.workers.materialize``), so no process ever holds a full copy of a large model. What a checkpoint
does not hold is re-created after allocation: non-persistent buffers (RoPE ``inv_freq``) by the model's own
initialiser (``restore_non_persistent_buffers``), tied weights by the caller tying them again.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, GenerationConfig, PreTrainedModel

from ragen.models.loader import load_tokenizer, resolve_model_path, sync_model_special_tokens


def empty_from_config(config, dtype: torch.dtype = torch.float32, base: bool = False,
                      attn_implementation: str | None = None) -> PreTrainedModel:
    """The ``*ForCausalLM`` of ``config`` (``base``: its base model, ``AutoModel``, without lm_head) on the meta
    device, floating-point parameters in ``dtype`` (buffers as the model's code makes them: RoPE's stay fp32),
    attention ``attn_implementation`` (a resolved name, ``ragen.models.attention``; None: transformers' default)."""
    with torch.device("meta"):
        return (AutoModel if base else AutoModelForCausalLM).from_config(config, dtype=dtype,
                                                                         attn_implementation=attn_implementation)


def empty_model(name_or_path: str, *, dtype: torch.dtype = torch.float32, cache_dir: str | None = None,
                base: bool = False, attn_implementation: str | None = None) -> tuple[PreTrainedModel, str]:
    """(the model of ``name_or_path`` on the meta device, the local folder holding its weights).

    Config, generation config and special-token ids are those ``ragen.models.load_model`` gives (the tokenizer's
    eos / pad ids); ``base`` builds the base model (a critic's backbone, e.g. a folder written by
    ``ValueModel.save``), whose special tokens are left as its config says. Forms of ``name_or_path``: as
    ``resolve_model_path`` (an alias is converted once; nothing else is read but config and tokenizer files).
    ``attn_implementation`` as in :func:`empty_from_config`.
    """
    path = resolve_model_path(name_or_path, cache_dir)
    model = empty_from_config(AutoConfig.from_pretrained(path), dtype, base=base,
                              attn_implementation=attn_implementation)
    if base:
        return model, path
    if (Path(path) / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(path)
    sync_model_special_tokens(model, load_tokenizer(path))
    return model, path


@torch.no_grad()
def restore_non_persistent_buffers(module: nn.Module) -> list[str]:
    """Recompute the non-persistent buffers of every transformers model inside ``module`` (RoPE ``inv_freq`` and
    ``original_inv_freq``: no checkpoint holds them) with the model's own ``_init_weights``, as
    ``from_pretrained`` does after its meta-device build; call it after ``to_empty`` left them uninitialised.
    Only the modules owning such buffers are initialised, under a forked RNG (the global stream is untouched).
    Returns the buffer names restored."""
    done: set[int] = set()
    names: list[str] = []
    with torch.random.fork_rng(devices=[]):
        for prefix, model in module.named_modules():
            if not isinstance(model, PreTrainedModel):
                continue
            for name, _ in model.named_non_persistent_buffers():
                owner = model.get_submodule(name.rpartition(".")[0])
                if id(owner) not in done:
                    model._init_weights(owner)
                    done.add(id(owner))
                names.append(f"{prefix}.{name}" if prefix else name)
    return sorted(set(names))
