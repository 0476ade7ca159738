#!/usr/bin/env bash
# The MS-GRPO paper's four search_qa runs: bash scripts/train_search_qa.sh {ms_grpo|ms_po|grpo_outcome|grpo_step} [key=value ...]
# Each is config/search_qa_<run>.yaml; the remaining arguments are Hydra overrides. The device's recipe:
# config/recipe/search_qa_<cpu|gpu>.yaml (trainer=cpu, the default: CPU-sized; trainer=gpu: the paper's settings), e.g.
#   bash scripts/train_search_qa.sh ms_grpo model=tiny trainer.total_steps=2
#   bash scripts/train_search_qa.sh ms_grpo trainer=gpu model.path=Qwen/Qwen2.5-7B-Instruct
set -euo pipefail
cd "$(dirname "$0")/.."
run="${1:-}"
case "$run" in
    ms_grpo|ms_po|grpo_outcome|grpo_step) shift ;;
    *) echo "usage: bash scripts/train_search_qa.sh {ms_grpo|ms_po|grpo_outcome|grpo_step} [key=value ...]" >&2; exit 2 ;;
esac
source scripts/bootstrap.sh
export TOKENIZERS_PARALLELISM=false RAY_DEDUP_LOGS=0
exec python -m ragen.train --config-name "search_qa_$run" "$@"
