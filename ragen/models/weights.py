"""Reading model weights by slices: each rank of a sharded worker reads only the rows of the tensors it holds.

``SafetensorsReader`` reads a transformers folder (``model.safetensors``, or the shards its
``model.safetensors.index.json`` lists) or single ``.safetensors`` files with plain positioned file reads: a row
range of a row-major tensor is one contiguous run of bytes, so a rank reading its dim-0 shard touches only that
run. (Memory-mapping the file would count every page read in the process's resident set until the file is closed,
so a rank reading its shards would look, and while mapped be, as large as the checkpoint.)
``MemoryReader`` gives the same interface over tensors already in memory (a tiny random model, an initial value).

Slicing: ``read(key, index)`` returns ``tensor[index]`` for a tuple of ``slice`` objects with step 1, one per
leading dimension (missing trailing ones take everything), as a new CPU tensor in the stored dtype.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

import torch

Index = tuple[slice, ...]
"""One ``slice`` (step 1) per leading dimension of a tensor: the part of it to read."""

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"

# safetensors dtype names -> torch dtypes (the format's spec; all little-endian)
_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}


class TensorReader(Protocol):
    """Named tensors read by parts: what a worker's load plan reads from."""

    def keys(self) -> Iterable[str]: ...

    def shape(self, key: str) -> tuple[int, ...]: ...

    def read(self, key: str, index: Index = ()) -> torch.Tensor: ...


def _bounds(index: Index, shape: tuple[int, ...]) -> list[tuple[int, int]]:
    """(start, stop) per dimension of ``shape`` for ``index`` (checked: in range, step 1)."""
    out = []
    for dim, size in enumerate(shape):
        s = index[dim] if dim < len(index) else slice(None)
        start, stop, step = s.indices(size)
        if step != 1:
            raise ValueError(f"slice {s} has step {step}; only contiguous parts are read")
        out.append((start, max(start, stop)))
    if len(index) > len(shape):
        raise ValueError(f"index {index} has more dimensions than the tensor's shape {shape}")
    return out


class SafetensorsReader:
    """Tensors of ``.safetensors`` files, read by slices without mapping the files (see the module docstring).

    ``paths``: files or transformers model folders (a folder contributes ``model.safetensors`` or the shards its
    ``model.safetensors.index.json`` lists). A name in two files is an error.
    """

    def __init__(self, *paths: str | Path):
        self._where: dict[str, tuple[Path, str, tuple[int, ...], int]] = {}  # key -> (file, dtype, shape, offset)
        for path in paths:
            for file in _weight_files(Path(path)):
                self._index(file)

    def _index(self, file: Path) -> None:
        with open(file, "rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(length))
        for key, info in header.items():
            if key == "__metadata__":
                continue
            if key in self._where:
                raise ValueError(f"tensor {key!r} is stored twice: in {self._where[key][0]} and in {file}")
            if info["dtype"] not in _DTYPES:
                raise ValueError(f"tensor {key!r} in {file} has dtype {info['dtype']}, which ragen does not read")
            self._where[key] = (file, info["dtype"], tuple(info["shape"]), 8 + length + info["data_offsets"][0])

    def keys(self) -> Iterable[str]:
        return self._where.keys()

    def shape(self, key: str) -> tuple[int, ...]:
        return self._where[key][2]

    def read(self, key: str, index: Index = ()) -> torch.Tensor:
        """``tensor[index]`` as a new CPU tensor of the stored dtype: the rows of ``index[0]`` are read from the
        file in one positioned read, the other dimensions are sliced in memory."""
        _, dtype_name, shape, _ = self._where[key]
        bounds = _bounds(index, shape)
        (r0, r1) = bounds[0] if shape else (0, 1)
        rows = torch.empty((r1 - r0, *shape[1:]) if shape else (), dtype=_DTYPES[dtype_name])
        self._read_rows(key, r0, rows)
        return rows[(slice(None), *(slice(a, b) for a, b in bounds[1:]))] if shape else rows

    def read_into(self, key: str, index: Index, out: torch.Tensor) -> bool:
        """Read ``tensor[index]`` straight into ``out`` (no buffer) when that is a plain copy: ``out`` a contiguous
        CPU tensor of the stored dtype and the index's shape, ``index`` whole in every dimension but the first.
        Returns False, having read nothing, otherwise."""
        _, dtype_name, shape, _ = self._where[key]
        bounds = _bounds(index, shape)
        whole = all(b == (0, size) for b, size in zip(bounds[1:], shape[1:], strict=True))
        if (out.device.type != "cpu" or out.dtype != _DTYPES[dtype_name] or not out.is_contiguous() or not whole
                or tuple(out.shape) != tuple(b - a for a, b in bounds)):
            return False
        self._read_rows(key, bounds[0][0] if shape else 0, out)
        return True

    def _read_rows(self, key: str, first_row: int, out: torch.Tensor) -> None:
        """Fill the contiguous ``out`` with the stored bytes of ``key`` from row ``first_row`` on."""
        file, _, shape, offset = self._where[key]
        start = offset + first_row * math.prod(shape[1:]) * out.element_size()
        # A ctypes view of the tensor's bytes, not ``.numpy()``: exporting a tensor to numpy marks its storage
        # non-resizable for good, and a worker frees an offloaded parameter's device memory by resizing its storage.
        nbytes = out.numel() * out.element_size()
        if not nbytes:
            return
        view = memoryview((ctypes.c_char * nbytes).from_address(out.data_ptr())).cast("B")
        fd = os.open(file, os.O_RDONLY)
        try:
            done = 0
            while done < len(view):
                n = os.preadv(fd, [view[done:]], start + done)
                if n <= 0:
                    raise OSError(f"{file} ends inside tensor {key!r}; the file is truncated")
                done += n
        finally:
            os.close(fd)


def _weight_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    index = path / INDEX_FILE
    if index.is_file():
        return sorted({path / name for name in json.loads(index.read_text())["weight_map"].values()})
    if (path / SINGLE_FILE).is_file():
        return [path / SINGLE_FILE]
    raise FileNotFoundError(f"{path} holds neither {SINGLE_FILE} nor {INDEX_FILE}; ragen reads transformers "
                            "folders of safetensors weights (save the model with save_pretrained)")


class MemoryReader:
    """``TensorReader`` over tensors in memory (``read`` slices a view; the caller copies it into place)."""

    def __init__(self, tensors: dict[str, torch.Tensor]):
        self.tensors = tensors

    def keys(self) -> Iterable[str]:
        return self.tensors.keys()

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self.tensors[key].shape)

    def read(self, key: str, index: Index = ()) -> torch.Tensor:
        t = self.tensors[key]
        return t[tuple(slice(a, b) for a, b in _bounds(index, tuple(t.shape)))]
