"""The GPU check's machinery, on CPU: the live test log (scripts/pytest_live_log.py) keeps every result of a run
that dies part way, a repacked wheel stays a wheel pip installs, and ``gpu_check.sh --cpu-rehearsal`` runs every
step the GPU run would (install into a temporary site dir, the `gpu` tests, the benchmarks in smoke mode) and leaves
at most 7 plainly named files, the step logs packed in one archive."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("gpu_check_helper", ROOT / "scripts" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = gpu_check
_spec.loader.exec_module(gpu_check)

PLAIN = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def _env(**extra: str) -> dict:
    path = os.pathsep.join([str(ROOT), str(ROOT / "scripts"), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, **extra}


# ---------------------------------------------------------------------------------------------- live test log
LIVE = '''
import os
import time

import pytest


def test_ok():
    assert 1 + 1 == 2


def test_bad():
    assert 1 == 2


@pytest.mark.skip(reason="missing ray")
def test_skipped():
    pass


def test_slow():
    time.sleep(30)


@pytest.fixture
def leaky():
    yield
    raise RuntimeError("leaked a process")


def test_teardown_fails(leaky):
    pass


def test_dies():
    os._exit(3)


def test_never_reached():
    pass
'''


def test_live_log_keeps_every_result_of_a_run_that_dies(tmp_path):
    (tmp_path / "test_live.py").write_text(textwrap.dedent(LIVE))
    log = tmp_path / "tests.tsv"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "pytest_live_log", "-p", "no:cacheprovider",
                           "--timeout=1", "test_live.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env=_env(RAGEN_TEST_LOG=str(log)))
    assert proc.returncode == 3, proc.stdout[-2000:]  # os._exit(3): pytest never reached its end
    rows = [line.split("\t") for line in log.read_text().splitlines()]
    events = [(nodeid.split("::")[1], outcome) for nodeid, outcome, *_ in rows]
    assert events == [
        ("test_ok", "started"), ("test_ok", "passed"),
        ("test_bad", "started"), ("test_bad", "failed (assert 1 == 2)"),
        ("test_skipped", "started"), ("test_skipped", "skipped (missing ray)"),
        ("test_slow", "started"), ("test_slow", "failed (Failed: Timeout (>1.0s) from pytest-timeout.)"),
        ("test_teardown_fails", "started"), ("test_teardown_fails", "passed"),
        ("test_teardown_fails", "failed (RuntimeError: leaked a process)"),
        ("test_dies", "started"),
    ]
    assert all(len(r) == 3 and float(r[2]) >= 0 for r in rows if r[1] != "started")
    assert gpu_check.live_log_outcomes(log.read_text())["test_live.py::test_dies"] == "did not finish"


def test_live_log_writes_nothing_without_its_variable(tmp_path):
    (tmp_path / "test_one.py").write_text("def test_ok():\n    pass\n")
    env = _env()
    env.pop("RAGEN_TEST_LOG", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "pytest_live_log", "-p", "no:cacheprovider", "-q",
                           "test_one.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["test_one.py"]


# ---------------------------------------------------------------------------------------------- wheel repacking
def _wheel(folder: Path, members: dict[str, str], entry_points: str) -> Path:
    """A minimal wheel of ``ray 9.9.9`` holding ``members`` (path -> text), with a correct RECORD."""
    dist_info = "ray-9.9.9.dist-info"
    files = {**members, f"{dist_info}/METADATA": "Metadata-Version: 2.1\nName: ray\nVersion: 9.9.9\n",
             f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
             f"{dist_info}/entry_points.txt": entry_points}
    record = [f"{name},{gpu_check.record_hash(text.encode())},{len(text.encode())}" for name, text in files.items()]
    path = folder / "ray-9.9.9-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, text in files.items():
            z.writestr(name, text)
        z.writestr(f"{dist_info}/RECORD", "\n".join([*record, f"{dist_info}/RECORD,,"]) + "\n")
    return path


def test_repacked_wheel_keeps_a_valid_record_and_installs(tmp_path):
    members = {"ray/__init__.py": "X = 1\n", "ray/scripts/scripts.py": "def main():\n    return 0\n",
               "ray/dashboard/agent.py": "AGENT = 1\n", "ray/dashboard/client/build/index.html": "<html/>\n",
               "ray/jars/ray_dist.jar": "jar" * 1000, "ray/serve/scripts.py": "def cli():\n    pass\n",
               "ray/data/__init__.py": "", "ray/serve_like.py": "KEEP = 1\n"}
    entry_points = "[console_scripts]\nray = ray.scripts.scripts:main\nserve = ray.serve.scripts:cli\n"
    wheel = _wheel(tmp_path, members, entry_points)
    assert gpu_check.check_record(wheel) == []
    removed, saved = gpu_check.repack_wheel(wheel, gpu_check.REPACK["ray"])
    assert removed == 4 and saved > 0  # the jar, the web client, serve's and data's modules
    with zipfile.ZipFile(wheel) as z:
        names = sorted(z.namelist())
        assert z.read("ray-9.9.9.dist-info/entry_points.txt").decode() == \
            "[console_scripts]\nray = ray.scripts.scripts:main\n"
    assert [n for n in names if not n.startswith("ray-9.9.9.dist-info/")] == [
        "ray/__init__.py", "ray/dashboard/agent.py", "ray/scripts/scripts.py", "ray/serve_like.py"]
    assert gpu_check.check_record(wheel) == []
    target = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-compile",
                           "--target", str(target), str(wheel)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert (target / "ray" / "serve_like.py").is_file() and not (target / "ray" / "jars").exists()


def test_check_record_names_what_does_not_match(tmp_path):
    wheel = _wheel(tmp_path, {"ray/__init__.py": "X = 1\n"}, "")
    with zipfile.ZipFile(wheel, "a") as z:
        z.writestr("ray/extra.py", "Y = 2\n")
    assert gpu_check.check_record(wheel) == ["not in RECORD: ray/extra.py"]


# ---------------------------------------------------------------------------------------------- CPU rehearsal
def _probe_wheel(folder: Path) -> Path:
    """A real, tiny wheel of a distribution no environment has (``ragen_gpu_check_probe``), for the install step."""
    dist_info = "ragen_gpu_check_probe-1.0.dist-info"
    files = {"ragen_gpu_check_probe.py": "VALUE = 7\n",
             f"{dist_info}/METADATA": "Metadata-Version: 2.1\nName: ragen-gpu-check-probe\nVersion: 1.0\n",
             f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    path = folder / "ragen_gpu_check_probe-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
        record = [f"{n},{gpu_check.record_hash(t.encode())},{len(t.encode())}" for n, t in files.items()]
        z.writestr(f"{dist_info}/RECORD", "\n".join([*record, f"{dist_info}/RECORD,,"]) + "\n")
    return path


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA present: the rehearsal is for machines without it")
def test_cpu_rehearsal_runs_every_step_and_returns_at_most_7_plain_files(tmp_path):
    wheels, out = tmp_path / "wheels", tmp_path / "out"
    wheels.mkdir()
    _probe_wheel(wheels)
    (wheels / "PyYAML-6.0.1-cp312-cp312-manylinux_2_17_x86_64.whl").touch()  # this Python has it: skipped
    proc = subprocess.run(["bash", "scripts/gpu_check.sh", "--cpu-rehearsal", str(wheels), str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=900,
                          env=_env(PYTHON=sys.executable, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    files = sorted(p.name for p in out.iterdir())
    assert files == ["bench_generate.json", "bench_train.json", "gpu_check.json", "logs.tar.gz", "steps.tsv",
                     "tests.tsv"]
    assert all(p.is_file() and set(p.name) <= PLAIN for p in out.iterdir()) and len(files) <= 7
    report = json.loads((out / "gpu_check.json").read_text())
    steps = ["install", "tests_basic", "tests_runs", "tests_optional", "bench_train", "bench_generate"]
    assert {k: v["status"] for k, v in report["steps"].items()} == dict.fromkeys(steps, "passed")
    # every gpu test reported, in the plan's order, each skipped for want of CUDA
    order = [line.split("\t")[0] for line in (out / "tests.tsv").read_text().splitlines()
             if line.endswith("\tstarted")]
    assert [nid.split("::")[1].split("[")[0] for nid in order][:2] == [
        "test_fsdp2_update_on_one_rank_equals_the_cpu_update_in_fp32",
        "test_fsdp2_bf16_update_stays_within_bounds_of_fp32"]
    assert len(order) == len(report["tests"]) == 13 and report["test_counts"] == {"skipped": 13}
    assert all(s.startswith("skipped (no CUDA device") for s in report["tests"].values())
    assert report["figures"]["train"]["tiny"] is True and report["figures"]["generate"]["ratio"] > 0
    with tarfile.open(out / "logs.tar.gz") as tar:
        logs = {Path(m.name).name: m for m in tar.getmembers() if m.isfile()}
        assert {f"{s}.log" for s in steps} <= set(logs)
        install = tar.extractfile(logs["install.log"]).read().decode()
    assert "Successfully installed ragen-gpu-check-probe-1.0" in install  # pip ran, into the temporary site dir
    assert importlib.util.find_spec("ragen_gpu_check_probe") is None  # installed into the temporary site dir only
