"""ragen as an installed package: the wheel holds the configs, and from outside any checkout the ``ragen`` console
script checks a run (``--check``), prints the composed config and trains one step of the tiny model.

The wheel is built offline (``pip wheel --no-deps --no-build-isolation``) from a copy of the sources, installed
with ``pip install --no-index --no-deps`` into a fresh venv that sees this environment's packages (torch,
transformers, the default model's package...) as system site packages. When this interpreter is itself a venv,
``--system-site-packages`` would expose only the base interpreter's packages, so the venv is made from the base
interpreter and a ``.pth`` file adds this venv's site-packages after the new venv's own (the wheel's ragen comes
first; this venv's editable install is not picked up, its finder ``.pth`` is not processed there).
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "trainer"))
from trainer_helpers import tiny_overrides  # noqa: E402  (the trainer tests' tiny-run settings)

pytestmark = pytest.mark.slow  # multi-process or minutes-long: bash scripts/test.sh -m slow

SOURCES = ("setup.py", "pyproject.toml", "ragen", "external", "config")  # all that setup.py packages


def _run(args: list[str], cwd: Path, env: dict, timeout: int = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{args[:4]}: {proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc


def _venv(path: Path, env: dict) -> Path:
    """A venv at ``path`` that sees this interpreter's packages; returns its python."""
    in_venv = sys.prefix != sys.base_prefix
    base = getattr(sys, "_base_executable", sys.executable) if in_venv else sys.executable
    _run([base, "-m", "venv", "--system-site-packages", str(path)], cwd=path.parent, env=env)
    python = path / "bin" / "python"
    if in_venv:
        purelib = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                       cwd=path.parent, env=env).stdout.strip()
        ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()}
        (Path(purelib) / "zz_parent_venv.pth").write_text("\n".join(sorted(ours)) + "\n")
    return python


@pytest.mark.slow
def test_wheel_installs_and_runs_outside_the_checkout(tmp_path, subprocess_env):
    src = tmp_path / "src"  # a copy: the build writes build/ and *.egg-info next to the sources
    src.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "tests"))
        else:
            shutil.copy2(ROOT / name, src / name)
    env = {k: v for k, v in subprocess_env.items() if k not in ("PYTHONPATH", "RAGEN_CONFIG_DIR")}
    wheels = tmp_path / "wheels"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels),
          str(src)], cwd=tmp_path, env=env)
    (wheel,) = wheels.glob("ragen-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        entry_points = next(zf.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
    configs = {f"ragen_config/{p.relative_to(ROOT / 'config').as_posix()}" for p in (ROOT / "config").rglob("*.yaml")}
    assert {"ragen_config/base.yaml", "ragen_config/env/frozen_lake.yaml", "ragen_config/trainer/gpu.yaml"} <= configs
    assert configs <= names, sorted(configs - names)
    assert "ragen = ragen.cli:main" in entry_points

    python = _venv(tmp_path / "venv", env)
    _run([str(python), "-m", "pip", "install", "-q", "--no-index", "--no-deps", str(wheel)], cwd=tmp_path, env=env)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = {**env, "PATH": f"{python.parent}{os.pathsep}{env['PATH']}"}
    where = _run([str(python), "-c", "import ragen; from ragen.trainer.config.compose import config_dir; "
                  "print(ragen.__file__); print(config_dir())"], cwd=outside, env=env).stdout.split()
    assert all(Path(p).is_relative_to(tmp_path / "venv") for p in where), where
    assert where[1].endswith("ragen_config")

    check = _run([str(python.parent / "ragen"), "train", "--config-name", "ppo_bandit", "--check"], cwd=outside,
                 env=env)
    assert "[ragen] dry run" in check.stdout and "[ragen] batch" in check.stdout
    composed = _run([str(python), "-m", "ragen.train", "--cfg", "job"], cwd=outside, env=env)
    assert "trainer:" in composed.stdout and "${env.name}" in composed.stdout  # --cfg job: interpolations as written
    run_dir = outside / "run"
    _run([str(python.parent / "ragen"), "train", *tiny_overrides(run_dir, steps=1), "trainer.use_ray=false"],
         cwd=outside, env=env)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "actor/pg_loss" in r] == [1]
    assert not list(outside.glob("*.yaml")) and sorted(p.name for p in outside.iterdir()) == ["run"]
