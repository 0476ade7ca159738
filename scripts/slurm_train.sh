#!/usr/bin/env bash
# Train on a SLURM allocation: a Ray head on the first node, a Ray worker node on every other node (srun), wait until
# all have joined, then run a launch script against the head (it joins the cluster, never starts its own Ray).
#
#   sbatch --nodes=2 --gpus-per-node=8 scripts/slurm_train.sh train_ppo_bilevel.sh trainer=gpu trainer.use_ray=true model.path=/models/Qwen2.5-3B-Instruct
#
# The first argument is the launch script (train_ppo.sh, train_ppo_bilevel.sh, train_ppo_multi_turn.sh), the rest
# are its Hydra overrides; trainer.nnodes and trainer.n_gpus_per_node are set from the allocation. The repository
# (and its .venv, made by scripts/bootstrap.sh) must be on a file system every node sees, and so must Ray's token
# (~/.ray/auth_token in a shared home, made here if missing) unless RAY_AUTH_MODE=disabled. Settings (environment):
# RAY_PORT (6379), RAY_HEAD_IP (default: the first address of `hostname -I`), RAY_JOIN_TIMEOUT (seconds for all
# nodes to join, 300).
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
HEAD_IP="${RAY_HEAD_IP:-$(hostname -I | awk '{print $1}')}"  # not --ip-address: often 127.0.1.1
ADDRESS="$HEAD_IP:$PORT"
echo "[slurm] ${#NODES[@]} node(s): ${NODES[*]}; Ray head $HEAD at $ADDRESS; $GPUS GPU(s), $CPUS CPU(s) per node"

# Ray's token authentication, one mode for the whole job: `ray start --head` turns it on by itself when a token
# exists, but a driver that joins by address only with RAY_AUTH_MODE=token (exported: srun steps and the launch
# script inherit it). Every node reads the token from ~/.ray/auth_token, RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH.
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}"
if [[ "$RAY_AUTH_MODE" == token && -z "${RAY_AUTH_TOKEN:-}${RAY_AUTH_TOKEN_PATH:-}" && ! -s "$HOME/.ray/auth_token" ]]; then
    ray get-auth-token --generate >/dev/null
fi

# wait_for_nodes N: until the Ray cluster at $ADDRESS answers and has N alive nodes (else exit after JOIN_TIMEOUT)
wait_for_nodes() {
    python - "$ADDRESS" "$1" "$JOIN_TIMEOUT" <<'PY'
import sys
import time

import ray

address, want, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
deadline, alive = time.monotonic() + timeout, 0
while time.monotonic() < deadline:
    try:
        if not ray.is_initialized():
            ray.init(address=address, logging_level="ERROR", log_to_driver=False)
        alive = sum(1 for n in ray.nodes() if n["Alive"])
    except Exception as exc:  # the head is not up yet
        print(f"[slurm] waiting for the Ray head at {address}: {type(exc).__name__}", file=sys.stderr)
    if alive >= want:
        print(f"[slurm] {alive} Ray node(s) up: {ray.cluster_resources()}")
        sys.exit(0)
    time.sleep(5)
sys.exit(f"[slurm] only {alive} of {want} Ray node(s) up at {address} within {timeout:g}s")
PY
}

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

wait_for_nodes 1  # the head
for node in "${NODES[@]:1}"; do
    srun --overlap --nodes=1 --ntasks=1 -w "$node" \
        ray start --address="$ADDRESS" --num-cpus="$CPUS" --num-gpus="$GPUS" --block &
    PIDS+=("$!")
done

wait_for_nodes "${#NODES[@]}"

status=0
RAY_ADDRESS="$ADDRESS" bash "$REPO/$LAUNCH" trainer.nnodes="${#NODES[@]}" trainer.n_gpus_per_node="$GPUS" "$@" \
    || status=$?
echo "[slurm] $LAUNCH exited with status $status"
exit "$status"
