#!/usr/bin/env bash
# Bi-level GAE PPO on FrozenLake 3x3. Experiment: config/ppo_bilevel.yaml; the device's recipe:
# config/recipe/multi_turn_<cpu|gpu>.yaml (trainer=cpu, the default: the measured CPU demo; trainer=gpu: RAGEN's
# settings on 8 GPUs with Ray workers and vLLM). Every argument is a Hydra override, e.g.
#   bash train_ppo_bilevel.sh trainer.total_steps=5 model=tiny
#   bash train_ppo_bilevel.sh env=sokoban                 # any config/env/ file, with its own turns and config
#   bash train_ppo_bilevel.sh trainer=gpu model.path=/models/Qwen2.5-3B-Instruct
set -euo pipefail
cd "$(dirname "$0")"
source scripts/bootstrap.sh
export TOKENIZERS_PARALLELISM=false RAY_DEDUP_LOGS=0
exec python -m ragen.train --config-name ppo_bilevel "$@"
