"""Helpers of scripts/gpu_check.sh and scripts/gpu_wheels.sh (standard library only: it runs before anything is
installed on the GPU machine).

    python scripts/gpu_check.py wheels WHEEL_DIR     # one line per wheel: "install<TAB>path" or "skip<TAB>path<TAB>why"
    python scripts/gpu_check.py prune WHEEL_DIR      # delete the wheels of distributions the target already has
    python scripts/gpu_check.py summary OUT_DIR --cuda 1 --command "..."   # OUT_DIR/gpu_check.json + a table

The summary merges ``OUT_DIR/steps.tsv`` (name, status, seconds per step, written by gpu_check.sh), the pytest JUnit
file ``OUT_DIR/tests.xml`` (one status per test: passed, failed, or ``skipped (<reason>)``, e.g. ``skipped (missing
ray)``) and the benchmark JSONs ``OUT_DIR/bench_*.json`` into ``OUT_DIR/gpu_check.json``, then prints a table and
the lines for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

# Distributions the target machine has (its torch, transformers, peft, accelerate and pytest, and what those need;
# transformers 5 reaches the hub through httpx, so requests and urllib3 are not among them): gpu_wheels.sh deletes
# their wheels after resolving; gpu_check.sh installs no wheel of a distribution the machine has, listed or not.
ASSUMED_PRESENT = (
    "torch", "triton", "filelock", "typing-extensions", "sympy", "mpmath", "networkx", "jinja2", "markupsafe",
    "fsspec", "setuptools", "transformers", "huggingface-hub", "hf-xet", "httpx", "httpcore", "h11", "anyio",
    "certifi", "idna", "numpy", "packaging", "pyyaml", "regex", "safetensors", "tokenizers", "tqdm", "peft",
    "accelerate", "psutil", "pytest", "iniconfig", "pluggy", "pygments",
)
NVIDIA_PREFIX = "nvidia-"  # CUDA libraries of torch's wheel (nvidia-cublas-cu13, ...)


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


def junit_outcomes(junit_xml: str) -> dict[str, str]:
    """``{test id: status}`` from a pytest JUnit XML: ``passed``, ``failed`` (failure or error) or
    ``skipped (<reason>)`` with pytest's skip reason, e.g. ``skipped (missing ray)``. Test id:
    ``<classname>::<name>``."""
    out = {}
    for case in ET.fromstring(junit_xml).iter("testcase"):
        tid = f"{case.get('classname', '')}::{case.get('name', '')}"
        if case.find("failure") is not None or case.find("error") is not None:
            out[tid] = "failed"
        elif (skip := case.find("skipped")) is not None:
            reason = (skip.get("message") or "").strip()
            reason = re.sub(r"^Skipped:\s*", "", reason)
            out[tid] = f"skipped ({reason})" if reason else "skipped"
        else:
            out[tid] = "passed"
    return out


def read_steps(path: Path) -> dict[str, dict]:
    """``{name: {"status", "seconds"}}`` from gpu_check.sh's ``steps.tsv`` (name, status, seconds per line)."""
    steps = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            name, status, seconds = line.split("\t")
            steps[name] = {"status": status, "seconds": float(seconds)}
    return steps


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
    return info


def summary(out_dir: Path, cuda: bool, command: str) -> dict:
    steps = read_steps(out_dir / "steps.tsv")
    xml = out_dir / "tests.xml"
    tests = junit_outcomes(xml.read_text()) if xml.is_file() else {}
    if tests and "tests" in steps:  # e.g. "passed (7 passed, 2 skipped)": the skips are named per test below
        counts = Counter(v.split(" (")[0] for v in tests.values())
        steps["tests"]["status"] += " (" + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) + ")"
    figures = {}
    for path in sorted(out_dir.glob("bench_*.json")):
        figures[path.stem.removeprefix("bench_")] = json.loads(path.read_text())
    return {"date": datetime.datetime.now().isoformat(timespec="seconds"), "command": command, "cuda": cuda,
            "machine": machine(), "steps": steps, "tests": tests, "figures": figures}


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("wheels", "prune"):
        sub.add_parser(name).add_argument("wheel_dir", type=Path)
    s = sub.add_parser("summary")
    s.add_argument("out_dir", type=Path)
    s.add_argument("--cuda", type=int, choices=(0, 1), required=True)
    s.add_argument("--command", required=True)
    args = p.parse_args(argv)
    if args.cmd == "wheels":
        for action, wheel, why in wheel_plan(args.wheel_dir):
            print("\t".join([action, str(wheel), why]).rstrip("\t"))
    elif args.cmd == "prune":
        for wheel in sorted(args.wheel_dir.glob("*.whl")):
            if assumed_present(wheel_dist(wheel.name)):
                wheel.unlink()
                print(f"removed {wheel.name} (assumed present on the target)")
    else:
        result = summary(args.out_dir, bool(args.cuda), args.command)
        (args.out_dir / "gpu_check.json").write_text(json.dumps(result, indent=2) + "\n")
        width = max((len(n) for n in [*result["steps"], *result["tests"]]), default=10)
        for name, step in result["steps"].items():
            print(f"  {name:<{width}}  {step['status']}  ({step['seconds']:.0f} s)")
        for tid, status in result["tests"].items():
            print(f"  {tid:<{width}}  {status}")
        for line in figure_lines(result["figures"]):
            print(f"  {line}")
        print(f"[gpu_check] wrote {args.out_dir / 'gpu_check.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
