#!/usr/bin/env bash
# Single-sequence PPO (token GAE through env tokens) on the bandit. Experiment: config/ppo_bandit.yaml; the device's
# recipe: config/recipe/bandit_<cpu|gpu>.yaml (trainer=cpu, the default: the measured CPU demo with in-process
# workers; trainer=gpu: RAGEN's settings on 8 GPUs with Ray workers and vLLM). Every argument is a Hydra override, e.g.
#   bash train_ppo.sh trainer.total_steps=5 model=tiny
#   bash train_ppo.sh trainer=gpu model.path=Qwen/Qwen2.5-0.5B-Instruct
#   bash train_ppo.sh trainer=gpu trainer.n_gpus_per_node=4 model.path=/models/Qwen2.5-3B-Instruct
set -euo pipefail
cd "$(dirname "$0")"
source scripts/bootstrap.sh
export TOKENIZERS_PARALLELISM=false RAY_DEDUP_LOGS=0
exec python -m ragen.train --config-name ppo_bandit "$@"
