"""Seeding and RNG state capture, so a resumed run continues the random streams of the original one."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed Python's ``random``, NumPy and torch (CPU and, when present, CUDA) with ``seed``."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def get_rng_state() -> dict[str, Any]:
    """The RNG states of ``random``, NumPy and torch, in a form ``torch.save`` can store.

    CUDA: only this process's current device's generator (``"cuda"``: one state tensor). A process computes on one
    device, and a checkpoint must resume on a node with any number of GPUs.
    """
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state(torch.cuda.current_device())
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore states captured by :func:`get_rng_state` (the CUDA state only when CUDA is present, into the current
    device's generator). A checkpoint holding a list of per-device CUDA states (written before states were saved
    per device) restores the entry of the current device's index when it has one, and no CUDA state otherwise."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" not in state or not torch.cuda.is_available():
        return
    device, saved = torch.cuda.current_device(), state["cuda"]
    if isinstance(saved, (list, tuple)):
        if device >= len(saved):
            return
        saved = saved[device]
    torch.cuda.set_rng_state(saved, device)
