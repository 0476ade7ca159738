"""Per-phase memory peaks on CPU (``ragen.utils.memory.PhaseMemory``): the RSS at a phase's end and its peak RSS,
which starts afresh at every phase (Linux: the kernel's peak is reset), while the process's peak so far
(``peak_rss_gb``, logged as ``memory/<process>_peak_gb``) survives the resets. The CUDA peaks are checked by the GPU
twin (``tests/workers/test_gpu_offload.py``)."""

from __future__ import annotations

import mmap

import pytest
import torch

from ragen.utils.memory import PhaseMemory, max_peaks, peak_rss_gb, release_cached_memory, reset_peak_rss

MIB = 1024 * 1024
GB = 1024**3


def _touch(mib: int) -> None:
    """Make ``mib`` MiB resident (a fresh anonymous mapping, every page written), then free them."""
    block = mmap.mmap(-1, mib * MIB)
    for offset in range(0, len(block), mmap.PAGESIZE):
        block[offset] = 1
    block.close()


@pytest.fixture
def resettable():
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        pytest.skip("this process uses CUDA: phases report the CUDA peaks (the GPU twin checks them)")
    if not reset_peak_rss():
        pytest.skip("the peak RSS cannot be reset here (not Linux, or /proc/self/clear_refs read-only)")


def test_each_phase_has_its_own_peak_and_the_process_peak_survives(resettable):
    phases = PhaseMemory()
    with phases.measure("big"):
        _touch(300)
    with phases.measure("small"):
        _touch(20)
    got = phases.take()
    assert set(got) == {"memory/big/rss", "memory/big/rss_peak", "memory/small/rss", "memory/small/rss_peak"}
    assert got["memory/big/rss_peak"] - got["memory/big/rss"] > 250 * MIB / GB  # the freed 300 MiB: in the peak only
    # a peak that could not be reset (ru_maxrss) would still show the 300 MiB in the later phase
    assert got["memory/big/rss_peak"] - got["memory/small/rss_peak"] > 250 * MIB / GB
    assert peak_rss_gb() >= got["memory/big/rss_peak"] - 1e-3
    assert phases.take() == {}  # taken: forgotten


def test_a_repeated_phase_keeps_its_largest_peak_and_inner_phases_count_in_the_outer_one(resettable):
    phases = PhaseMemory()
    with phases.measure("p"):
        _touch(300)
    with phases.measure("p"):
        _touch(10)
    with phases.measure("outer"), phases.measure("inner"):
        _touch(10)
    got = phases.take()
    assert {k.split("/")[1] for k in got} == {"p", "outer"}
    assert got["memory/p/rss_peak"] - got["memory/outer/rss_peak"] > 250 * MIB / GB
    release_cached_memory()  # heap trim (and the CUDA cache where CUDA is in use): callable anywhere


def test_max_peaks_takes_each_keys_largest_value():
    ranks = [{"memory/a/allocated": 1.0, "memory/b/allocated": 4.0}, {"memory/a/allocated": 3.0}, {}]
    assert max_peaks(ranks) == {"memory/a/allocated": 3.0, "memory/b/allocated": 4.0}
