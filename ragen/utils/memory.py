"""Process memory: current and peak resident set size, handing freed memory back (heap pages to the OS, cached CUDA
blocks to the driver), and the memory peak of each phase of a training step.

A training update allocates activations for a whole micro-batch; glibc keeps the freed pages in its heap (more
so with ``ragen.allocator.tune_allocator``, which ragen's programs apply), and on a GPU the CUDA caching allocator
keeps freed blocks reserved, so a process stays at its peak between phases unless that memory is released
(``release_cached_memory`` after each update and log-prob / value pass). The trainer logs
``memory/<process>_rss_gb`` and ``memory/<process>_peak_gb`` every step, where a leak shows as growth from step
to step, and the peak of each phase (:class:`PhaseMemory`): ``memory/<phase>/allocated`` and ``/reserved`` where
the process uses CUDA, ``memory/<phase>/rss`` and ``/rss_peak`` elsewhere.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import resource
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field

_GB = 1024**3
_CLEAR_REFS = "/proc/self/clear_refs"  # writing "5" resets the process's peak RSS (Linux >= 4.0)
_folded_peak_kb = 0.0  # the largest peak RSS seen before a reset (reset_peak_rss), in KiB


def rss_gb() -> float:
    """Resident set size of this process now, in GiB (Linux: /proc/self/statm; elsewhere the peak)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            pages = int(fh.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / _GB
    except (OSError, ValueError, IndexError):
        return peak_rss_gb()


def peak_rss_gb() -> float:
    """Peak resident set size of this process so far, in GiB, also across the per-phase resets of
    :func:`reset_peak_rss` (the peak before a reset is kept).

    Linux: ``VmHWM`` of /proc/self/status, the high-water mark of this process image. (``ru_maxrss`` is not: a
    process started by fork + exec starts from the resident set its parent had at the fork, so a worker or test
    child spawned by a large parent would report the parent's size as its own peak.) Elsewhere ``ru_maxrss``
    (bytes on macOS)."""
    kb = _hwm_kb()
    if kb is None:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        kb = peak / 1024 if sys.platform == "darwin" else float(peak)
    return max(kb, _folded_peak_kb) * 1024 / _GB


def _hwm_kb() -> float | None:
    """The kernel's peak RSS of this process (``VmHWM`` in /proc/self/status) in KiB; None where it is not shown."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def reset_peak_rss() -> bool:
    """Restart the peak RSS from the current RSS (Linux: ``5`` into /proc/self/clear_refs), so the next
    :func:`phase_peak_rss_gb` is the peak since this call; the peak so far is kept for :func:`peak_rss_gb` first
    (the reset also lowers ``VmHWM``). Returns False where the peak cannot be reset (not Linux, or /proc
    read-only): the peak is then the whole process's only."""
    global _folded_peak_kb
    now = _hwm_kb()
    if now is None:
        return False
    _folded_peak_kb = max(_folded_peak_kb, now)
    try:
        with open(_CLEAR_REFS, "w", encoding="ascii") as fh:
            fh.write("5")
    except OSError:
        return False
    return True


def phase_peak_rss_gb() -> float | None:
    """Peak RSS in GiB since the last :func:`reset_peak_rss` (``VmHWM``); None where the kernel does not show it."""
    kb = _hwm_kb()
    return None if kb is None else kb * 1024 / _GB


def release_free_memory() -> None:
    """Return freed heap pages to the OS (glibc ``malloc_trim(0)``); a no-op where glibc is not the allocator."""
    name = ctypes.util.find_library("c")
    if not name or not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(name).malloc_trim(0)
    except (OSError, AttributeError):
        return


def _cuda_in_use():
    """The ``torch.cuda`` module when this process has initialised CUDA, else None (never initialises it: a driver
    that only talks to GPU workers must not open a CUDA context of its own)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return torch.cuda


def release_cached_memory() -> None:
    """Hand freed memory back after a phase: heap pages to the OS (:func:`release_free_memory`) and, where this
    process uses CUDA, the caching allocator's free blocks to the driver (``torch.cuda.empty_cache``), so a
    colocated rollout engine waking next can have them."""
    release_free_memory()
    cuda = _cuda_in_use()
    if cuda is not None:
        cuda.empty_cache()


def memory_stats() -> dict[str, float]:
    """``{"rss_gb": ..., "peak_gb": ...}`` of this process."""
    return {"rss_gb": rss_gb(), "peak_gb": peak_rss_gb()}


@dataclass(frozen=True)
class PhasePeaks:
    """The phase peaks one process recorded since they were last taken (``memory/<phase>/<what>`` -> GiB); what a
    worker's ``phase_memory()`` returns, one per rank (the trainer takes the max over ranks: :func:`max_peaks`)."""

    values: dict[str, float] = field(default_factory=dict)


def max_peaks(peaks: list[dict[str, float]]) -> dict[str, float]:
    """The largest value of each key over ``peaks`` (ranks, or calls of one phase)."""
    out: dict[str, float] = {}
    for one in peaks:
        for key, value in one.items():
            out[key] = max(out.get(key, value), value)
    return out


class PhaseMemory:
    """The memory peak of each named phase of this process, kept until :meth:`take`.

    :meth:`measure` wraps one phase. Where the process uses CUDA: ``memory/<phase>/allocated`` and
    ``memory/<phase>/reserved``, the peaks of ``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` over the
    phase (reset with ``torch.cuda.reset_peak_memory_stats`` at its start). Elsewhere: ``memory/<phase>/rss``, the
    RSS at the phase's end, and ``memory/<phase>/rss_peak``, the peak RSS over the phase (Linux, where the peak can
    be reset: :func:`reset_peak_rss`; absent elsewhere, since ``ru_maxrss`` holds the whole process's peak). GiB.
    A phase run several times before :meth:`take` keeps its largest values; a phase measured inside another is
    counted in the outer one only (the peaks cannot be reset halfway through the outer phase).
    """

    def __init__(self) -> None:
        self.peaks: dict[str, float] = {}
        self._depth = 0

    @contextlib.contextmanager
    def measure(self, phase: str | None) -> Iterator[None]:
        """Record the peaks of the block as ``phase`` (None, or inside another measured phase: record nothing)."""
        if phase is None or self._depth:
            yield
            return
        self._depth += 1
        cuda, reset = _cuda_in_use(), False
        if cuda is not None:
            cuda.reset_peak_memory_stats()
        else:
            reset = reset_peak_rss()
        try:
            yield
        finally:
            self._depth -= 1
        cuda = _cuda_in_use()  # the phase may have initialised CUDA: its peaks then count from the start
        if cuda is not None:
            found = {"allocated": cuda.max_memory_allocated() / _GB, "reserved": cuda.max_memory_reserved() / _GB}
        else:
            found = {"rss": rss_gb()}
            peak = phase_peak_rss_gb() if reset else None
            if peak is not None:
                found["rss_peak"] = peak
        self.peaks = max_peaks([self.peaks, {f"memory/{phase}/{k}": v for k, v in found.items()}])

    def take(self) -> dict[str, float]:
        """The peaks recorded since the last call (then forgotten)."""
        out, self.peaks = self.peaks, {}
        return out


PHASE_MEMORY = PhaseMemory()  # this process's phases: the workers' methods and the driver's engine phases
