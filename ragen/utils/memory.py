"""Process memory: current and peak resident set size, and handing freed heap pages back to the OS.

A training update allocates activations for a whole micro-batch; glibc keeps the freed pages in its heap (more
so with ``ragen.allocator.tune_allocator``, which ``import ragen`` applies), so a worker's RSS stays at its peak
between steps unless they are trimmed (``release_free_memory`` after each update). The trainer logs
``memory/<process>_rss_gb`` and ``memory/<process>_peak_gb`` every step, where a leak shows as growth from step
to step.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import resource
import sys

_GB = 1024**3


def rss_gb() -> float:
    """Resident set size of this process now, in GiB (Linux: /proc/self/statm; elsewhere the peak)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            pages = int(fh.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / _GB
    except (OSError, ValueError, IndexError):
        return peak_rss_gb()


def peak_rss_gb() -> float:
    """Peak resident set size of this process so far, in GiB.

    Linux: ``VmHWM`` of /proc/self/status, the high-water mark of this process image. (``ru_maxrss`` is not: a
    process started by fork + exec starts from the resident set its parent had at the fork, so a worker or test
    child spawned by a large parent would report the parent's size as its own peak.) Elsewhere ``ru_maxrss``
    (bytes on macOS)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024 / _GB
    except (OSError, ValueError, IndexError):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / _GB if sys.platform == "darwin" else peak * 1024 / _GB


def release_free_memory() -> None:
    """Return freed heap pages to the OS (glibc ``malloc_trim(0)``); a no-op where glibc is not the allocator."""
    name = ctypes.util.find_library("c")
    if not name or not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(name).malloc_trim(0)
    except (OSError, AttributeError):
        return


def memory_stats() -> dict[str, float]:
    """``{"rss_gb": ..., "peak_gb": ...}`` of this process."""
    return {"rss_gb": rss_gb(), "peak_gb": peak_rss_gb()}
