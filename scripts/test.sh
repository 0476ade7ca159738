#!/usr/bin/env bash
# Run the default test suite (bootstraps ./.venv on a fresh machine). Extra args go to pytest: -m slow runs the tests
# the default run leaves out (multi-process and minutes-long runs; CI runs both).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" RAY_DEDUP_LOGS=0 TOKENIZERS_PARALLELISM=false WANDB_MODE=offline HF_HUB_OFFLINE=1
# The suite writes ~4 GB of checkpoints under the temp root while it runs: say so up front when space is short.
free_gb=$(df -Pk "${TMPDIR:-/tmp}" | awk 'NR==2 {print int($4 / 1048576)}')
if [ "${free_gb:-99}" -lt 6 ]; then
    echo "[ragen] warning: only ${free_gb} GB free under ${TMPDIR:-/tmp}; the test suite needs ~4 GB there" >&2
fi
ruff check ragen tests bench scripts external
# Two pytest workers (pytest-xdist), one test file per worker at a time (files keep their module fixtures and their
# Ray clusters to themselves; docs/benchmarks.md has the times). RAGEN_TEST_WORKERS=0 runs it in
# this process; without pytest-xdist (pip install -e '.[dev]') it runs in one process too, saying so.
workers=(-n "${RAGEN_TEST_WORKERS:-2}" --dist loadfile)
if ! python -c "import xdist" >/dev/null 2>&1; then
    echo "[ragen] pytest-xdist is not installed (pip install -e '.[dev]'): the tests run in one process" >&2
    workers=()
fi
python -m pytest -q "${workers[@]}" "$@"
