"""Giving a worker's meta-device model its values: this rank's slices of every tensor, read where they are stored.

The workers build their models on the meta device (``ragen.models.meta``; LoRA adapters and value heads too), shard
them and allocate only their own shards (``ragen.workers.dist.shard_model``). ``materialize`` then
  1. recomputes the non-persistent buffers no checkpoint holds (RoPE ``inv_freq``) with the model's own initialiser,
  2. copies into each parameter / persistent buffer the part of the full tensor this rank holds (a DTensor's local
     shard, or the whole tensor at world size 1), read from its ``Source``: a safetensors file read by slices
     (``ragen.models.weights``), a tensor in memory (a tiny random model, LoRA's initial adapters, a zero value
     head) or a computed value (a LoRA base weight unmerged from a checkpoint's merged weight).
So every rank reads only what it keeps, in blocks of rows (``BLOCK_BYTES``): its host memory holds at most its
shards (CPU) plus one block, whatever the world size, and no rank builds, loads or broadcasts a full copy. Tied
parameters are one tensor, loaded once.

A load plan maps module state-dict names (``lm.model.layers.0.mlp.up_proj.weight``) to sources;
``checkpoint_names`` matches them to a checkpoint's names (with or without the base model's prefix, the way
``from_pretrained`` matches a base model's checkpoint to a ``*ForCausalLM`` and back).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from types import EllipsisType

import torch
from torch import nn
from transformers import PreTrainedModel

from ragen.models.meta import empty_from_config, empty_model, restore_non_persistent_buffers
from ragen.models.weights import Index, MemoryReader, SafetensorsReader, TensorReader


@dataclass(frozen=True)
class Source:
    """Where one module tensor's values come from: the full tensor's ``shape``, ``read(index)``, which returns
    ``full[index]`` on the CPU (any dtype; the copy into the module converts), and optionally ``read_into(index,
    out)``, which reads ``full[index]`` straight into ``out`` where it can (a file read without a buffer) and
    returns whether it did."""

    shape: tuple[int, ...]
    read: Callable[[Index], torch.Tensor]
    read_into: Callable[[Index, torch.Tensor], bool] | None = None


def reader_sources(reader: TensorReader, names: dict[str, str]) -> dict[str, Source]:
    """``{module name: Source}`` reading ``reader``'s tensor ``names[module name]``."""
    direct = getattr(reader, "read_into", None)
    return {mod: Source(tuple(reader.shape(key)), lambda index, key=key: reader.read(key, index),
                        None if direct is None else lambda index, out, key=key: direct(key, index, out))
            for mod, key in names.items()}


def checkpoint_names(module_names: Iterable[str], checkpoint: Iterable[str], *, prefix: str, base_prefix: str,
                     rename: Callable[[str], str] = lambda name: name) -> dict[str, str]:
    """``{module name: checkpoint name}`` for the module names under ``prefix`` (``"lm."``, ``"backbone."``) whose
    model name (``prefix`` removed, then ``rename``d, e.g. LoRA's ``base_layer`` dropped) is in ``checkpoint`` as
    is, with ``base_prefix`` (``"model."``) added, or with it removed: a base model's checkpoint for a causal LM's
    backbone and the other way round. Names with no match are left out (the caller decides what must be there)."""
    have = set(checkpoint)
    out = {}
    for mod in module_names:
        if not mod.startswith(prefix):
            continue
        name = rename(mod[len(prefix):])
        for candidate in (name, base_prefix + name, name.removeprefix(base_prefix)):
            if candidate in have:
                out[mod] = candidate
                break
    return out


def local_part(t: torch.Tensor) -> tuple[torch.Tensor, Index]:
    """(the tensor this rank holds of ``t``, where it sits in the full tensor): a DTensor's local shard and its
    offsets (FSDP2: a dim-0 chunk, possibly empty), or ``t`` itself, whole."""
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        shape, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
        return t.to_local(), tuple(slice(o, o + s) for s, o in zip(shape, offset, strict=True))
    return t, tuple(slice(0, s) for s in t.shape)


def module_tensors(module: nn.Module) -> list[tuple[list[str], torch.Tensor]]:
    """Each distinct parameter / persistent buffer of ``module`` with all its state-dict names (tied weights have
    several), in state-dict order."""
    groups: dict[int, tuple[list[str], torch.Tensor]] = {}
    for name, t in module.state_dict(keep_vars=True).items():
        groups.setdefault(id(t), ([], t))[0].append(name)
    return list(groups.values())


BLOCK_BYTES = 16 * 2**20
"""Largest part of a tensor read at once (rows of dim 0, counted at 4 bytes an element or the tensor's element size
when larger): the host memory a load needs beyond the shards."""


def _row_blocks(local: torch.Tensor, index: Index) -> Iterator[tuple[slice | EllipsisType, Index]]:
    """(rows of ``local``, the same rows' index in the full tensor) in blocks of at most ``BLOCK_BYTES`` (a 0-d
    tensor: all of it, ``...``)."""
    if local.dim() == 0:
        yield ..., index
        return
    start, count = index[0].start, local.shape[0]
    row_bytes = max(1, local[0].numel() * max(4, local.element_size())) if count else 1
    step = max(1, BLOCK_BYTES // row_bytes)
    for s in range(0, count, step):
        e = min(count, s + step)
        yield slice(s, e), (slice(start + s, start + e), *index[1:])


@torch.no_grad()
def load_weights(module: nn.Module, plan: dict[str, Source], *, optional: Callable[[str], bool] = lambda n: False,
                 ) -> list[str]:
    """Copy into every tensor of ``module`` the part this rank holds, read from ``plan`` (by any of its names).

    A tensor without a source is an error unless ``optional(name)`` (then it keeps its value); a source whose
    full shape differs from the tensor's is an error (a checkpoint of another model size). Returns the names of
    the tensors left as they were."""
    skipped, missing = [], []
    for names, tensor in module_tensors(module):
        name = next((n for n in names if n in plan), None)
        if name is None:
            (skipped if all(optional(n) for n in names) else missing).append(names[0])
            continue
        source = plan[name]
        if tuple(source.shape) != tuple(tensor.shape):
            raise ValueError(f"weight {name}: the checkpoint holds shape {tuple(source.shape)}, the model has "
                             f"{tuple(tensor.shape)}; the checkpoint belongs to another model configuration")
        local, index = local_part(tensor)
        if source.read_into is not None and source.read_into(index, local):
            continue
        for rows, part in _row_blocks(local, index):
            local[rows].copy_(source.read(part))
    if missing:
        raise ValueError(f"the checkpoint lacks {len(missing)} weight(s) of the model, e.g. {missing[:5]}; expected "
                         "a checkpoint of this model's architecture with transformers' tensor names")
    return skipped


def materialize(module: nn.Module, plan: dict[str, Source], *,
                optional: Callable[[str], bool] = lambda n: False) -> nn.Module:
    """Give a model that ``shard_model`` allocated uninitialised its values: non-persistent buffers from the
    model's own initialiser, then every tensor from ``plan`` (``load_weights``). Returns ``module``."""
    restore_non_persistent_buffers(module)
    load_weights(module, plan, optional=optional)
    return module


def open_model(model_name_or_path: str, tiny: dict | None, cache_dir: str | None,
               dtype: torch.dtype = torch.float32, attn_implementation: str | None = None
               ) -> tuple[PreTrainedModel, TensorReader]:
    """(the causal LM on the meta device, floating-point parameters in ``dtype``, attention ``attn_implementation``
    (a resolved name; None: transformers' default); a reader of its weights).

    ``tiny``: kwargs of ``ragen.models.tiny_model`` (tests): the small random model is built on the host and read
    from memory. Otherwise the alias / folder / hub id's safetensors (``ragen.models.meta.empty_model``)."""
    if tiny is not None:
        from ragen.models import tiny_model

        host = tiny_model(**tiny, attn_implementation=attn_implementation)
        lm = empty_from_config(host.config, dtype, attn_implementation=attn_implementation)
        lm.generation_config = host.generation_config
        return lm, MemoryReader(host.state_dict())
    lm, path = empty_model(model_name_or_path, dtype=dtype, cache_dir=cache_dir,
                           attn_implementation=attn_implementation)
    return lm, SafetensorsReader(path)


def zeros(*names_and_shapes: tuple[str, tuple[int, ...]]) -> dict[str, Source]:
    """Sources of zero tensors (e.g. a value head's initial weight and bias)."""
    return {name: Source(shape, lambda index, shape=shape: torch.zeros(shape)[index]) for name, shape in
            names_and_shapes}


def unused(names: dict[str, str], reader: TensorReader) -> list[str]:
    """The tensors of ``reader`` that no module name maps to (``names``: module name -> reader name)."""
    return sorted(set(reader.keys()) - set(names.values()))
