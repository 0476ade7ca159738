"""Importing ragen makes OpenMP threads wait passively unless the user chose otherwise (ragen/__init__.py: spinning
threads of one process take the cores from another on a shared CPU)."""

from __future__ import annotations

import os
import subprocess
import sys

PROBE = "import os, ragen, torch; print(os.environ.get('OMP_WAIT_POLICY'))"


def _run(env_extra: dict[str, str]) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_passive_by_default_and_the_users_value_wins():
    assert _run({}) == "PASSIVE"
    assert _run({"OMP_WAIT_POLICY": "ACTIVE"}) == "ACTIVE"
