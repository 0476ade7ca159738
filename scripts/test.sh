#!/usr/bin/env bash
# Run the whole test suite (bootstraps ./.venv on a fresh machine). Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" RAY_DEDUP_LOGS=0 TOKENIZERS_PARALLELISM=false WANDB_MODE=offline HF_HUB_OFFLINE=1
ruff check ragen tests bench scripts external
python -m pytest -q "$@"
