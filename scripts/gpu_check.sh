#!/usr/bin/env bash
# The GPU check: the tests marked `gpu` and the GPU benchmarks, on one CUDA GPU without network:
#
#   bash scripts/gpu_check.sh [--require-cuda | --cpu-rehearsal] WHEEL_DIR OUT_DIR
#
# WHEEL_DIR comes from `bash scripts/gpu_wheels.sh WHEEL_DIR [--ray]` on a networked machine (gpu_wheels/ is ignored
# by git: the device tool carries it). Steps, in this order, each under a hard time limit (timeout; 470 s in all, so
# the whole check with its probe, summaries and archive ends within 8 minutes), the tests each under a per-test
# timeout (pytest-timeout), so that a hung test costs its own time only:
#   step            limit  per test  what
#   install          40 s     -      WHEEL_DIR's wheels of distributions this Python lacks into a temporary site
#                                    dir (PYTHONPATH: that dir, this checkout, scripts/); the machine's own torch,
#                                    transformers, ... are never replaced; then every module the runs import
#                                    (scripts/gpu_check.py imports)
#   tests_basic      90 s    40 s    FSDP2 update under a one-rank NCCL group (fp32 = the CPU update, bf16 within
#                                    bounds), log-probs / values against a CPU reference, hf engine KV reuse across
#                                    turns, sleep / wake, the training state offloaded while the engine generates,
#                                    per-phase memory peaks
#   tests_runs      140 s   110 s    3-step multi-turn run colocated on the GPU; a run killed after step 2 and
#                                    resumed equals an unbroken one
#   tests_optional   80 s    60 s    3-step run with Ray workers in the GPU placement group, wandb offline, flash-attn
#                                    against sdpa (each reports "skipped (missing ray)" / "skipped (missing wandb)" /
#                                    skipped without flash_attn, which no wheel profile carries)
#   bench_train      75 s     -      bench/gpu_bench.py train: actor update against a bare torch loop, MFU (0.5B
#                                    and 3B shapes)
#   bench_generate   45 s     -      bench/gpu_bench.py generate: hf engine against transformers' generate,
#                                    sleep / wake memory
# A step's processes left running when it ends are killed (each step leads its own process group).
# Results are written as they happen. OUT_DIR gets at most 7 files (the device tool returns 8): tests.tsv (one line
# per test as it starts and ends: scripts/pytest_live_log.py), steps.tsv (one line per step), gpu_check.json (date,
# machine, command, every step's and test's status, the figures: scripts/gpu_check.py summary, rewritten after every
# step), bench_train.json, bench_generate.json, logs.tar.gz (the finished steps' logs, rewritten after every step) and
# <step>.log of the step that is running. The console ends with a summary and the lines for docs/benchmarks.md.
# Without CUDA: prints what it would run (the wheels it would install or skip, each command with its limit), writes
# gpu_check.json with every step "not run (no CUDA)" and exits 0 (CI); with --require-cuda the same is a failure
# (exit 1, saying why). --cpu-rehearsal runs every step here on the CPU as it would run on the GPU (the `gpu` tests
# skip without CUDA, the benchmarks run in their smoke mode, --device cpu --tiny): a check of this script itself.
# Exit status: 0 when no step failed (skips included), 1 when one did or CUDA was required and absent, 2 on bad
# arguments. PYTHON: the interpreter (default python3).
set -uo pipefail

say() { echo "[gpu_check] $*"; }
usage() { echo "usage: bash scripts/gpu_check.sh [--require-cuda | --cpu-rehearsal] WHEEL_DIR OUT_DIR" >&2; exit 2; }
MODE=plan_without_cuda
case "${1:-}" in
    --require-cuda) MODE=require_cuda; shift ;;
    --cpu-rehearsal) MODE=rehearsal; shift ;;
    -*) usage ;;
esac
[ $# -eq 2 ] || usage
COMMAND="bash scripts/gpu_check.sh $*"
if [ ! -d "$1" ]; then
    echo "[gpu_check] WHEEL_DIR '$1' is not a folder; build it with: bash scripts/gpu_wheels.sh $1" >&2
    exit 2
fi
WHEEL_DIR="$(cd "$1" && pwd)"
mkdir -p "$2" && OUT_DIR="$(cd "$2" && pwd)"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
SITE="$TMP/site" LOGS="$TMP/logs"
mkdir -p "$LOGS"

# ---- the plan: tests in this order, most basic first (node ids; -m gpu picks their cuda variants)
TESTS_BASIC=(
    tests/workers/test_gpu_workers.py::test_fsdp2_update_on_one_rank_equals_the_cpu_update_in_fp32
    tests/workers/test_gpu_workers.py::test_fsdp2_bf16_update_stays_within_bounds_of_fp32
    tests/workers/test_gpu_workers.py::test_log_probs_and_values_on_the_device_equal_a_cpu_reference
    tests/rollout/test_gpu_engine.py::test_kv_reuse_across_turns_gives_the_greedy_rollouts_of_full_prefills
    tests/rollout/test_gpu_engine.py::test_sleep_frees_the_engine_memory_and_wake_restores_it
    tests/rollout/test_gpu_hf_sleep.py::test_hf_engine_wakes_its_weights_for_the_weights_tag_only
    tests/workers/test_gpu_offload.py::test_offload_frees_the_training_state_while_the_engine_generates
    tests/workers/test_gpu_offload.py::test_phase_memory_reads_the_peaks_of_the_memory_the_process_uses
)
TESTS_RUNS=(
    tests/trainer/test_gpu_runs.py::test_multi_turn_run_colocated_on_one_device
    tests/trainer/test_gpu_runs.py::test_resume_after_a_kill_equals_an_unbroken_run
)
TESTS_OPTIONAL=(
    tests/trainer/test_gpu_runs.py::test_multi_turn_run_with_ray_workers_on_one_gpu
    tests/trainer/test_gpu_runs.py::test_run_logs_to_wandb_offline
    tests/workers/test_gpu_attention.py::test_varlen_attention_matches_sdpa_in_bf16
)
BENCH_ARGS=()
[ "$MODE" = rehearsal ] && BENCH_ARGS=(--device cpu --tiny)
q() { printf '%q ' "$@"; }  # one command line, quoted for bash -c
pytest_cmd() {  # PER_TEST_TIMEOUT NODE_ID...
    local per_test=$1
    shift
    q "$PY" -m pytest -m gpu -p no:cacheprovider -p pytest_live_log -rA --timeout="$per_test" "$@"
}
mapfile -t WHEELS < <("$PY" scripts/gpu_check.py wheels "$WHEEL_DIR" | awk -F'\t' '$1 == "install" {print $2}')
INSTALL="$(q "$PY" scripts/gpu_check.py imports)"
if [ "${#WHEELS[@]}" -gt 0 ]; then
    INSTALL="$(q "$PY" -m pip install --no-deps --no-index --no-compile --disable-pip-version-check \
        --target "$SITE" "${WHEELS[@]}") && $INSTALL"
fi
NAMES=(install tests_basic tests_runs tests_optional bench_train bench_generate)
LIMITS=(40 90 140 80 75 45)
CMDS=(
    "$INSTALL"
    "$(pytest_cmd 40 "${TESTS_BASIC[@]}")"
    "$(pytest_cmd 110 "${TESTS_RUNS[@]}")"
    "$(pytest_cmd 60 "${TESTS_OPTIONAL[@]}")"
    "$(q "$PY" bench/gpu_bench.py train --budget-s 12 --out "$OUT_DIR/bench_train.json" "${BENCH_ARGS[@]}")"
    "$(q "$PY" bench/gpu_bench.py generate --budget-s 10 --out "$OUT_DIR/bench_generate.json" "${BENCH_ARGS[@]}")"
)

# what an earlier check left in OUT_DIR goes: the summary reads every bench_*.json there
(cd "$OUT_DIR" && rm -f steps.tsv tests.tsv gpu_check.json bench_*.json logs.tar.gz "${NAMES[@]/%/.log}")
: > "$OUT_DIR/steps.tsv"

record() {  # name status seconds
    printf '%s\t%s\t%s\n' "$1" "$2" "$3" >> "$OUT_DIR/steps.tsv"
    say "$1: $2 ($3 s)"
}

cuda="$(timeout 120 "$PY" -c 'import torch; print("yes" if torch.cuda.is_available() else
    "torch.cuda.is_available() is False")' 2>&1 | tail -n 1)"
if [ "$cuda" != "yes" ] && [ "$MODE" != rehearsal ]; then
    say "no CUDA device ($cuda): nothing runs here. On a CUDA machine this check would:"
    say "install the wheels it lacks from $WHEEL_DIR into a temporary site dir:"
    "$PY" scripts/gpu_check.py wheels "$WHEEL_DIR" | sed 's/^/    /'
    [ -d "$WHEEL_DIR/tokenizer" ] || say "warning: $WHEEL_DIR/tokenizer is missing (scripts/gpu_wheels.sh writes it); the runs need it"
    for i in "${!NAMES[@]}"; do
        say "would run [${NAMES[$i]}, limit ${LIMITS[$i]} s]: ${CMDS[$i]}"
        record "${NAMES[$i]}" "not run (no CUDA)" 0
    done
    "$PY" scripts/gpu_check.py summary "$OUT_DIR" --cuda 0 --command "$COMMAND"
    if [ "$MODE" = require_cuda ]; then
        say "FAILED: --require-cuda was given and this machine has no CUDA device ($cuda)"
        exit 1
    fi
    exit 0
fi

export PYTHONPATH="$SITE:$ROOT:$ROOT/scripts" RAGEN_CONFIG_DIR="$ROOT/config" RAGEN_CACHE_DIR="$TMP/cache" \
    RAGEN_TEST_LOG="$OUT_DIR/tests.tsv" WANDB_MODE=offline HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
    RAY_DEDUP_LOGS=0 RAY_USAGE_STATS_ENABLED=0 MPLBACKEND=Agg PYTHONUNBUFFERED=1
if [ -d "$WHEEL_DIR/tokenizer" ]; then
    export RAGEN_GPU_TOKENIZER="$WHEEL_DIR/tokenizer"
else
    say "warning: $WHEEL_DIR/tokenizer is missing (scripts/gpu_wheels.sh writes it): the runs' tests export one"
fi
[ "$MODE" = rehearsal ] && say "CPU rehearsal: every step runs here on the CPU ($cuda)"
"$PY" scripts/gpu_check.py machine > "$TMP/machine.json" 2> "$LOGS/machine.err"
SUMMARY=("$PY" scripts/gpu_check.py summary "$OUT_DIR" --cuda "$([ "$cuda" = yes ] && echo 1 || echo 0)"
    --command "$COMMAND" --machine "$TMP/machine.json")
failed=0
for i in "${!NAMES[@]}"; do
    name="${NAMES[$i]}"
    log="$OUT_DIR/$name.log"
    say "running [$name, limit ${LIMITS[$i]} s]: ${CMDS[$i]}"
    start=$SECONDS
    timeout --kill-after=10 "${LIMITS[$i]}" bash -c "${CMDS[$i]}" > "$log" 2>&1 &
    pid=$!
    wait "$pid"
    rc=$?
    kill -KILL -- "-$pid" 2> /dev/null  # what the step left running: timeout leads the step's process group
    case $rc in
        0) status="passed" ;;
        124 | 137) status="failed (timed out after ${LIMITS[$i]} s)" ;;
        *) status="failed (exit $rc)" ;;
    esac
    record "$name" "$status" $((SECONDS - start))
    if [[ "$status" == failed* ]]; then
        failed=1
        tail -n 30 "$log" | sed "s/^/    $name| /"
    fi
    mv "$log" "$LOGS/"
    tar -czf "$OUT_DIR/logs.tar.gz" -C "$LOGS" .
    "${SUMMARY[@]}" --quiet
done
"${SUMMARY[@]}"
exit "$failed"
