"""``tune_process`` (ragen/allocator.py, which ragen's programs call first) keeps large blocks in glibc's heap unless
turned off or the user chose; ``import ragen`` alone leaves glibc's defaults (tests/utils/test_process_settings.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from mallinfo_probe import MMAP_BLOCK_PROBE

# mallinfo2().hblks counts the blocks glibc currently serves with their own mmap; a 100 MiB bytearray is one such
# block under glibc's defaults (threshold at most 32 MiB) and none once tune_process raised the threshold to 1 GiB.
PROBE = """
import ctypes, ragen.allocator
{setup}
""" + MMAP_BLOCK_PROBE + """print(ragen.allocator.ALLOCATOR_TUNED, libc.mallinfo2().hblks - before)
"""

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt is Linux-only")


def _probe(setup: str = "ragen.allocator.tune_process()", **env_extra: str) -> tuple[str, int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "RAGEN_TUNE_MALLOC", "GLIBC_TUNABLES"))}
    env.update(env_extra)
    tuned, mmapped = subprocess.run([sys.executable, "-c", PROBE.format(setup=setup)], env=env, capture_output=True,
                                    text=True, check=True).stdout.split()
    return tuned, int(mmapped)


def test_tune_process_serves_a_100mib_block_from_the_heap():
    assert _probe() == ("True", 0)


def test_the_flag_says_whether_a_program_applied_the_settings():
    assert _probe(setup="") == ("False", 1)  # imported, not applied: glibc's defaults


def test_opt_out_leaves_glibc_defaults():
    assert _probe(RAGEN_TUNE_MALLOC="0") == ("False", 1)


def test_the_users_own_malloc_settings_win():
    # the user's threshold (64 MiB) is glibc's to apply; ragen does not override it, so 100 MiB is mmapped
    assert _probe(MALLOC_MMAP_THRESHOLD_=str(64 * 2**20)) == ("False", 1)
