"""Fused CPU path of the GAE family: one C++ pass per row instead of a dozen (B, T) tensor passes.

On the CPU, :mod:`ragen.algorithms.gae` is memory-bound: its tensor formulation reads and writes (B, T) data a
dozen times. The C++ kernel (``_gae_kernel.cpp``, built by ``setup.py`` as an optional extension) reads every
input once per row and writes each output once, checking the turn-id contract on the way; the maths is the same
and is documented in :mod:`ragen.algorithms.gae` and ``_gae_kernel.cpp``. :mod:`gae` takes this path for CPU
tensors when the extension is built, and otherwise (CUDA tensors, no C++ compiler at install time) its tensor
code. Both paths are tested against the loop references of :mod:`ragen.algorithms.reference`.

``RAGEN_FUSED_GAE=0`` in the environment, or the :func:`disabled` context manager, forces the tensor path
(the tests and ``bench/advantages.py`` use it to check and time both). A build older than the ``.cpp`` beside
it (an editable install after the source changed) is not used: a warning says to run ``pip install -e .``.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor

from ragen.algorithms.inputs import contract_error
from ragen.algorithms.scan import TURN_ORDER_ERROR


def _load_kernel(source: Path = Path(__file__).with_name("_gae_kernel.cpp")) -> ModuleType | None:
    """The built extension, or None when it is missing or older than ``source`` (present in a checkout, not in a
    wheel)."""
    try:  # built by `pip install -e .` (setup.py); absent without a C++ compiler
        from ragen.algorithms import _gae_kernel as kernel
    except ImportError:  # pragma: no cover - depends on the install
        return None
    if source.exists() and hashlib.sha256(source.read_bytes()).hexdigest()[:16] != kernel.SOURCE_HASH:
        warnings.warn(
            f"{kernel.__file__} was built from an older {source.name}; using the tensor code for the GAE family. "
            "Rebuild it with `pip install -e .`", RuntimeWarning, stacklevel=2,
        )
        return None
    return kernel


_gae_kernel = _load_kernel()

MODES = {"gae": 0, "turn_gae": 1, "bilevel_gae": 2, "weighted_gae": 3}
_ERR_CONTRACT, _ERR_TURN_ORDER = 1, 2
_MASK_DTYPES = (torch.bool, torch.uint8, torch.int64)
_state = {"enabled": os.environ.get("RAGEN_FUSED_GAE", "1") != "0", "warned": False}


def available() -> bool:
    """True when the C++ extension is built and current (whether or not it is currently enabled)."""
    return _gae_kernel is not None


@contextmanager
def disabled() -> Iterator[None]:
    """Within the block, the GAE family uses its tensor implementation even on CPU tensors."""
    before = _state["enabled"]
    _state["enabled"] = False
    try:
        yield
    finally:
        _state["enabled"] = before


def usable(*tensors: Tensor | None) -> bool:
    """Whether the fused kernel will run on these (B, T) tensors: built, enabled, and all of them on the CPU.

    The first CPU call that finds the kernel missing warns once (the tensor code is several times slower there).
    """
    if not (_state["enabled"] and all(t is None or (t.device.type == "cpu" and t.dim() == 2) for t in tensors)):
        return False
    if _gae_kernel is None and not _state["warned"]:
        _state["warned"] = True
        warnings.warn(
            "ragen.algorithms._gae_kernel is not built, so the GAE family runs its slower tensor code on CPU "
            "tensors; build it with `pip install -e .` (needs a C++ compiler), or set RAGEN_FUSED_GAE=0 to "
            "silence this", RuntimeWarning, stacklevel=3,
        )
    return _gae_kernel is not None


def gae_family(
    name: str,
    token_rewards: Tensor,
    values: Tensor,
    response_mask: Tensor,
    turn_ids: Tensor | None,
    bootstrap: Tensor | None,
    *,
    dtype: torch.dtype,
    gamma: float = 1.0,
    lam: float = 1.0,
    high_level_gamma: float = 0.95,
    high_level_lam: float = 1.0,
    turn_level_weight: float = 0.0,
    skip_env_tokens: bool = True,
    return_mode: str = "adv_plus_value",
) -> tuple[Tensor, Tensor]:
    """(adv, ret), each (B, T) of ``dtype`` (float32 or float64), exactly 0 off ``response_mask``.

    name: one of :data:`MODES`. token_rewards, values: (B, T), any float dtype (converted to ``dtype``).
    response_mask: (B, T), > 0 on model tokens. turn_ids: (B, T) integer (k on turn k, -1 elsewhere), or
    None for ``gae``, whose units are then the runs of consecutive model tokens. bootstrap: (B,) value after a
    row's last step, or None (0). The scalars mean what they mean in :mod:`ragen.algorithms.gae` (``return_mode``
    is checked there). Raises ValueError, naming the row and position, when ``turn_ids`` breaks the contract
    (>= 0 exactly on model tokens; each row's turns numbered 0, 1, ... as contiguous runs).
    """
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"the fused GAE kernel computes in float32 or float64, got dtype={dtype}")
    B, T = token_rewards.shape
    for label, t in (("values", values), ("response_mask", response_mask), ("turn_ids", turn_ids)):
        if t is not None and tuple(t.shape) != (B, T):  # the kernel reads B * T entries of each
            raise ValueError(f"{label} must have the shape of token_rewards {(B, T)}, got {tuple(t.shape)}")
    if bootstrap is not None and tuple(bootstrap.shape) != (B,):
        raise ValueError(f"bootstrap must be a ({B},) tensor, got shape {tuple(bootstrap.shape)}")
    if B * T == 0:  # empty tensors have no storage to hand to the kernel (data_ptr() is 0)
        return torch.zeros(B, T, dtype=dtype), torch.zeros(B, T, dtype=dtype)
    r = token_rewards.to(dtype).contiguous()
    v = values.to(dtype).contiguous()
    # the kernel reads byte and int64 masks as they are (as mask > 0); other dtypes become bool
    mask = response_mask if response_mask.dtype in _MASK_DTYPES else response_mask > 0
    mask = mask.contiguous()
    ids = None if turn_ids is None else turn_ids.to(torch.int64).contiguous()
    boot = torch.zeros(B, dtype=torch.float64) if bootstrap is None else bootstrap.to(torch.float64).contiguous()
    adv, ret = torch.empty(B, T, dtype=dtype), torch.empty(B, T, dtype=dtype)
    code, row, pos = _gae_kernel.gae_family(
        MODES[name], B, T, dtype == torch.float64, r.data_ptr(), v.data_ptr(), mask.data_ptr(), mask.element_size(),
        0 if ids is None else ids.data_ptr(), boot.data_ptr(), adv.data_ptr(), ret.data_ptr(), float(gamma),
        float(lam), float(high_level_gamma), float(high_level_lam), float(turn_level_weight), bool(skip_env_tokens),
        return_mode == "reward_to_go",
    )
    if code == _ERR_CONTRACT:
        raise contract_error(turn_ids, response_mask, row, pos)
    if code == _ERR_TURN_ORDER:
        raise ValueError(f"{TURN_ORDER_ERROR} (first break: row {row}, position {pos})")
    return adv, ret
