"""The attention implementation the trainer's models run (``model.attn_implementation``), resolved per device.

Values (transformers 5.x names):

- ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` (transformers' default; every device);
- ``eager``: transformers' plain matmul-softmax attention (every device; slower, for debugging and comparison);
- ``flash_attention_2``: the ``flash_attn`` package's kernels (CUDA, bf16 / fp16 compute only). Its variable-length
  kernel runs a micro-batch as one row of concatenated sequences without padding (``ragen.models.packing``);
- ``auto``: ``flash_attention_2`` where ``flash_attn`` is importable, the device is CUDA and the compute precision
  resolves to bf16 (flash-attn has no fp32 kernels), else ``sdpa``.

Every model that trains or computes log-probs (the actor, reference and critic workers) loads with the resolved
value; each worker resolves ``auto`` on its own device with its own ``mixed_precision``, so the summary a CPU driver
prints (:func:`attention_summary`) assumes the workers' device is the run's ``trainer.device``.
"""

from __future__ import annotations

import importlib.util

import torch

from ragen.utils.hardware import resolve_precision

ATTN_IMPLEMENTATIONS = ("auto", "sdpa", "eager", "flash_attention_2")
FLASH = "flash_attention_2"
FLASH_INSTALL = "pip install flash-attn --no-build-isolation (after the CUDA build of torch; docs/gpu.md)"


def flash_attn_installed() -> bool:
    """True when the ``flash_attn`` package can be imported (located, not imported: importing it needs CUDA)."""
    try:
        return importlib.util.find_spec("flash_attn") is not None
    except (ValueError, ImportError):  # a module in sys.modules without a spec, or a broken parent package
        return False


def resolve_attn_implementation(setting: str, device: torch.device | str, mixed_precision: str = "auto"
                                ) -> tuple[str, str]:
    """(the implementation ``setting`` means for a model computing on ``device`` under ``mixed_precision``, a
    one-line reason). ``auto``: see the module docstring; explicit values pass through unchanged (the config
    checks refuse ``flash_attention_2`` where it cannot run: ``ragen.trainer.config.shared_checks.check_attention``)."""
    if setting not in ATTN_IMPLEMENTATIONS:
        raise ValueError(f"model.attn_implementation={setting!r} is unknown; use one of {ATTN_IMPLEMENTATIONS}")
    if setting != "auto":
        return setting, "set explicitly"
    if torch.device(device).type != "cuda":
        return "sdpa", "no CUDA device"
    if not flash_attn_installed():
        return "sdpa", "flash_attn is not installed"
    if resolve_precision(mixed_precision, device)[0] != "bf16":
        return "sdpa", "fp32 compute (flash-attn computes in bf16 / fp16 only)"
    return FLASH, "flash_attn installed, CUDA, bf16 compute"


def flash_problems(device: torch.device | str, mixed_precisions: dict[str, str]) -> list[str]:
    """Why ``flash_attention_2`` cannot run on ``device`` for the roles of ``mixed_precisions`` (role ->
    ``mixed_precision`` setting); empty when it can. Each names the fix."""
    out = []
    if not flash_attn_installed():
        out.append(f"the flash_attn package is not installed: {FLASH_INSTALL}")
    if torch.device(device).type != "cuda":
        out.append(f"it needs a CUDA device (the workers run on {torch.device(device).type}): set trainer.device=cuda "
                   "on a GPU machine, or model.attn_implementation=auto / sdpa")
    fp32 = [role for role, setting in mixed_precisions.items() if resolve_precision(setting, device)[0] != "bf16"]
    if fp32 and torch.device(device).type == "cuda":
        keys = ", ".join(f"{role}.mixed_precision" for role in fp32)
        out.append(f"flash-attn has no fp32 kernels, and {keys} resolve(s) to fp32: set it to bf16 or auto, or use "
                   "model.attn_implementation=auto (sdpa for fp32 models)")
    return out
