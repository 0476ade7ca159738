"""Crash-safe checkpoint folders: write into a temporary folder, make it durable, mark it complete, then rename.

Layout under a run's checkpoint root::

    global_step_4/           complete checkpoint (has COMPLETE)
    global_step_8/
    .tmp_global_step_12/     being written (or left by a crash: promoted if complete, else removed)
    .old_global_step_8/      the previous copy of a step being re-saved (restored or removed on recovery)
    .del_global_step_4/      a pruned checkpoint being deleted (removed on the next write)

Ordering, so that ``kill -9`` (or a power cut) at any instant leaves every ``global_step_*`` folder whole:

1. the writer fills ``.tmp_global_step_<n>``; every file and folder in it is ``fsync``-ed;
2. the ``COMPLETE`` marker is written to ``COMPLETE.part``, fsync-ed and renamed (so a marker is never half
   written), then the folder is fsync-ed;
3. the folder is renamed to ``global_step_<n>`` (atomic within one filesystem) and the root is fsync-ed;
4. only then are older checkpoints pruned (``keep_last``): each is first renamed to ``.del_...`` (atomic), so a
   kill in the middle of a deletion never leaves a ``global_step_*`` folder with a marker but missing files.

Re-saving an existing step moves the old folder to ``.old_global_step_<n>`` before the rename;
:func:`recover_interrupted` (run before each write and by ``resume=auto``) finishes or undoes such a swap.
Any ``OSError`` while writing (disk full, read-only folder, permissions) raises :class:`CheckpointWriteError`
naming the path; the temporary folder is removed and earlier checkpoints are untouched.
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
REFERENCE_DIR = "reference"  # <run dir>/reference: the KL reference's weights after a warm start (no optimizer)
_STEP_DIR = re.compile(r"^global_step_(\d+)$")
_TMP, _OLD, _DEL = ".tmp_global_step_", ".old_global_step_", ".del_global_step_"


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (disk full, read-only or missing folder...); the message names the
    folder, the OS error and the previous complete checkpoint, which is left intact."""


def reference_dir(run_dir: str | Path) -> Path:
    """Where a run keeps its KL reference's weights once a warm start has changed the policy RL starts from: the
    actor's weights right after the warm start, written once and read by the reference worker at every resume and
    restart (no checkpoint rotation removes them)."""
    return Path(run_dir) / REFERENCE_DIR


def checkpoint_dir(root: str | Path, step: int) -> Path:
    """The final folder of the checkpoint taken after ``step`` training steps."""
    return Path(root) / f"global_step_{step}"


def is_complete(path: str | Path) -> bool:
    """True when ``path`` is a checkpoint folder whose writing finished (its marker parses)."""
    try:
        json.loads((Path(path) / COMPLETE_MARKER).read_text())["step"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return True


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


def fsync_path(path: str | Path) -> None:
    """``fsync`` one file or folder (a folder's fsync makes the names in it, e.g. after a rename, durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: str | Path) -> None:
    """``fsync`` every file and folder under ``root`` (deepest first, then ``root``)."""
    for folder, _dirs, files in os.walk(root, topdown=False):
        for name in files:
            fsync_path(os.path.join(folder, name))
        fsync_path(folder)


def _step_of(name: str, prefix: str) -> int | None:
    rest = name[len(prefix):] if name.startswith(prefix) else ""
    return int(rest) if rest.isdigit() else None


def recover_interrupted(root: str | Path) -> list[str]:
    """Finish or undo what a kill interrupted between steps 3 and 4 of the write (see the module docstring).

    * ``.tmp_global_step_<n>`` with a valid marker and no ``global_step_<n>``: the final rename was next, so it
      is done now (the checkpoint was complete);
    * ``.old_global_step_<n>``: removed when ``global_step_<n>`` exists, else renamed back.

    Returns a description of each action. Partial temporary folders are left to :func:`remove_partial`.
    """
    root = Path(root)
    if not root.is_dir():
        return []
    actions = []
    for child in sorted(root.iterdir()):
        n = _step_of(child.name, _TMP)
        if n is not None and is_complete(child) and not checkpoint_dir(root, n).exists():
            child.rename(checkpoint_dir(root, n))
            actions.append(f"promoted {child.name}")
    for child in sorted(root.iterdir()):
        n = _step_of(child.name, _OLD)
        if n is None:
            continue
        if checkpoint_dir(root, n).exists():
            shutil.rmtree(child, ignore_errors=True)
            actions.append(f"removed {child.name}")
        elif is_complete(child):
            child.rename(checkpoint_dir(root, n))
            actions.append(f"restored {child.name}")
    if actions:
        fsync_path(root)
    return actions


def remove_partial(root: str | Path) -> list[Path]:
    """Delete temporary folders left by interrupted writes or deletions; returns what was removed."""
    root = Path(root)
    removed = []
    if root.is_dir():
        for child in root.iterdir():
            if child.name.startswith((_TMP, _DEL)):
                shutil.rmtree(child, ignore_errors=True)
                removed.append(child)
    return removed


def _retire(root: Path, path: Path, step: int) -> None:
    """Delete a complete checkpoint so that no kill leaves it half deleted under its ``global_step_`` name."""
    trash = root / f"{_DEL}{step}"
    path.rename(trash)
    fsync_path(root)
    shutil.rmtree(trash, ignore_errors=True)


def _write_marker(folder: Path, step: int) -> None:
    part = folder / f"{COMPLETE_MARKER}.part"
    with part.open("w") as fh:
        json.dump({"step": step, "time": time.time()}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    part.rename(folder / COMPLETE_MARKER)
    fsync_path(folder)


def write_checkpoint(
    root: str | Path, step: int, writer: Callable[[Path], None], *, keep_last: int | None = None
) -> Path:
    """Write the checkpoint of ``step`` atomically and durably; returns its final folder.

    ``writer(tmp_dir)`` saves everything into ``tmp_dir``. Only after it returns and its files are fsync-ed is the
    ``COMPLETE`` marker written and the folder renamed to ``global_step_<step>``. If ``writer`` raises, earlier
    checkpoints are untouched; an ``OSError`` (disk full, read-only folder) becomes a
    :class:`CheckpointWriteError` naming the folder, and the temporary folder is removed. ``keep_last`` prunes
    older complete checkpoints after a successful write (None keeps all).
    """
    root = Path(root)
    tmp = root / f"{_TMP}{step}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        recover_interrupted(root)
        remove_partial(root)
        tmp.mkdir()
        writer(tmp)
        fsync_tree(tmp)
        _write_marker(tmp, step)
        final = _install(root, tmp, step)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        previous = latest_checkpoint(root) if root.is_dir() else None
        raise CheckpointWriteError(
            exc.errno, f"could not write the checkpoint of step {step} to {str(tmp)!r} "
            f"({exc.__class__.__name__}: {exc.strerror or exc}); the previous checkpoint "
            f"{str(previous) if previous else '(none)'} is intact. Free space or point trainer.output_dir at a "
            "writable folder, then resume with trainer.resume=auto") from exc
    if keep_last is not None and keep_last > 0:
        for old_step, path in list_checkpoints(root)[:-keep_last]:
            _retire(root, path, old_step)
    return final


def _install(root: Path, tmp: Path, step: int) -> Path:
    """Rename the complete temporary folder to its final name (moving an older copy of the step aside)."""
    final = checkpoint_dir(root, step)
    if final.exists():  # re-saving a step (e.g. after resume): move the old one aside first
        old = root / f"{_OLD}{step}"
        final.rename(old)
        tmp.rename(final)
        fsync_path(root)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(final)
        fsync_path(root)
    return final


def resolve_resume(resume: str, root: str | Path) -> Path | None:
    """Map ``trainer.resume`` to a checkpoint folder.

    ``"none"`` -> None (start fresh); ``"auto"`` and ``"force"`` -> the latest complete checkpoint under ``root``
    or None (after :func:`recover_interrupted` finished any interrupted rename; ``force`` differs only in the CLI's
    check of the run folder's saved config, ``ragen.trainer.config.resource_checks``); anything else is a path that must
    be a complete checkpoint.
    """
    if resume in ("none", "", None):
        return None
    if resume in ("auto", "force"):
        recover_interrupted(root)
        return latest_checkpoint(root)
    path = Path(resume)
    if not is_complete(path):
        raise FileNotFoundError(
            f"trainer.resume={resume!r} is not a complete checkpoint folder (no {COMPLETE_MARKER} marker); "
            "pass a global_step_<n> folder, 'auto', 'force' or 'none'"
        )
    return path
