"""Reading safetensors by slices (``ragen.models.weights``): every part equals the same part of the tensor that
``safetensors.torch.load_file`` loads, for each stored dtype and rank; sharded folders read through their index; a
contiguous part of the stored dtype is read straight into its destination; bad files fail with the reason."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from ragen.models.weights import MemoryReader, SafetensorsReader


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn(7, 5, generator=g), "h": torch.randn(6, 3, generator=g).to(torch.bfloat16),
            "f": torch.randn(4, generator=g).half(), "i": torch.arange(24).reshape(2, 3, 4),
            "s": torch.tensor(2.5), "e": torch.zeros(0, 3), "b": torch.tensor([True, False, True])}


@pytest.fixture
def file(tmp_path):
    path = tmp_path / "x.safetensors"
    save_file(_tensors(), str(path))
    return path


INDICES = [(), (slice(2, 5),), (slice(0, 7), slice(1, 4)), (slice(6, 7),), (slice(3, 3),)]


@pytest.mark.parametrize("index", INDICES)
def test_parts_equal_the_loaded_tensors_parts(file, index):
    reader, loaded = SafetensorsReader(file), load_file(str(file))
    assert set(reader.keys()) == set(loaded)
    for key, full in loaded.items():
        part = index[:full.dim()]
        got = reader.read(key, part)
        assert got.dtype == full.dtype and reader.shape(key) == tuple(full.shape)
        assert torch.equal(got, full[part]), (key, part)
        assert torch.equal(MemoryReader(loaded).read(key, part), full[part])


def test_read_into_fills_a_contiguous_destination_of_the_stored_dtype(file):
    reader, full = SafetensorsReader(file), load_file(str(file))["w"]
    out = torch.full((3, 5), -1.0)
    assert reader.read_into("w", (slice(2, 5), slice(0, 5)), out) and torch.equal(out, full[2:5])
    untouched = torch.full((3, 5), -1.0, dtype=torch.float64)  # another dtype: nothing read, the caller converts
    assert not reader.read_into("w", (slice(2, 5),), untouched) and (untouched == -1).all()
    assert not reader.read_into("w", (slice(2, 5), slice(1, 3)), torch.empty(3, 2))  # not whole rows


def test_reading_leaves_the_destinations_storage_resizable(file):
    """A worker frees an offloaded parameter's memory by resizing its storage to 0: the read must not pin it (a
    numpy export of the destination would mark its storage non-resizable for good)."""
    reader, full = SafetensorsReader(file), load_file(str(file))["w"]
    out = torch.empty(3, 5)
    assert reader.read_into("w", (slice(2, 5),), out) and torch.equal(out, full[2:5])
    assert out.untyped_storage().resizable()
    out.untyped_storage().resize_(0)
    assert reader.read("w", (slice(1, 4),)).untyped_storage().resizable()


def test_a_sharded_folder_is_read_through_its_index(tmp_path):
    tensors = _tensors()
    first, second = dict(list(tensors.items())[:3]), dict(list(tensors.items())[3:])
    save_file(first, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file(second, str(tmp_path / "model-00002-of-00002.safetensors"))
    weight_map = {k: "model-00001-of-00002.safetensors" for k in first}
    weight_map |= {k: "model-00002-of-00002.safetensors" for k in second}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    reader = SafetensorsReader(tmp_path)
    for key, full in tensors.items():
        assert torch.equal(reader.read(key), full), key


def test_bad_inputs_fail_with_the_reason(tmp_path, file):
    with pytest.raises(FileNotFoundError, match="neither model.safetensors nor"):
        SafetensorsReader(tmp_path / "missing_folder_is_empty")
    (tmp_path / "dup").mkdir()
    save_file({"w": torch.zeros(2)}, str(tmp_path / "dup" / "other.safetensors"))
    with pytest.raises(ValueError, match="'w' is stored twice"):
        SafetensorsReader(file, tmp_path / "dup" / "other.safetensors")
    with pytest.raises(ValueError, match="step 2"):
        SafetensorsReader(file).read("w", (slice(0, 6, 2),))
    cut, data = tmp_path / "cut.safetensors", file.read_bytes()
    cut.write_bytes(data[:-4])  # the last tensor in the file lacks its last bytes
    reader = SafetensorsReader(cut)
    with pytest.raises(OSError, match="truncated"):
        for key in reader.keys():
            reader.read(key)
