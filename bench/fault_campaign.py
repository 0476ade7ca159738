"""What both kill campaigns (``bench/faults.py``, ``bench/faults_trainer.py``) share: the report, where a kill
landed, and which step a run must resume from after it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ragen.utils.checkpoint import list_checkpoints, resolve_resume

KEEP_LAST = 2


@dataclass
class KillReport:
    """Counts of one kill campaign: ``resumed`` of ``tried`` kills resumed from a complete, correct checkpoint (or
    started over from step 0 when no save had ever finished)."""

    tried: int = 0
    resumed: int = 0
    save_seconds: float = 0.0
    phases: Counter = field(default_factory=Counter)
    lost_steps: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)


def kill_phase(root: Path, step: int) -> str:
    """Where the kill landed, read from the folder the killed process left (see ragen.utils.checkpoint's order)."""
    names = {p.name for p in root.iterdir()} if root.is_dir() else set()
    tmp = root / f".tmp_global_step_{step}"
    if tmp.is_dir():
        return "marked-not-renamed" if (tmp / "COMPLETE").is_file() else "writing"
    if f"global_step_{step}" in names:
        pruning = len(list_checkpoints(root)) > KEEP_LAST or any(n.startswith(".del_") for n in names)
        return "installed-pruning" if pruning else "done"
    return "before-write"


def resumed_step(root: Path, verify: Callable[[Path], int], finished: int) -> int:
    """The step ``trainer.resume=auto`` continues from after a kill: the latest complete checkpoint's (``verify``
    checks it and returns its step), or 0 when none exists and no save had finished yet (``finished`` = the
    highest step whose save completed before the kill, 0 = none): a kill during the first save of an empty folder
    loses nothing, starting over is the correct outcome. A missing checkpoint after a finished save raises."""
    path = resolve_resume("auto", root) if root.is_dir() else None
    if path is None:
        if finished > 0:
            raise AssertionError(f"no complete checkpoint after the kill, though step {finished} had been saved")
        return 0
    return verify(path)
