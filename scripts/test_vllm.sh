#!/usr/bin/env bash
# Build (or reuse) .venv-vllm and run the tests marked `vllm` there: the real vLLM engine (CPU build, vLLM 0.32.0)
# against the hf engine, and hosted by one and two actor ranks inside the training loop. Called from .ci/run after the
# main suite; extra args go to pytest.
# Measured on the 2-core CI-sized machine: env build ~3 min (first time; a no-op after), tests ~6-9 min.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
VENV="$(bash scripts/setup_vllm_env.sh)"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" TOKENIZERS_PARALLELISM=false WANDB_MODE=offline HF_HUB_OFFLINE=1
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"   # GiB of KV cache for the CPU engine
# The default model's converted folder is cached under ~/.cache/ragen; the first load converts the packaged GGUF.
"$VENV/bin/python" -m pytest -q -p no:cacheprovider -m vllm tests/rollout/test_vllm_real.py tests/rollout/test_vllm_hosted.py \
    tests/trainer/test_vllm_run.py "$@"
echo "[test_vllm] total $(( $(date +%s) - start )) s"
