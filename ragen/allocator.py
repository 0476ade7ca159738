"""Process settings of ragen's programs: OpenMP's wait policy and glibc's malloc thresholds (imports nothing heavy:
no torch).

``import ragen`` changes nothing in the importing process: a library user keeps their own settings. The programs
ragen starts apply these first thing, before torch loads its OpenMP runtime: the ``ragen`` console script
(``ragen.cli.main``), the ``python -m ragen.<command>`` modules, Ray worker processes (their setup hook,
``ragen.plugins.load_plugins_from_environ``), the test suite (``tests/conftest.py``) and the bench scripts. Each
calls :func:`tune_process`.

* OpenMP threads that finish a parallel region spin-wait for the next one by default. When another process computes
  on the same cores (a second run, a Ray worker, the test suite) those spinning threads take the cores from it
  (``bench/omp_wait_policy.py`` on 2 cores: beside one competing process passive is 1.49x faster, alone 8% slower;
  with real training jobs beside it 20-37 s vs 8-9 s). libgomp reads the variable when torch loads it, so it must be
  set before ``import torch``; child processes (Ray workers of a local cluster, vLLM's engine) inherit it.
* By default glibc serves every block above a threshold (128 KiB, raised dynamically up to 32 MiB) with its own
  ``mmap`` and unmaps it on free, so each new activation or logits block of a forward/backward starts as fresh
  pages the kernel must fault in and zero: ~11% of a FrozenLake run's CPU time was system time
  (``/usr/bin/time -v``). :func:`tune_allocator` keeps such blocks in the heap; it applies to the calling process
  only (children call it themselves) and may be called at any time.
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
WAIT_POLICY_VAR = "OMP_WAIT_POLICY"

ALLOCATOR_TUNED = False
"""Whether :func:`tune_allocator` applied its settings in this process (False until a program calls it; read it as
``ragen.allocator.ALLOCATOR_TUNED``, not through ``from ... import``, which copies the value at import)."""


def tune_process() -> bool:
    """Apply the process settings of ragen's programs; call it first thing, before anything imports torch.

    Sets ``OMP_WAIT_POLICY=PASSIVE`` unless the variable is set (a user's ``OMP_WAIT_POLICY=ACTIVE`` on a dedicated
    machine wins), then :func:`tune_allocator`. Idempotent. Returns whether the malloc settings were applied."""
    os.environ.setdefault(WAIT_POLICY_VAR, "PASSIVE")
    return tune_allocator()


def tune_allocator() -> bool:
    """Let glibc reuse freed blocks of up to 1 GiB from its heap instead of unmapping them (``mallopt``).

    Blocks below 1 GiB come from the heap, and freed memory stays there (up to 1 GiB at its top) for the next
    micro-batch, so the page faults and zeroing of fresh ``mmap`` pages go (``bench/train_step.py`` prints system
    time and page faults; compare a run with ``RAGEN_TUNE_MALLOC=0``). Numerics are unchanged; memory is still
    handed back after each update (``ragen.utils.memory.release_free_memory`` trims explicitly). Returns whether
    the settings were applied (also kept in :data:`ALLOCATOR_TUNED`): not when ``RAGEN_TUNE_MALLOC=0``, when the
    user set glibc's own malloc variables (theirs win), or where glibc is not the allocator.
    """
    global ALLOCATOR_TUNED
    ALLOCATOR_TUNED = _apply_mallopt()
    return ALLOCATOR_TUNED


def _apply_mallopt() -> bool:
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
