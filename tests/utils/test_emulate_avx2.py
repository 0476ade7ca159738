"""scripts/emulate_avx2.sh runs a command as on an AVX2-only CPU: torch's kernels at AVX2 and ragen's ``auto``
precision resolving to fp32 (the other machine kind CI and developers may have)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "emulate_avx2.sh"
PROBE = ("import torch; from ragen.utils.hardware import resolve_dtype, resolve_precision; "
         "print(torch.backends.cpu.get_cpu_capability(), resolve_precision('auto', 'cpu')[0], "
         "resolve_dtype('auto', 'cpu')[0])")


def test_emulated_machine_has_avx2_kernels_and_auto_picks_fp32():
    env = {k: v for k, v in os.environ.items() if k != "RAGEN_NATIVE_BF16"}
    out = subprocess.run(["bash", str(SCRIPT), sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                         check=True)
    assert out.stdout.split() == ["AVX2", "fp32", "float32"], out.stdout + out.stderr


def test_no_command_is_a_usage_error():
    out = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True)
    assert out.returncode == 2 and "usage" in out.stderr
