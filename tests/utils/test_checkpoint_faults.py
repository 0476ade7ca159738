"""Checkpoint writes under faults: kill -9 at random moments, interrupted renames and deletions, fsync
ordering, a full or read-only disk."""

import errno
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ragen.utils import checkpoint as C

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_faults", ROOT / "bench" / "faults.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def _writer(payload: str, size: int = 10):
    def write(tmp):
        (tmp / "a.txt").write_text(payload * size)
        (tmp / "sub").mkdir()
        (tmp / "sub" / "b.txt").write_text(payload * 2)

    return write


@pytest.mark.slow
def test_kill9_during_checkpoint_writes_always_resumes_complete(tmp_path):
    """20 SIGKILLs spread over real checkpoint saves (tiny Llama + AdamW): every resume=auto finds a complete,
    correct checkpoint and loses at most the step being saved."""
    bench = _bench()
    rep = bench.run_kills(tmp_path / "ckpt", kills=20, seed=1)
    assert rep.failures == []
    assert (rep.tried, rep.resumed) == (20, 20)
    assert sum(rep.lost_steps.values()) == 20 and set(rep.lost_steps) <= {0, 1}
    assert len(rep.phases) >= 2, rep.phases  # the kills landed in more than one phase of the write


def test_kill_between_swap_renames_recovers_newest(tmp_path, monkeypatch):
    """Re-saving step 2: a kill after the old copy moved aside but before the new one is installed."""
    C.write_checkpoint(tmp_path, 1, _writer("one"))
    C.write_checkpoint(tmp_path, 2, _writer("two"))
    real_rename = Path.rename

    def rename(self, target):
        if self.name == ".tmp_global_step_2" and Path(target).name == "global_step_2":
            raise SystemExit("killed")
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", rename)
    with pytest.raises(SystemExit):
        C.write_checkpoint(tmp_path, 2, _writer("TWO"))
    monkeypatch.setattr(Path, "rename", real_rename)
    assert not (tmp_path / "global_step_2").exists()  # the window: only .old_ and .tmp_ copies exist
    path = C.resolve_resume("auto", tmp_path)
    assert path.name == "global_step_2" and (path / "a.txt").read_text() == "TWO" * 10
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_1", "global_step_2"]


def test_kill_before_install_of_unmarked_copy_restores_old(tmp_path, monkeypatch):
    """Same window, but the new copy's marker never landed: the old copy of the step is restored."""
    C.write_checkpoint(tmp_path, 3, _writer("old"))
    (tmp_path / "global_step_3").rename(tmp_path / ".old_global_step_3")
    (tmp_path / ".tmp_global_step_3").mkdir()
    (tmp_path / ".tmp_global_step_3" / "a.txt").write_text("half")
    path = C.resolve_resume("auto", tmp_path)
    assert path.name == "global_step_3" and (path / "a.txt").read_text() == "old" * 10


def test_kill_during_prune_never_leaves_marked_partial_folder(tmp_path, monkeypatch):
    """keep_last deletes an old checkpoint; a kill mid-rmtree must not leave a global_step_* with a marker."""
    for s in (1, 2):
        C.write_checkpoint(tmp_path, s, _writer(str(s)), keep_last=2)

    def dying_rmtree(path, ignore_errors=False):
        (Path(path) / "a.txt").unlink()  # the marker and sub/ survive: what a kill mid-deletion leaves
        raise SystemExit("killed")

    monkeypatch.setattr(C.shutil, "rmtree", dying_rmtree)
    with pytest.raises(SystemExit):
        C.write_checkpoint(tmp_path, 3, _writer("3"), keep_last=2)
    monkeypatch.undo()
    for step, path in C.list_checkpoints(tmp_path):
        assert (path / "a.txt").read_text() == str(step) * 10
    assert [s for s, _ in C.list_checkpoints(tmp_path)] == [2, 3]
    C.write_checkpoint(tmp_path, 4, _writer("4"), keep_last=2)  # the next write cleans the half-deleted folder
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_3", "global_step_4"]


def test_half_written_marker_is_not_complete(tmp_path):
    (tmp_path / "global_step_7").mkdir()
    (tmp_path / "global_step_7" / C.COMPLETE_MARKER).write_text('{"st')
    assert not C.is_complete(tmp_path / "global_step_7")
    assert C.resolve_resume("auto", tmp_path) is None


def test_files_are_fsynced_before_the_marker_and_rename(tmp_path, monkeypatch):
    """Durability order: every data file and folder, then the marker, then the root (after the rename)."""
    synced: list[str] = []
    real = C.fsync_path

    def record(path):
        synced.append(os.path.relpath(path, tmp_path))
        real(path)

    monkeypatch.setattr(C, "fsync_path", record)
    C.write_checkpoint(tmp_path, 5, _writer("x"))
    tmp = ".tmp_global_step_5"
    assert synced == [f"{tmp}/sub/b.txt", f"{tmp}/sub", f"{tmp}/a.txt", tmp, tmp, "."]


# ---------------------------------------------------------------------------------------------- disk faults
def _assert_failed_cleanly(tmp_path, exc_info, step, errname):
    msg = str(exc_info.value)
    assert str(tmp_path / f".tmp_global_step_{step}") in msg and errname in msg
    assert "global_step_1" in msg and "intact" in msg
    assert [s for s, _ in C.list_checkpoints(tmp_path)] == [1]
    assert (tmp_path / "global_step_1" / "a.txt").read_text() == "one" * 10
    assert not (tmp_path / f".tmp_global_step_{step}").exists()


def test_disk_full_fails_with_path_and_keeps_previous(tmp_path):
    C.write_checkpoint(tmp_path, 1, _writer("one"))

    def full(tmp):
        (tmp / "a.txt").write_text("partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp / "big.bin"))

    with pytest.raises(C.CheckpointWriteError) as exc_info:
        C.write_checkpoint(tmp_path, 2, full, keep_last=1)
    assert exc_info.value.errno == errno.ENOSPC
    _assert_failed_cleanly(tmp_path, exc_info, 2, "No space left on device")


def test_read_only_folder_fails_with_path_and_keeps_previous(tmp_path, monkeypatch):
    C.write_checkpoint(tmp_path, 1, _writer("one"))
    real_mkdir = Path.mkdir

    def ro_mkdir(self, *a, **k):
        if self.name.startswith(".tmp_global_step_"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        return real_mkdir(self, *a, **k)

    monkeypatch.setattr(Path, "mkdir", ro_mkdir)
    with pytest.raises(C.CheckpointWriteError) as exc_info:
        C.write_checkpoint(tmp_path, 2, _writer("two"))
    assert exc_info.value.errno == errno.EROFS
    _assert_failed_cleanly(tmp_path, exc_info, 2, "Read-only file system")


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    return res.returncode == 0


def test_real_tiny_tmpfs_full_then_read_only(tmp_path):
    """On a real 256 KiB tmpfs (when this process may mount one; else the two tests above cover it): a
    checkpoint that does not fit fails with ENOSPC, one on the remounted read-only folder with EROFS; the
    previous checkpoint stays readable and the space of the partial write is given back."""
    mnt = tmp_path / "mnt"
    if not _mount_tmpfs(mnt, "256k"):
        pytest.skip("cannot mount a tmpfs here (not root / no mount); covered by the monkeypatched tests")
    try:
        C.write_checkpoint(mnt, 1, _writer("one"))
        with pytest.raises(C.CheckpointWriteError) as exc_info:
            C.write_checkpoint(mnt, 2, _writer("two", size=200_000))  # 600 KB > 256 KiB
        assert exc_info.value.errno == errno.ENOSPC
        _assert_failed_cleanly(mnt, exc_info, 2, "No space left on device")
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        with pytest.raises(C.CheckpointWriteError) as exc_info:
            C.write_checkpoint(mnt, 3, _writer("three"))
        assert exc_info.value.errno == errno.EROFS and str(mnt) in str(exc_info.value)
        assert C.resolve_resume("auto", mnt).name == "global_step_1"
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_kill_during_the_first_save_of_an_empty_folder_is_a_clean_restart(tmp_path):
    """A kill that hits the first save of an empty run folder leaves no complete checkpoint: starting over from step
    0 loses nothing and counts as a clean resume; a missing checkpoint after a save had finished still fails."""
    _bench()  # puts bench/ on sys.path
    from fault_campaign import resumed_step

    root = tmp_path / "checkpoints"
    (root / ".tmp_global_step_1").mkdir(parents=True)  # the interrupted first save
    assert resumed_step(root, lambda p: 99, finished=0) == 0
    with pytest.raises(AssertionError, match="step 1 had been saved"):
        resumed_step(root, lambda p: 99, finished=1)
    assert resumed_step(tmp_path / "never_created", lambda p: 99, finished=0) == 0
