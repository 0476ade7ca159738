#!/usr/bin/env bash
# The GPU check, for one CUDA GPU without network, in at most 10 minutes:
#
#   bash scripts/gpu_check.sh WHEEL_DIR OUT_DIR
#
# WHEEL_DIR comes from `bash scripts/gpu_wheels.sh WHEEL_DIR` on a networked machine (its header lists what the
# GPU machine is assumed to have). Steps, each with a hard time limit (timeout; 570 s in all):
#   install         ragen from this checkout (pip --no-deps) and WHEEL_DIR's wheels into a temporary site dir put
#                   on PYTHONPATH; a wheel whose distribution this Python already has is skipped (the machine's own
#                   torch, transformers, ... are never replaced); then the modules the runs import are checked.
#   tests           pytest -m gpu over tests/*/test_gpu_*.py: the cuda variants of the GPU twins (FSDP2 with NCCL,
#                   bf16, log-probs / values, hf engine KV reuse, sleep / wake, 3-step runs with and without Ray,
#                   resume after a kill, wandb offline). A test whose dependency is absent reports skipped (missing
#                   ray / missing wandb).
#   bench_train     bench/gpu_bench.py train: actor update against a bare torch loop, MFU (0.5B and 3B shapes).
#   bench_generate  bench/gpu_bench.py generate: the hf engine against transformers' generate, sleep / wake memory.
# Output in OUT_DIR: <step>.log, tests.xml (JUnit), bench_train.json, bench_generate.json and gpu_check.json (date,
# machine, command, every step's and every test's status, the figures; scripts/gpu_check.py summary), and a summary
# on the console with the lines for docs/benchmarks.md.
# Without CUDA (CI): prints what it would run (the wheels it would install or skip, each command with its limit),
# writes gpu_check.json with every step "not run (no CUDA)" and exits 0.
# Exit status: 0 when no step failed (skips included), 1 when one did, 2 on bad arguments. PYTHON: the interpreter
# (default python3).
set -uo pipefail

say() { echo "[gpu_check] $*"; }
if [ $# -ne 2 ]; then
    echo "usage: bash scripts/gpu_check.sh WHEEL_DIR OUT_DIR" >&2
    exit 2
fi
COMMAND="bash scripts/gpu_check.sh $1 $2"
if [ ! -d "$1" ]; then
    echo "[gpu_check] WHEEL_DIR '$1' is not a folder; build it with: bash scripts/gpu_wheels.sh $1" >&2
    exit 2
fi
WHEEL_DIR="$(cd "$1" && pwd)"
mkdir -p "$2" && OUT_DIR="$(cd "$2" && pwd)"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
: > "$OUT_DIR/steps.tsv"

q() { printf '%q ' "$@"; }  # one command line, quoted for bash -c
TESTS=(tests/*/test_gpu_*.py)
NAMES=(tests bench_train bench_generate)
LIMITS=(270 150 90)
CMDS=(
    "$(q "$PY" -m pytest -m gpu -p no:cacheprovider -rA --junitxml="$OUT_DIR/tests.xml" "${TESTS[@]}")"
    "$(q "$PY" bench/gpu_bench.py train --budget-s 40 --out "$OUT_DIR/bench_train.json")"
    "$(q "$PY" bench/gpu_bench.py generate --budget-s 30 --out "$OUT_DIR/bench_generate.json")"
)
INSTALL_LIMIT=60
OPTIONAL=(ray wandb)
REQUIRED=(ragen torch transformers peft accelerate safetensors yaml hydra omegaconf gymnasium matplotlib pytest)

record() {  # name status seconds
    printf '%s\t%s\t%s\n' "$1" "$2" "$3" >> "$OUT_DIR/steps.tsv"
    say "$1: $2 ($3 s)"
}

cuda="$("$PY" -c 'import torch; print("yes" if torch.cuda.is_available() else "torch.cuda.is_available() is False")' \
    2>&1 | tail -n 1)"
if [ "$cuda" != "yes" ]; then
    say "no CUDA device ($cuda): nothing runs here. On a CUDA machine this check would:"
    say "install [limit ${INSTALL_LIMIT} s] into a temporary site dir: ragen from $ROOT (pip --no-deps), and from $WHEEL_DIR:"
    "$PY" scripts/gpu_check.py wheels "$WHEEL_DIR" | sed 's/^/    /'
    [ -d "$WHEEL_DIR/tokenizer" ] || say "warning: $WHEEL_DIR/tokenizer is missing (scripts/gpu_wheels.sh writes it); the runs need it"
    record install "not run (no CUDA)" 0
    for i in "${!NAMES[@]}"; do
        say "would run [${NAMES[$i]}, limit ${LIMITS[$i]} s]: ${CMDS[$i]}"
        record "${NAMES[$i]}" "not run (no CUDA)" 0
    done
    "$PY" scripts/gpu_check.py summary "$OUT_DIR" --cuda 0 --command "$COMMAND"
    exit 0
fi

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
SITE="$TMP/site"
export PYTHONPATH="$SITE" RAGEN_CONFIG_DIR="$ROOT/config" RAGEN_CACHE_DIR="$TMP/cache" WANDB_MODE=offline \
    HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false RAY_DEDUP_LOGS=0 RAY_USAGE_STATS_ENABLED=0 MPLBACKEND=Agg
if [ -d "$WHEEL_DIR/tokenizer" ]; then
    export RAGEN_GPU_TOKENIZER="$WHEEL_DIR/tokenizer"
else
    say "warning: $WHEEL_DIR/tokenizer is missing (scripts/gpu_wheels.sh writes it): the runs' tests will fail"
fi
failed=0

# ---- install
start=$SECONDS
{
    if ! timeout "$INSTALL_LIMIT" "$PY" -m pip install --no-deps --no-build-isolation --no-index --target "$SITE" "$ROOT"; then
        echo "pip could not install ragen from $ROOT: the checkout goes on PYTHONPATH instead"
        PYTHONPATH="$SITE:$ROOT"
    fi
    mapfile -t wheels < <("$PY" scripts/gpu_check.py wheels "$WHEEL_DIR" | awk -F'\t' '$1 == "install" {print $2}')
    "$PY" scripts/gpu_check.py wheels "$WHEEL_DIR"
    if [ "${#wheels[@]}" -gt 0 ]; then
        timeout "$INSTALL_LIMIT" "$PY" -m pip install --no-deps --no-index --target "$SITE" "${wheels[@]}"
    fi
} > "$OUT_DIR/install.log" 2>&1
install_rc=$?
# outside the checkout, so that `ragen` resolves to what PYTHONPATH holds
missing="$(cd "$TMP" && "$PY" -c 'import importlib.util, sys; print(" ".join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))' "${REQUIRED[@]}")"
absent="$(cd "$TMP" && "$PY" -c 'import importlib.util, sys; print(" ".join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))' "${OPTIONAL[@]}")"
(cd "$TMP" && "$PY" -c 'import ragen; print("ragen from", ragen.__path__[0])') >> "$OUT_DIR/install.log" 2>&1
if [ "$install_rc" -ne 0 ]; then
    status="failed (exit $install_rc; see install.log)"
elif [ -n "$missing" ]; then
    status="failed (missing $missing)"
else
    status="passed"
fi
[ -n "$absent" ] && say "absent (their tests report skipped): $absent"
record install "$status" $((SECONDS - start))
[[ "$status" == failed* ]] && failed=1

# ---- tests and benchmarks
for i in "${!NAMES[@]}"; do
    name="${NAMES[$i]}"
    say "running [$name, limit ${LIMITS[$i]} s]: ${CMDS[$i]}"
    start=$SECONDS
    timeout --kill-after=10 "${LIMITS[$i]}" bash -c "${CMDS[$i]}" > "$OUT_DIR/$name.log" 2>&1
    rc=$?
    case $rc in
        0) status="passed" ;;
        124 | 137) status="failed (timed out after ${LIMITS[$i]} s)" ;;
        *) status="failed (exit $rc)" ;;
    esac
    record "$name" "$status" $((SECONDS - start))
    if [[ "$status" == failed* ]]; then
        failed=1
        tail -n 30 "$OUT_DIR/$name.log" | sed "s/^/    $name| /"
    fi
done

(cd "$TMP" && "$PY" "$ROOT/scripts/gpu_check.py" summary "$OUT_DIR" --cuda 1 --command "$COMMAND")
exit "$failed"
