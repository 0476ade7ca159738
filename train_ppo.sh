#!/usr/bin/env bash
# single-sequence PPO (token GAE through env tokens) on bandit. Experiment settings live in config/ppo_bandit.yaml; every argument is a Hydra override,
# e.g. `bash train_ppo.sh trainer.total_steps=5 model=tiny` or `bash train_ppo.sh trainer=gpu trainer.use_ray=true model.path=Qwen/Qwen2.5-0.5B-Instruct`
# (the CPU default runs the workers in this process; GPUs need Ray workers).
set -euo pipefail
cd "$(dirname "$0")"
source scripts/bootstrap.sh
export TOKENIZERS_PARALLELISM=false RAY_DEDUP_LOGS=0
exec python -m ragen.train --config-name ppo_bandit "$@"
