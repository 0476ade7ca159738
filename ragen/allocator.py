"""glibc malloc settings for training processes, applied by ``import ragen`` (imports nothing heavy: no torch).

By default glibc serves every block above a threshold (128 KiB, raised dynamically up to 32 MiB) with its own
``mmap`` and unmaps it on free, so each new activation or logits block of a forward/backward starts as fresh pages
the kernel must fault in and zero: ~11% of a FrozenLake run's CPU time was system time (``/usr/bin/time -v``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

# glibc mallopt parameters (malloc.h) and the values ``tune_allocator`` sets.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_ALLOCATOR_SETTINGS = ((_M_MMAP_THRESHOLD, 1 << 30), (_M_TRIM_THRESHOLD, 1 << 30))
_USER_VARS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES")
OPT_OUT = "RAGEN_TUNE_MALLOC"


def tune_allocator() -> bool:
    """Let glibc reuse freed blocks of up to 1 GiB from its heap instead of unmapping them (``mallopt``).

    Blocks below 1 GiB come from the heap, and freed memory stays there (up to 1 GiB at its top) for the next
    micro-batch, so the page faults and zeroing of fresh ``mmap`` pages go (``bench/train_step.py`` prints system
    time and page faults; compare a run with ``RAGEN_TUNE_MALLOC=0``). Numerics are unchanged; memory is still
    handed back after each update (``ragen.utils.memory.release_free_memory`` trims explicitly). Returns whether
    the settings were applied: not when ``RAGEN_TUNE_MALLOC=0``, when the user set glibc's own malloc variables
    (theirs win), or where glibc is not the allocator.
    """
    if os.environ.get(OPT_OUT, "1") == "0" or any(v in os.environ for v in _USER_VARS):
        return False
    name = ctypes.util.find_library("c")
    if not name or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False
    return all(mallopt(param, value) == 1 for param, value in _ALLOCATOR_SETTINGS)


