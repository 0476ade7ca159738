#!/usr/bin/env bash
# Train on a SLURM allocation: a Ray head on the first node, a Ray worker node on every other node (srun), wait until
# all have joined, then run a launch script against the head (it joins the cluster, never starts its own Ray).
#
#   sbatch --nodes=2 --gpus-per-node=8 scripts/slurm_train.sh train_ppo_bilevel.sh trainer=gpu model.path=/models/Qwen2.5-3B-Instruct
#
# The first argument is the launch script (train_ppo.sh, train_ppo_bilevel.sh, train_ppo_multi_turn.sh), the rest
# are its Hydra overrides; trainer.nnodes and trainer.n_gpus_per_node are set from the allocation. The repository
# (and its .venv, made by scripts/bootstrap.sh) must be on a file system every node sees. Settings (environment):
# RAY_PORT (6379), RAY_JOIN_TIMEOUT (seconds for all nodes to join, 300).
#SBATCH --job-name=ragen
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=32
#SBATCH --exclusive
#SBATCH --output=slurm-%j.out
set -euo pipefail

REPO="${SLURM_SUBMIT_DIR:-$(cd "$(dirname "$0")/.." && pwd)}"
cd "$REPO"
# shellcheck disable=SC1091
source scripts/bootstrap.sh  # the same Python on every node: srun passes this environment on

LAUNCH="${1:-train_ppo.sh}"
shift || true
PORT="${RAY_PORT:-6379}"
JOIN_TIMEOUT="${RAY_JOIN_TIMEOUT:-300}"
GPUS="${SLURM_GPUS_ON_NODE:-0}"
CPUS="${SLURM_CPUS_PER_TASK:-$(nproc)}"
: "${SLURM_JOB_NODELIST:?submit this script with sbatch (no SLURM allocation found)}"
mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
HEAD="${NODES[0]}"  # this batch script runs on the first node of the allocation
HEAD_IP="$(hostname --ip-address | awk '{print $1}')"
ADDRESS="$HEAD_IP:$PORT"
echo "[slurm] ${#NODES[@]} node(s): ${NODES[*]}; Ray head $HEAD at $ADDRESS; $GPUS GPU(s), $CPUS CPU(s) per node"

PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT

# --overlap: the Ray steps must not hold the node's CPUs against later steps (SLURM >= 20.11).
srun --overlap --nodes=1 --ntasks=1 -w "$HEAD" \
    ray start --head --node-ip-address="$HEAD_IP" --port="$PORT" --num-cpus="$CPUS" --num-gpus="$GPUS" \
    --include-dashboard=false --block &
PIDS+=("$!")

waited=0
until ray status --address="$ADDRESS" >/dev/null 2>&1; do
    if (( waited >= JOIN_TIMEOUT )); then
        echo "[slurm] the Ray head did not come up at $ADDRESS within ${JOIN_TIMEOUT}s" >&2
        exit 1
    fi
    sleep 5
    waited=$(( waited + 5 ))
done

for node in "${NODES[@]:1}"; do
    srun --overlap --nodes=1 --ntasks=1 -w "$node" \
        ray start --address="$ADDRESS" --num-cpus="$CPUS" --num-gpus="$GPUS" --block &
    PIDS+=("$!")
done

python - "$ADDRESS" "${#NODES[@]}" "$JOIN_TIMEOUT" <<'PY'
import sys
import time

import ray

address, want, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
ray.init(address=address, logging_level="ERROR", log_to_driver=False)
deadline = time.monotonic() + timeout
while (alive := sum(1 for n in ray.nodes() if n["Alive"])) < want:
    if time.monotonic() > deadline:
        sys.exit(f"[slurm] only {alive} of {want} Ray nodes joined within {timeout:g}s")
    time.sleep(5)
print(f"[slurm] {alive} Ray nodes up: {ray.cluster_resources()}")
PY

status=0
RAY_ADDRESS="$ADDRESS" bash "$REPO/$LAUNCH" trainer.nnodes="${#NODES[@]}" trainer.n_gpus_per_node="$GPUS" "$@" \
    || status=$?
echo "[slurm] $LAUNCH exited with status $status"
exit "$status"
