"""The peak RSS a process reports is its own: a child started by a large parent does not report the parent's size
(``ru_maxrss`` would: on Linux it starts from the parent's resident set at the fork)."""

from __future__ import annotations

import mmap
import subprocess
import sys

import pytest

from ragen.utils.memory import peak_rss_gb, rss_gb

CHILD = "from ragen.utils.memory import peak_rss_gb; print(peak_rss_gb())"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fork + exec inheritance is Linux's")
def test_a_child_of_a_large_parent_reports_its_own_peak():
    block = mmap.mmap(-1, 600 * 1024 * 1024)  # 600 MiB resident in this (parent) process
    for offset in range(0, len(block), mmap.PAGESIZE):
        block[offset] = 1
    try:
        assert rss_gb() > 0.55 and peak_rss_gb() > 0.55
        child = float(subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                                     check=True).stdout.strip())
    finally:
        block.close()
    # the child imports little (ragen.utils.memory, ~0.05 GiB); the parent held more than 0.55 GiB at the fork
    assert child < 0.3, child
