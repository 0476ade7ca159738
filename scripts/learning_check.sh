#!/usr/bin/env bash
# The learning checks (pytest marker `learning`: tests/trainer/test_learning.py, and tests/test_learning_table.py, the
# learning table's met claims on 3 seeds with their controls): minutes-long runs of the default model whose
# validation success must rise, and negative controls that must not. Prints a table (run: success before -> after,
# minutes) at the end; extra args go to pytest (e.g. -k credit).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" RAY_DEDUP_LOGS=0 TOKENIZERS_PARALLELISM=false WANDB_MODE=offline HF_HUB_OFFLINE=1
results="$(mktemp)"
export RAGEN_LEARNING_RESULTS="$results"
status=0
python -m pytest -q -m learning tests/trainer/test_learning.py tests/test_learning_table.py "$@" || status=$?
python - "$results" <<'PY'
import json, platform, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
flags = open("/proc/cpuinfo").read() if platform.system() == "Linux" else ""
kind = "native bf16 (avx512_bf16/amx)" if ("avx512_bf16" in flags or "amx_bf16" in flags) else "no native bf16 (fp32)"
print(f"\nlearning table ({platform.machine()}, {kind})")
print(f"{'run':<48}{'success before -> warm start -> after RL':>42}{'steps':>7}{'minutes':>9}")
for r in rows:
    warm = r.get("after_warm_start")
    mid = f"{warm:>6.2f}" if warm is not None else f"{'-':>6}"
    print(f"{r['run']:<48}{r['before']:>20.2f} -> {mid} -> {r['after']:<8.2f}{r['steps']:>7}{r['minutes']:>9.1f}")
PY
rm -f "$results"
exit "$status"
