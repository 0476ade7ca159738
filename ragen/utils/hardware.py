"""Which float precision is fast on the hardware we run on: the ``auto`` precision settings resolve here.

bf16 pays off only where the hardware computes it natively: CUDA GPUs with bf16 support (Ampere and later)
and CPUs with AVX512_BF16 or AMX (Cooper Lake / Sapphire Rapids, Zen 4 and later), where a bf16 matmul runs
~4x faster than fp32. On an AVX2-only CPU torch emulates bf16 and a matmul runs ~60x slower than fp32
(measured 0.8 vs 49 GFLOP/s), so training there in bf16 crawls. ``auto`` therefore means bf16 exactly when
the device has native bf16, else fp32.

Detection (``bf16_support``), cached per device:
  - CUDA: ``torch.cuda.is_bf16_supported()`` (assumed true when the process sees no GPU, e.g. a CPU-only Ray
    driver: the GPU workers resolve ``auto`` again on their own device).
  - CPU with an x86 ``flags`` line in ``/proc/cpuinfo`` (Linux): native iff it lists ``avx512_bf16`` or
    ``amx_bf16``.
  - any other CPU (macOS, Windows, ARM Linux): a ~10 ms probe; native iff a 128 x 128 bf16 matmul beats fp32.
Override: ``RAGEN_NATIVE_BF16=1`` / ``=0`` forces the answer on every device (tests use it to simulate the other
kind of machine; users can use it when detection is wrong). It is read on every call, never cached.
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path

import torch

ENV_VAR = "RAGEN_NATIVE_BF16"
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
MIXED_PRECISIONS = ("auto", "bf16", "fp32")  # actor / critic ``mixed_precision``
ENGINE_DTYPES = ("auto", "bfloat16", "float32", "float16")  # ``rollout.dtype``
_ENV_VALUES = {"1": True, "true": True, "0": False, "false": False}


def cpu_flags(cpuinfo: str) -> set[str] | None:
    """The x86 feature flags of ``/proc/cpuinfo`` text (first ``flags`` line), or None when there is none."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            return set(value.split())
    return None


def bf16_matmul_probe(size: int = 128, repeats: int = 3) -> bool:
    """True when a ``size``-square bf16 matmul on the CPU is faster than fp32 (best of ``repeats``; ~10 ms)."""

    def best(dtype: torch.dtype) -> float:
        a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
        a @ b  # warm-up: kernel selection, first-touch allocation
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - start)
        return min(times)

    return best(torch.bfloat16) < best(torch.float32)


def _cpu_support(cpuinfo_path: str = "/proc/cpuinfo") -> tuple[bool, str]:
    """(native, reason) for this machine's CPU: cpuinfo flags when there are x86 flags, else the probe."""
    path = Path(cpuinfo_path)
    flags = cpu_flags(path.read_text(errors="replace")) if path.is_file() else None
    if flags is None:
        if bf16_matmul_probe():
            return True, "CPU bf16 matmul measured faster than fp32"
        return False, "CPU bf16 matmul measured slower than fp32 (no native bf16)"
    found = sorted(flags.intersection(CPU_BF16_FLAGS))
    if found:
        return True, f"CPU has native bf16 ({'/'.join(found)} flag)"
    return False, "CPU has no native bf16 (no avx512_bf16/amx_bf16 flag)"


@functools.cache
def _detect(device_type: str) -> tuple[bool, str]:
    """Cached hardware detection for a device type (``cpu`` / ``cuda``); see the module docstring."""
    if device_type == "cuda":
        if not torch.cuda.is_available():
            return True, "CUDA assumed to support bf16 (no GPU visible in this process)"
        if torch.cuda.is_bf16_supported():
            return True, "CUDA device supports bf16"
        return False, "CUDA device has no bf16 support (pre-Ampere)"
    if device_type == "cpu":
        return _cpu_support()
    return False, f"no bf16 detection for device type {device_type!r}"


def bf16_support(device: torch.device | str) -> tuple[bool, str]:
    """(True if ``device`` computes bf16 natively, a short reason). ``RAGEN_NATIVE_BF16`` overrides detection."""
    forced = os.environ.get(ENV_VAR)
    if forced is not None and forced.strip() != "":
        value = _ENV_VALUES.get(forced.strip().lower())
        if value is None:
            raise ValueError(f"{ENV_VAR}={forced!r} is not understood; set it to 1 (native bf16), 0 (none) or unset it")
        return value, f"{ENV_VAR}={forced.strip()}"
    return _detect(torch.device(device).type)


def native_bf16(device: torch.device | str) -> bool:
    """True if ``device`` computes bf16 natively (so bf16 is the fast choice there)."""
    return bf16_support(device)[0]


def resolve_precision(setting: str, device: torch.device | str) -> tuple[str, str]:
    """The concrete mixed precision (``bf16`` / ``fp32``) for ``setting`` on ``device``, and a one-line reason.

    ``auto`` picks bf16 exactly when the device has native bf16; ``bf16`` / ``fp32`` pass through unchanged.
    """
    if setting not in MIXED_PRECISIONS:
        raise ValueError(f"mixed_precision={setting!r} is unknown; use one of {MIXED_PRECISIONS}")
    if setting != "auto":
        return setting, f"{setting}: set explicitly"
    native, why = bf16_support(device)
    choice = "bf16" if native else "fp32"
    return choice, f"{choice}: {why}"


def resolve_dtype(setting: str, device: torch.device | str) -> tuple[str, str]:
    """The concrete engine weight dtype (``bfloat16`` / ``float32``) for ``setting`` on ``device``, and a reason.

    Same rule as :func:`resolve_precision` in the engines' vocabulary; explicit dtypes pass through unchanged.
    """
    if setting not in ENGINE_DTYPES:
        raise ValueError(f"rollout.dtype={setting!r} is unknown; use one of {ENGINE_DTYPES}")
    if setting != "auto":
        return setting, f"{setting}: set explicitly"
    choice, why = resolve_precision("auto", device)
    dtype = "bfloat16" if choice == "bf16" else "float32"
    return dtype, f"{dtype}{why[len(choice):]}"
