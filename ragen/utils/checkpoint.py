"""Crash-safe checkpoint folders: write into a temporary folder, mark it complete, then rename.

Layout under a run's checkpoint root::

    global_step_4/           complete checkpoint (has COMPLETE)
    global_step_8/
    .tmp_global_step_12/     being written (or left by a crash: ignored, removed on the next write)

A rename within one filesystem is atomic, so a kill at any moment leaves every ``global_step_*``
folder whole; ``latest_checkpoint`` only considers folders with the ``COMPLETE`` marker.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path

COMPLETE_MARKER = "COMPLETE"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


def checkpoint_dir(root: str | Path, step: int) -> Path:
    """The final folder of the checkpoint taken after ``step`` training steps."""
    return Path(root) / f"global_step_{step}"


def is_complete(path: str | Path) -> bool:
    """True when ``path`` is a checkpoint folder whose writing finished."""
    return (Path(path) / COMPLETE_MARKER).is_file()


def checkpoint_step(path: str | Path) -> int:
    """The step recorded in a complete checkpoint's marker."""
    return int(json.loads((Path(path) / COMPLETE_MARKER).read_text())["step"])


def list_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``root`` as ``(step, path)``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        m = _STEP_DIR.match(child.name)
        if m and child.is_dir() and is_complete(child):
            found.append((int(m.group(1)), child))
    return sorted(found)


def latest_checkpoint(root: str | Path) -> Path | None:
    """The complete checkpoint with the highest step, or None."""
    found = list_checkpoints(root)
    return found[-1][1] if found else None


def remove_partial(root: str | Path) -> list[Path]:
    """Delete temporary folders left by interrupted writes; returns what was removed."""
    root = Path(root)
    removed = []
    if root.is_dir():
        for child in root.iterdir():
            if child.name.startswith(".tmp_global_step_"):
                shutil.rmtree(child, ignore_errors=True)
                removed.append(child)
    return removed


def write_checkpoint(
    root: str | Path, step: int, writer: Callable[[Path], None], *, keep_last: int | None = None
) -> Path:
    """Write the checkpoint of ``step`` atomically and return its final folder.

    ``writer(tmp_dir)`` saves everything into ``tmp_dir``. Only after it returns is the ``COMPLETE`` marker
    written and the folder renamed to ``global_step_<step>``. If ``writer`` raises, the temporary folder is
    left behind (and ignored) and earlier checkpoints are untouched. ``keep_last`` prunes older complete
    checkpoints after a successful write (None keeps all).
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    remove_partial(root)
    tmp = root / f".tmp_global_step_{step}"
    tmp.mkdir()
    writer(tmp)
    marker = tmp / COMPLETE_MARKER
    with marker.open("w") as fh:
        json.dump({"step": step, "time": time.time()}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    final = checkpoint_dir(root, step)
    if final.exists():  # re-saving a step (e.g. after resume): move the old one aside first
        old = root / f".tmp_global_step_{step}_old"
        final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(final)
    if keep_last is not None and keep_last > 0:
        for _, path in list_checkpoints(root)[:-keep_last]:
            shutil.rmtree(path, ignore_errors=True)
    return final


def resolve_resume(resume: str, root: str | Path) -> Path | None:
    """Map ``trainer.resume`` to a checkpoint folder.

    ``"none"`` -> None (start fresh); ``"auto"`` -> the latest complete checkpoint under ``root`` or None;
    anything else is a path that must be a complete checkpoint.
    """
    if resume in ("none", "", None):
        return None
    if resume == "auto":
        return latest_checkpoint(root)
    path = Path(resume)
    if not is_complete(path):
        raise FileNotFoundError(
            f"trainer.resume={resume!r} is not a complete checkpoint folder (no {COMPLETE_MARKER} marker); "
            "pass a global_step_<n> folder, 'auto' or 'none'"
        )
    return path
