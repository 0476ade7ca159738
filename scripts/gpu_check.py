"""Helpers of scripts/gpu_check.sh and scripts/gpu_wheels.sh (standard library only: it runs before anything is
installed on the GPU machine).

    python scripts/gpu_check.py packages PROFILE      # the requirements gpu_wheels.sh downloads for PROFILE
    python scripts/gpu_check.py prune WHEEL_DIR       # delete the wheels of distributions the GPU machine has
    python scripts/gpu_check.py repack WHEEL_DIR      # rewrite ray's wheel without what a local Ray never loads
    python scripts/gpu_check.py size WHEEL_DIR PROFILE  # MiB of every file under WHEEL_DIR; exit 1 past the budget
    python scripts/gpu_check.py wheels WHEEL_DIR      # per wheel: "install<TAB>path" or "skip<TAB>path<TAB>why"
    python scripts/gpu_check.py imports               # check the modules the check needs; exit 1 if one is missing
    python scripts/gpu_check.py machine               # what runs the check, as JSON
    python scripts/gpu_check.py summary OUT_DIR --cuda 1 --command "..." [--machine FILE]

The summary merges ``OUT_DIR/steps.tsv`` (name, status, seconds per step, written by gpu_check.sh), the live test
log ``OUT_DIR/tests.tsv`` (scripts/pytest_live_log.py: one line per test as it starts and as it ends) and the
benchmark JSONs ``OUT_DIR/bench_*.json`` into ``OUT_DIR/gpu_check.json``, then prints a table and the lines for
docs/benchmarks.md. gpu_check.sh calls it after every step, so the JSON is current when a later step is cut short.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections import Counter
from pathlib import Path

# The distributions of the GPU machine's image (Python 3.12, torch 2.11 with CUDA 13, transformers 5.17, ...):
# gpu_wheels.sh deletes their wheels after resolving, and gpu_check.sh installs no wheel of a distribution the
# machine has, listed or not (its own versions win). The nvidia-* CUDA libraries are matched by NVIDIA_PREFIX.
ASSUMED_PRESENT = (
    "absl-py", "accelerate", "aiofiles", "aiohappyeyeballs", "aiohttp", "aiosignal", "annotated-doc", "anyio",
    "attrs", "botorch", "build", "certifi", "charset-normalizer", "chex", "click", "cloudpickle", "cmake", "colorama",
    "contourpy", "coverage", "cuda-bindings", "cuda-core", "cuda-pathfinder", "cuda-toolkit", "cupy-cuda13x",
    "cycler", "cython", "diffrax", "e3nn", "einops", "equinox", "etils", "execnet", "filelock", "flatbuffers", "flax",
    "fonttools", "formulaic", "frozenlist", "fsspec", "gpytorch", "grpcio", "h11", "h5py", "hf-xet", "httpcore",
    "httpx", "huggingface-hub", "humanize", "hypothesis", "idna", "imageio", "iniconfig", "interface-meta", "jax",
    "jaxlib", "jaxtyping", "jinja2", "joblib", "kiwisolver", "lazy-loader", "lightning", "lightning-utilities",
    "linear-operator", "lineax", "llvmlite", "lxml", "markdown", "markdown-it-py", "markupsafe", "matplotlib",
    "mdurl", "meson", "ml-dtypes", "mpi4py", "mpmath", "msgpack", "multidict", "multipledispatch", "mypy-extensions",
    "nanobind", "narwhals", "networkx", "ninja", "numba", "numba-cuda", "numpy", "numpyro", "onnx", "onnx-ir",
    "onnxruntime", "onnxscript", "opencv-python-headless", "optax", "opt-einsum", "optimistix", "orbax-checkpoint",
    "packaging", "pandas", "pathspec", "patsy", "peft", "pillow", "pip", "pluggy", "portalocker",
    "prometheus-client", "propcache", "protobuf", "psutil", "pyarrow", "pybind11", "py-cpuinfo", "pygments",
    "pyparsing", "pyproject-hooks", "pyre-extensions", "pytest", "pytest-benchmark", "pytest-cov", "pytest-mock",
    "pytest-timeout", "pytest-xdist", "python-dateutil", "pytorch-lightning", "pyyaml", "regex", "requests", "rich",
    "sacrebleu", "safetensors", "scikit-build-core", "scikit-image", "scikit-learn", "scipy", "seaborn",
    "sentencepiece", "sentence-transformers", "setuptools", "shellingham", "simplejson", "six", "sortedcontainers",
    "statsmodels", "sympy", "tabulate", "tensorboard", "tensorboard-data-server", "tensorstore", "threadpoolctl",
    "tifffile", "tiktoken", "timm", "tokenizers", "toolz", "torch", "torchaudio", "torchdiffeq", "torch-geometric",
    "torchmetrics", "torchvision", "tqdm", "transformers", "treescope", "triton", "typer", "typing-extensions",
    "typing-inspect", "urllib3", "uvloop", "wadler-lindig", "werkzeug", "wheel", "wrapt", "xarray", "xxhash", "yarl",
    "zipp",
)
NVIDIA_PREFIX = "nvidia-"  # CUDA libraries of torch's wheel (nvidia-cublas, ...)

# What gpu_wheels.sh downloads per profile (with every dependency the image lacks), and the most the wheel folder
# may weigh, the exported tokenizer included: the device tool carries 64 MiB in all, this repository's ~3 MiB too.
# antlr4-python3-runtime 4.9.3 (hydra-core's parser runtime) is an sdist only: gpu_wheels.sh builds its wheel.
BASE = ("hydra-core==1.3.8", "omegaconf==2.3.1", "antlr4-python3-runtime==4.9.3", "gymnasium==1.4.0")
PROFILES = {"default": (*BASE, "wandb==0.31.0"), "ray": (*BASE, "ray==2.60.0")}
BUDGET_MIB = {"default": 40, "ray": 58}

# Parts of ray's wheel a local, single-node Ray (ray.init, tasks, actors, placement groups) never loads: the Java
# worker's jar, the dashboard's web client, and the libraries built on Ray Core. ``repack`` removes them.
REPACK = {
    "ray": ("ray/jars/", "ray/dashboard/client/", "ray/rllib/", "ray/tune/", "ray/train/", "ray/data/", "ray/serve/",
            "ray/llm/", "ray/air/", "ray/workflow/"),
}

# Modules the check imports: from the image (REQUIRED_IMAGE), from the wheels (REQUIRED_WHEELS), and optional ones
# whose tests report "skipped (missing X)" without them.
REQUIRED_IMAGE = ("torch", "transformers", "peft", "accelerate", "safetensors", "yaml", "matplotlib", "pytest",
                  "pytest_timeout")
REQUIRED_WHEELS = ("hydra", "omegaconf", "gymnasium", "ragen")
OPTIONAL = ("ray", "wandb")


def normalize(name: str) -> str:
    """PEP 503 name: lower case, runs of ``-_.`` as one ``-``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_dist(filename: str) -> str:
    """The normalized distribution name of a wheel file name (``{dist}-{version}(-{build})?-{py}-{abi}-{plat}.whl``),
    e.g. ``hydra_core-1.3.2-py3-none-any.whl`` -> ``hydra-core``."""
    if not filename.endswith(".whl") or filename.count("-") < 4:
        raise ValueError(f"{filename!r} is not a wheel file name (dist-version-python-abi-platform.whl)")
    return normalize(filename.split("-", 1)[0])


def assumed_present(dist: str) -> bool:
    return normalize(dist) in {normalize(d) for d in ASSUMED_PRESENT} or normalize(dist).startswith(NVIDIA_PREFIX)


def installed_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def wheel_plan(wheel_dir: Path) -> list[tuple[str, Path, str]]:
    """(``install`` or ``skip``, wheel, reason) per wheel of ``wheel_dir``: a wheel is skipped when this Python
    already has its distribution (the machine's own versions win), else installed."""
    plan = []
    for wheel in sorted(wheel_dir.glob("*.whl")):
        dist = wheel_dist(wheel.name)
        have = installed_version(dist)
        plan.append(("skip", wheel, f"{dist} {have} is installed") if have else ("install", wheel, ""))
    return plan


def folder_bytes(folder: Path) -> int:
    """Bytes of every regular file under ``folder`` (what travels when the folder is carried)."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


# ---------------------------------------------------------------------------------------------- wheel repacking
def record_hash(data: bytes) -> str:
    """A RECORD hash field: ``sha256=`` and the urlsafe base64 digest without padding (PEP 376 / 427)."""
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _drop_entry_points(text: str, drop: tuple[str, ...]) -> str:
    """entry_points.txt without the entries whose target module lies under a dropped folder
    (``serve = ray.serve.scripts:cli`` goes with ``ray/serve/``)."""
    kept = []
    for line in text.splitlines():
        target = line.split("=", 1)[1].strip().split(":")[0] if "=" in line else ""
        if target and any((target.replace(".", "/") + "/").startswith(d) for d in drop):
            continue
        kept.append(line)
    return "\n".join(kept) + "\n"


def repack_wheel(wheel: Path, drop: tuple[str, ...]) -> tuple[int, int]:
    """Rewrite ``wheel`` in place without the members under the folders ``drop`` (``"ray/jars/"``, ...): the
    dist-info RECORD lists exactly the members left, with their hashes, and entry points into dropped folders go.
    A valid wheel under the same name. Returns (members removed, bytes of the wheel file saved)."""
    before = wheel.stat().st_size
    with zipfile.ZipFile(wheel) as src:
        infos = src.infolist()
        record_name = next(i.filename for i in infos if re.fullmatch(r"[^/]+\.dist-info/RECORD", i.filename))
        dist_info = record_name.rsplit("/", 1)[0]
        keep = [i for i in infos if not i.filename.startswith(drop)]
        fd, tmp = tempfile.mkstemp(suffix=".whl", dir=wheel.parent)
        os.close(fd)
        records = []
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as dst:
            for info in keep:
                if info.filename == record_name or info.is_dir():
                    continue
                data = src.read(info)
                if info.filename == f"{dist_info}/entry_points.txt":
                    data = _drop_entry_points(data.decode(), drop).encode()
                dst.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
                records.append(f"{info.filename},{record_hash(data)},{len(data)}")
            records.append(f"{record_name},,")
            dst.writestr(record_name, "\n".join(records) + "\n", compress_type=zipfile.ZIP_DEFLATED)
    os.chmod(tmp, wheel.stat().st_mode & 0o777)  # mkstemp's file is private; keep the wheel's mode
    os.replace(tmp, wheel)
    return len(infos) - len(keep), before - wheel.stat().st_size


def check_record(wheel: Path) -> list[str]:
    """What is wrong with ``wheel``'s RECORD (empty when it lists every member once with its size and hash, as pip
    requires): members missing from it, entries without a member, wrong hashes or sizes."""
    problems = []
    with zipfile.ZipFile(wheel) as z:
        names = {i.filename for i in z.infolist() if not i.is_dir()}
        record_name = next(n for n in names if re.fullmatch(r"[^/]+\.dist-info/RECORD", n))
        listed = {}
        for line in z.read(record_name).decode().splitlines():
            path, digest, size = line.rsplit(",", 2)
            listed[path] = (digest, size)
        problems += [f"not in RECORD: {n}" for n in sorted(names - listed.keys())]
        problems += [f"in RECORD, not in the wheel: {n}" for n in sorted(listed.keys() - names)]
        for name in sorted(names & listed.keys() - {record_name}):
            data = z.read(name)
            if listed[name] != (record_hash(data), str(len(data))):
                problems.append(f"wrong hash or size: {name}")
    return problems


# ---------------------------------------------------------------------------------------------- results
def read_steps(path: Path) -> dict[str, dict]:
    """``{name: {"status", "seconds"}}`` from gpu_check.sh's ``steps.tsv`` (name, status, seconds per line)."""
    steps = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            name, status, seconds = line.split("\t")
            steps[name] = {"status": status, "seconds": float(seconds)}
    return steps


def live_log_outcomes(log: str) -> dict[str, str]:
    """``{test id: status}`` from the live test log (scripts/pytest_live_log.py: ``nodeid<TAB>outcome<TAB>seconds``
    per line, ``started`` when a test begins): ``passed``, ``failed (<why>)``, ``skipped (<reason>)``, or ``did not
    finish`` for a test that started and never ended (its step was stopped). A failure in any phase (setup, call,
    teardown) makes the test failed."""
    out: dict[str, str] = {}
    for line in log.splitlines():
        nodeid, outcome = line.split("\t")[:2]
        if outcome == "started":
            out[nodeid] = "did not finish"
        elif not out.get(nodeid, "").startswith("failed"):
            out[nodeid] = outcome
    return out


def machine() -> dict:
    """What ran the check: GPU, driver, torch / CUDA, Python, cores, memory."""
    info = {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()}
    try:
        info["memory_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        pass
    if shutil.which("nvidia-smi"):
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30)
        info["gpus"] = [line.strip() for line in q.stdout.splitlines() if line.strip()]
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_cuda"] = torch.version.cuda
    except ImportError:
        info["torch"] = None
    info["transformers"] = installed_version("transformers")
    return info


def summary(out_dir: Path, cuda: bool, command: str, machine_info: dict | None = None) -> dict:
    steps = read_steps(out_dir / "steps.tsv")
    log = out_dir / "tests.tsv"
    tests = live_log_outcomes(log.read_text()) if log.is_file() else {}
    figures = {}
    for path in sorted(out_dir.glob("bench_*.json")):
        figures[path.stem.removeprefix("bench_")] = json.loads(path.read_text())
    counts = dict(sorted(Counter(v.split(" (")[0] for v in tests.values()).items()))
    return {"date": datetime.datetime.now().isoformat(timespec="seconds"), "command": command, "cuda": cuda,
            "machine": machine_info if machine_info is not None else machine(), "steps": steps,
            "test_counts": counts, "tests": tests, "figures": figures}


def figure_lines(figures: dict) -> list[str]:
    """The headline figures, one line each (for the console and docs/benchmarks.md)."""
    lines = []
    for shape, f in figures.get("train", {}).get("shapes", {}).items():
        mfu = " ".join(f"{k} {f[k]:.1%}" for k in ("mfu_vs_spec", "mfu_vs_measured") if f.get(k) is not None)
        lines.append(f"train {shape}: {f['rows']} x {f['seq_len']} tokens {f['precision']}, ours "
                     f"{f['ours_tokens_per_s']:.0f} tokens/s, bare {f['bare_tokens_per_s']:.0f}, "
                     f"ratio {f['ratio']:.2f} (goal >= {f['goal_ratio']}); {mfu}; peak GiB " +
                     ", ".join(f"{k} {v:.1f}" for k, v in f["peak_memory_gib"].items()))
    if "train" in figures:
        p = figures["train"]["peak"]
        lines.append(f"peak: spec {p['spec_tflops']} TFLOP/s, measured GEMM ({p['gemm']}) "
                     f"{p['measured_gemm_tflops']:.3g} TFLOP/s")
    if "generate" in figures:
        g = figures["generate"]
        lines.append(f"generate {g['shape']} {g['dtype']}: {g['prompts']} x ({g['prompt_len']} + {g['new_tokens']}) "
                     f"tokens, engine {g['ours_tokens_per_s']:.0f} tokens/s, bare generate "
                     f"{g['bare_tokens_per_s']:.0f}, ratio {g['ratio']:.2f} (goal >= {g['goal_ratio']}); "
                     f"sleep/wake GiB {g['sleep_wake_gib']}")
    return lines


def check_imports() -> int:
    """Import the modules the check needs; print one line each. 1 when a required one is missing or broken."""
    missing = []
    for name in (*REQUIRED_IMAGE, *REQUIRED_WHEELS, *OPTIONAL):
        try:  # the wheels' modules are imported (a wheel that does not fit the image fails here); the rest found
            if name in REQUIRED_IMAGE:
                if importlib.util.find_spec(name) is None:
                    raise ImportError(f"No module named {name!r}")
                where = "found"
            else:
                where = getattr(importlib.import_module(name), "__file__", "?")
            print(f"{name}: {where}")
        except Exception as e:  # noqa: BLE001 - any failure to import is reported, the optional ones as absent
            print(f"{name}: {'absent (its tests report skipped)' if name in OPTIONAL else 'MISSING'}: {e!r}")
            if name not in OPTIONAL:
                missing.append(name)
    if missing:
        print(f"missing: {' '.join(missing)}")
    return 1 if missing else 0


def print_summary(result: dict, out_dir: Path) -> None:
    width = max((len(n) for n in [*result["steps"], *result["tests"]]), default=10)
    for name, step in result["steps"].items():
        print(f"  {name:<{width}}  {step['status']}  ({step['seconds']:.0f} s)")
    for tid, status in result["tests"].items():
        print(f"  {tid:<{width}}  {status}")
    if result["test_counts"]:
        print("  tests: " + ", ".join(f"{n} {k}" for k, n in result["test_counts"].items()))
    for line in figure_lines(result["figures"]):
        print(f"  {line}")
    print(f"[gpu_check] wrote {out_dir / 'gpu_check.json'}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("packages").add_argument("profile", choices=sorted(PROFILES))
    for name in ("wheels", "prune", "repack"):
        sub.add_parser(name).add_argument("wheel_dir", type=Path)
    s = sub.add_parser("size")
    s.add_argument("wheel_dir", type=Path)
    s.add_argument("profile", choices=sorted(PROFILES))
    sub.add_parser("imports")
    sub.add_parser("machine")
    s = sub.add_parser("summary")
    s.add_argument("out_dir", type=Path)
    s.add_argument("--cuda", type=int, choices=(0, 1), required=True)
    s.add_argument("--command", required=True)
    s.add_argument("--machine", type=Path, default=None, help="a JSON file from `machine` (else measured now)")
    s.add_argument("--quiet", action="store_true", help="write the JSON, print nothing")
    args = p.parse_args(argv)
    if args.cmd == "packages":
        print("\n".join(PROFILES[args.profile]))
    elif args.cmd == "wheels":
        for action, wheel, why in wheel_plan(args.wheel_dir):
            print("\t".join([action, str(wheel), why]).rstrip("\t"))
    elif args.cmd == "prune":
        for wheel in sorted(args.wheel_dir.glob("*.whl")):
            if assumed_present(wheel_dist(wheel.name)):
                wheel.unlink()
                print(f"removed {wheel.name} (the GPU machine has {wheel_dist(wheel.name)})")
    elif args.cmd == "repack":
        for wheel in sorted(args.wheel_dir.glob("*.whl")):
            if (drop := REPACK.get(wheel_dist(wheel.name))) is not None:
                n, saved = repack_wheel(wheel, drop)
                print(f"repacked {wheel.name}: {n} members under {' '.join(drop)} removed, "
                      f"{saved / 2**20:.1f} MiB saved, {wheel.stat().st_size / 2**20:.1f} MiB left")
    elif args.cmd == "size":
        mib, budget = folder_bytes(args.wheel_dir) / 2**20, BUDGET_MIB[args.profile]
        print(f"{args.wheel_dir}: {mib:.1f} MiB (profile {args.profile}: budget {budget} MiB)")
        if mib > budget:
            print(f"over the budget by {mib - budget:.1f} MiB", file=sys.stderr)
            return 1
    elif args.cmd == "imports":
        return check_imports()
    elif args.cmd == "machine":
        print(json.dumps(machine()))
    else:
        info = json.loads(args.machine.read_text()) if args.machine and args.machine.is_file() else None
        result = summary(args.out_dir, bool(args.cuda), args.command, info)
        (args.out_dir / "gpu_check.json").write_text(json.dumps(result, indent=2) + "\n")
        if not args.quiet:
            print_summary(result, args.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
