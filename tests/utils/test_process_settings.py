"""Importing ragen changes nothing in the process; ragen's programs apply their process settings themselves
(ragen/allocator.py ``tune_process``): ``OMP_WAIT_POLICY=PASSIVE`` before torch loads its OpenMP runtime (spinning
threads of one process take the cores from another on a shared CPU) and glibc keeping large blocks in its heap.

Each case runs in a fresh interpreter with neither setting inherited. A probe watches the environment at the moment
torch is first imported (libgomp reads the policy then) and, at the end, allocates a 100 MiB block: glibc serves it
with its own mmap under its defaults (threshold at most 32 MiB) and from the heap once tuned (threshold 1 GiB)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from mallinfo_probe import MMAP_BLOCK_PROBE

from ragen.trainer import builders
from ragen.trainer.config.compose import load_train_config

PROBE = """
import ctypes, importlib.abc, os, sys
seen = []
class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "torch" and not seen:
            seen.append(os.environ.get("OMP_WAIT_POLICY"))
sys.meta_path.insert(0, Watch())
sys.argv = {argv!r}
try:
{body}
except SystemExit:
    pass
""" + MMAP_BLOCK_PROBE + """print("PROBE", seen[0] if seen else "torch-not-imported", libc.mallinfo2().hblks - before)
"""

# (argv, the program's start as its launcher runs it)
ENTRY_POINTS = {
    "python -m ragen.train": (["python -m ragen.train", "--help"],
                              "import runpy; runpy.run_module('ragen.train', run_name='__main__')"),
    "python -m ragen.eval": (["python -m ragen.eval", "--help"],
                             "import runpy; runpy.run_module('ragen.eval', run_name='__main__')"),
    "python -m ragen.archer": (["python -m ragen.archer", "--help"],
                               "import runpy; runpy.run_module('ragen.archer', run_name='__main__')"),
    "ragen (console script)": (["ragen", "train", "--help"],  # setup.py: ragen = ragen.cli:main
                               "from ragen.cli import main; main()"),
}

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt is Linux-only")


def _probe(argv: list[str], body: str, **env_extra: str) -> tuple[str, int]:
    """(OMP_WAIT_POLICY when torch was first imported, blocks glibc mmapped for a 100 MiB allocation afterwards)."""
    env = {k: v for k, v in os.environ.items()
           if k != "OMP_WAIT_POLICY" and not k.startswith(("MALLOC_", "RAGEN_TUNE_MALLOC", "GLIBC_TUNABLES"))}
    env.update(env_extra)
    code = PROBE.format(argv=argv, body="\n".join("    " + line for line in body.split("; ")))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    _, omp, mmapped = out.strip().splitlines()[-1].split()
    return omp, int(mmapped)


def test_importing_ragen_changes_nothing_in_the_process():
    # the library's whole stack, as a user's script imports it: glibc's defaults, OpenMP's default policy
    assert _probe(["probe"], "import ragen; import ragen.launch") == ("None", 1)


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_entry_points_apply_the_process_settings_before_torch_loads(entry):
    argv, start = ENTRY_POINTS[entry]
    assert _probe(argv, start) == ("PASSIVE", 0)


def test_the_users_choices_win_in_an_entry_point():
    argv, start = ENTRY_POINTS["python -m ragen.train"]
    assert _probe(argv, start, OMP_WAIT_POLICY="ACTIVE") == ("ACTIVE", 0)
    assert _probe(argv, start, RAGEN_TUNE_MALLOC="0") == ("PASSIVE", 1)


def test_ray_workers_apply_the_process_settings_in_their_setup_hook(monkeypatch):
    """The hook ``start_ray`` gives Ray runs in each worker before it imports torch (Ray imports no torch itself);
    run here in a fresh process as a worker runs it."""
    calls = []

    class FakeRay:
        def is_initialized(self):
            return False

        def init(self, **kw):
            calls.append(kw)

    monkeypatch.setitem(sys.modules, "ray", FakeRay())
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    builders.start_ray(load_train_config("base", ["model=tiny", "trainer.use_ray=true"]))
    module, _, function = calls[0]["runtime_env"]["worker_process_setup_hook"].rpartition(".")
    hook = f"import {module}; {module}.{function}(); import torch"
    assert _probe(["ray worker"], hook) == ("PASSIVE", 0)
