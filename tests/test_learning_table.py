"""bench/learning_table.py's runs are real commands: every claim's every method composes and validates with the
overrides the bench passes, its run folder included (a Hydra override value)."""

import importlib.util
import sys
from pathlib import Path

import pytest

from ragen.launch import validate
from ragen.trainer.compose import load_train_config

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("learning_table", ROOT / "bench" / "learning_table.py")
table = importlib.util.module_from_spec(_spec)
sys.modules["learning_table"] = table  # dataclasses look their module up there
_spec.loader.exec_module(table)

RUNS = [(c, m) for c in table.CLAIMS for m in c.methods]


@pytest.mark.parametrize(("claim", "method"), RUNS, ids=[f"{c.name}/{m.name}" for c, m in RUNS])
def test_every_run_composes_and_validates(claim, method, tmp_path):
    folder = table.run_folder(tmp_path / "out dir", claim, method, 1)
    cmd = table.command(method, claim.panel, 1, folder)
    assert cmd[1:5] == ["-m", "ragen.train", "--config-name", method.config]
    cfg = load_train_config(method.config, cmd[5:])
    validate(cfg)
    assert (cfg.trainer.output_dir, cfg.trainer.seed) == (str(folder), 1)
    assert set(folder.relative_to(tmp_path / "out dir").as_posix()) <= set(
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-/")


def test_run_folders_are_distinct():
    folders = {table.run_folder(Path("out"), c, m, 0) for c, m in RUNS}
    assert len(folders) == len(RUNS)
