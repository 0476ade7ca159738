"""Trainer-state helpers: what a checkpoint stores besides the models, and RNG isolation for validation."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from ragen.utils.redaction import redact
from ragen.utils.seeding import get_rng_state, set_rng_state


def save_trainer_state(path: str | Path, *, step: int, rng: dict[str, Any], proxy: dict[str, int],
                       warm_started: bool = False, **extra: Any) -> None:
    """Step counter, RNG states, the agent proxy's seed counters, whether the warm start ran and what else the
    trainer keeps (``extra``, e.g. the ArCHer trainer's ``episodes_seen``), with ``torch.save``."""
    state = {"step": int(step), "rng": rng, "proxy": redact(dict(proxy)), "warm_started": bool(warm_started), **extra}
    torch.save(state, path)


@contextmanager
def rng_preserved() -> Iterator[None]:
    """Run a block (e.g. validation) without changing the Python / NumPy / torch RNG streams."""
    state = get_rng_state()
    try:
        yield
    finally:
        set_rng_state(state)


def trim_metrics(path: str | Path, step: int | None) -> list[dict[str, float]]:
    """Keep the records of steps <= ``step`` in a metrics JSONL (drop what a crash logged past the checkpoint);
    ``step=None`` (a fresh start) keeps none.

    Returns the kept records (the run's history so far); a missing file gives [].
    """
    path = Path(path)
    if not path.is_file():
        return []
    with path.open(encoding="utf-8") as fh:
        records = [json.loads(line) for line in fh if line.strip()]
    kept = [r for r in records if r.get("step", 0) <= step] if step is not None else []
    with path.open("w", encoding="utf-8") as fh:
        for r in kept:
            fh.write(json.dumps(r) + "\n")
    return kept
