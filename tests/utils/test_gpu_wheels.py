"""The wheel folders of scripts/gpu_wheels.sh, built for real (pip download from PyPI; marker ``network``, run by CI,
not by the default suite), fit the device tool's carry limit: every file under the folder measured, the exported
tokenizer included, against the profile's budget (scripts/gpu_check.py BUDGET_MIB), and the budget plus this
checkout within the 64 MiB that travel. The repacked ray wheel is a valid wheel that still starts a local Ray.

Downloads go through pip's cache (``PIP_CACHE_DIR``), so a second run downloads nothing."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("gpu_check_helper", ROOT / "scripts" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = gpu_check
_spec.loader.exec_module(gpu_check)

pytestmark = pytest.mark.network
MIB = 2**20
CARRY_LIMIT_MIB = 64  # what the device tool carries in all: the checkout plus the wheel folder


def _env(**extra: str) -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), **extra}


def _measure(folder: Path) -> int:
    """Bytes of every regular file under ``folder``."""
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(folder) for f in files
               if not os.path.islink(os.path.join(d, f)))


@pytest.fixture(scope="module", params=["default", "ray"])
def built(request, tmp_path_factory) -> tuple[str, Path]:
    """(profile, WHEEL_DIR) built by ``bash scripts/gpu_wheels.sh WHEEL_DIR [--ray]``."""
    profile = request.param
    folder = tmp_path_factory.mktemp(f"wheels_{profile}")
    cmd = ["bash", "scripts/gpu_wheels.sh", str(folder), *(["--ray"] if profile == "ray" else [])]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200,
                          env=_env(PYTHON=sys.executable, HF_HUB_OFFLINE="1"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return profile, folder


def _checkout_bytes() -> int:
    """Bytes of what travels from this checkout besides carried folders: tracked and untracked-not-ignored files."""
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                            timeout=60, check=True).stdout.decode().split("\0")
    return sum(os.path.getsize(ROOT / f) for f in listed if f and (ROOT / f).is_file())


def test_profile_fits_its_budget_and_the_carry_limit(built):
    profile, folder = built
    size = _measure(folder)
    budget = gpu_check.BUDGET_MIB[profile]
    assert size <= budget * MIB, f"{profile}: {size / MIB:.1f} MiB measured, budget {budget} MiB"
    assert budget * MIB + _checkout_bytes() <= CARRY_LIMIT_MIB * MIB


def test_profile_holds_what_the_check_imports_and_nothing_the_image_has(built):
    profile, folder = built
    dists = {gpu_check.wheel_dist(w.name) for w in folder.glob("*.whl")}
    assert {"hydra-core", "omegaconf", "antlr4-python3-runtime", "gymnasium"} <= dists
    assert ("wandb" in dists, "ray" in dists) == {"default": (True, False), "ray": (False, True)}[profile]
    assert not [d for d in dists if gpu_check.assumed_present(d)]
    for wheel in folder.glob("*.whl"):  # CPython 3.12 on Linux x86_64, or pure Python
        _, _, py, abi, plat = wheel.name[:-4].rsplit("-", 4)
        assert ("py3" in py or "cp312" in py) and abi in ("none", "abi3", "cp312"), wheel.name
        assert plat == "any" or ("x86_64" in plat and "linux" in plat), wheel.name
    assert (folder / "tokenizer" / "tokenizer.json").is_file() and not list(folder.rglob("*.safetensors"))


def test_ray_wheel_is_repacked_and_stays_valid(built):
    profile, folder = built
    wheels = list(folder.glob("ray-*.whl"))
    assert len(wheels) == (profile == "ray")
    if not wheels:
        return
    (wheel,) = wheels
    assert gpu_check.check_record(wheel) == []
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    assert not [n for n in names if n.startswith(gpu_check.REPACK["ray"])]
    assert {"ray/_raylet.so", "ray/core/src/ray/raylet/raylet", "ray/core/src/ray/gcs/gcs_server"} <= names


SMOKE = """
import sys
import ray
from ray.util.placement_group import placement_group, placement_group_table
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

assert ray.__file__.startswith(sys.argv[1]), ray.__file__
ray.init(address="local", num_cpus=2, include_dashboard=False, _temp_dir=sys.argv[2],
         runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})  # as ragen starts a local Ray
assert ray.get(ray.remote(lambda: 1).remote()) == 1


@ray.remote(num_cpus=1)
class Doubler:
    def twice(self, x):
        return 2 * x


pg = placement_group([{"CPU": 1}, {"CPU": 1}])
ray.get(pg.ready(), timeout=120)
in_bundle_1 = PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=1)
actor = Doubler.options(scheduling_strategy=in_bundle_1).remote()
assert ray.get(actor.twice.remote(21)) == 42
assert [b["CPU"] for b in placement_group_table(pg)["bundles"].values()] == [1.0, 1.0]
ray.shutdown()
print("local ray ok")
"""


def test_repacked_ray_starts_a_local_ray(tmp_path):
    """The same repack, on ray's wheel for this Python, installed alone into a folder that shadows any other ray:
    a task, an actor in a placement group bundle."""
    (pin,) = [p for p in gpu_check.PROFILES["ray"] if p.startswith("ray==")]
    dl = tmp_path / "dl"
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
                           "--dest", str(dl), pin], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = dl.glob("ray-*.whl")
    gpu_check.repack_wheel(wheel, gpu_check.REPACK["ray"])
    target = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-compile",
                           "--target", str(target), str(wheel)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (target / "ray" / "jars").exists() and not (target / "ray" / "dashboard" / "client").exists()
    (tmp_path / "smoke.py").write_text(textwrap.dedent(SMOKE))
    env = {**os.environ, "PYTHONPATH": str(target), "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    ray_tmp = tempfile.mkdtemp(prefix="ray")  # short: Ray's socket paths must stay under 108 bytes
    try:
        proc = subprocess.run([sys.executable, str(tmp_path / "smoke.py"), str(target), ray_tmp],
                              capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert proc.returncode == 0 and "local ray ok" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
