#!/usr/bin/env bash
# Install verl 0.9.1 (what external/verl is written against) into the project's Python without touching torch or
# transformers. Re-running it is a no-op once they are installed (a 0.2 s version check, after bootstrap.sh's own
# import check). Logs go to stderr.
#
#   bash scripts/setup_verl.sh        # then: python -m pytest external/verl
#
# Why not `pip install .[verl]`: verl 0.9.1 declares transformers<5.11 (the project runs 5.2x), tensordict<=0.10
# and pins torch in some extras, so a plain install would downgrade transformers. Instead verl, tensordict (whose
# compiled part loads with torch 2.13.0) and pyvers (declares packaging<26; only its version parsing is used) go in
# with --no-deps, and then only the packages the imports of `verl.trainer.ppo.core_algos` and
# `verl.experimental.agent_loop` fail without (found by trial), with torch and the installed transformers pinned
# in the same pip command so the resolver cannot move them:
#   codetiming, orjson (verl.utils), cachetools, uvicorn, fastapi (verl.workers.rollout),
#   datasets (verl.utils.dataset; brings dill, multiprocess, pandas).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh
# the Python bootstrap.sh settled on: $PYTHON if given, else the venv it activated (or the active one), else python3
if [ -n "${PYTHON:-}" ]; then PY="$PYTHON"
elif [ -n "${VIRTUAL_ENV:-}" ]; then PY="$VIRTUAL_ENV/bin/python"
else PY=python3; fi

# Fast check (no import of verl, ~1 s): the exact versions are installed, plus everything the imports need.
check() {
    "$PY" - <<'PY' >/dev/null 2>&1
from importlib.metadata import version
assert version("verl") == "0.9.1" and version("tensordict") == "0.10.0"
assert version("torch").startswith("2.13.0")
for name in ("pyvers", "codetiming", "orjson", "cachetools", "uvicorn", "fastapi", "datasets"):
    version(name)
PY
}
# Full check after an install: the modules external/verl uses import.
imports() {
    "$PY" -c "import verl.trainer.ppo.core_algos, verl.experimental.agent_loop.agent_loop" >&2
}

if check; then
    echo "[verl] verl 0.9.1 is ready" >&2
    exit 0
fi
TRANSFORMERS="$("$PY" -c 'import transformers; print(transformers.__version__)')"
start=$(date +%s)
pip_() { "$PY" -m pip install -q --disable-pip-version-check "$@" >&2; }
echo "[verl] installing verl 0.9.1 --no-deps (+ tensordict 0.10.0, pyvers 0.1.0)" >&2
pip_ --no-deps "verl==0.9.1" "tensordict==0.10.0" "pyvers==0.1.0"
echo "[verl] installing what its core_algos / agent_loop imports need (torch, transformers $TRANSFORMERS pinned)" >&2
pip_ "codetiming>=1.4" "orjson>=3.9" "cachetools>=5" "uvicorn>=0.30" "fastapi>=0.110" "datasets>=3" \
    "torch==2.13.0" "transformers==$TRANSFORMERS"
if ! check || ! imports; then
    echo "[verl] verl does not import after the install (see above)" >&2
    exit 1
fi
echo "[verl] ready in $(( $(date +%s) - start )) s" >&2
