import pytest

from ragen.utils.checkpoint import (
    checkpoint_step,
    latest_checkpoint,
    list_checkpoints,
    resolve_resume,
    write_checkpoint,
)


def _writer(payload: str):
    def write(tmp):
        (tmp / "a.txt").write_text(payload)
        (tmp / "sub").mkdir()
        (tmp / "sub" / "b.txt").write_text(payload * 2)

    return write


def test_write_and_discover(tmp_path):
    write_checkpoint(tmp_path, 2, _writer("two"))
    write_checkpoint(tmp_path, 10, _writer("ten"))
    write_checkpoint(tmp_path, 4, _writer("four"))
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2, 4, 10]
    latest = latest_checkpoint(tmp_path)
    assert latest.name == "global_step_10" and checkpoint_step(latest) == 10
    assert (latest / "sub" / "b.txt").read_text() == "tenten"
    assert resolve_resume("auto", tmp_path) == latest
    assert resolve_resume("none", tmp_path) is None
    assert resolve_resume(str(tmp_path / "global_step_4"), tmp_path).name == "global_step_4"


def test_crash_during_write_keeps_previous(tmp_path):
    write_checkpoint(tmp_path, 1, _writer("one"))

    def crashing(tmp):
        (tmp / "a.txt").write_text("partial")
        raise KeyboardInterrupt("killed while writing")

    with pytest.raises(KeyboardInterrupt):
        write_checkpoint(tmp_path, 2, crashing)
    latest = latest_checkpoint(tmp_path)
    assert latest.name == "global_step_1"
    assert (latest / "a.txt").read_text() == "one"
    # the next write cleans the leftover and succeeds
    write_checkpoint(tmp_path, 2, _writer("two"))
    assert latest_checkpoint(tmp_path).name == "global_step_2"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]


def test_keep_last_and_overwrite(tmp_path):
    for s in (1, 2, 3):
        write_checkpoint(tmp_path, s, _writer(str(s)), keep_last=2)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2, 3]
    write_checkpoint(tmp_path, 3, _writer("again"), keep_last=2)
    assert (tmp_path / "global_step_3" / "a.txt").read_text() == "again"


def test_resume_bad_path(tmp_path):
    (tmp_path / "global_step_5").mkdir()
    assert latest_checkpoint(tmp_path) is None  # no marker: incomplete
    with pytest.raises(FileNotFoundError, match="trainer.resume"):
        resolve_resume(str(tmp_path / "global_step_5"), tmp_path)
