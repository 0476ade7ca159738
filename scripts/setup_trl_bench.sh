#!/usr/bin/env bash
# Install TRL 1.16.0 for the peer benchmark (bench/peers/trl_grpo.py) into ./.bench-trl, outside the project's
# environment: TRL is a bench dependency, never a runtime one, and nothing in .venv changes. The bench puts the folder
# on sys.path (and on PYTHONPATH of its subprocesses). Re-running it is a no-op once TRL is there.
#
#   bash scripts/setup_trl_bench.sh        # then: python bench/peers/trl_grpo.py --help
#
# --no-deps: TRL's requirements (accelerate, datasets, huggingface_hub, jinja2, numpy, packaging, pandas, psutil,
# pyarrow, pyyaml, transformers) are all in .venv already (the project's own dependencies and its [dev] extra); the
# script checks them with `pip check`-style version tests instead of letting pip resolve anything, so no other torch
# or transformers can ever be pulled.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh
if [ -n "${PYTHON:-}" ]; then PY="$PYTHON"
elif [ -n "${VIRTUAL_ENV:-}" ]; then PY="$VIRTUAL_ENV/bin/python"
else PY=python3; fi
TARGET=.bench-trl
VERSION=1.16.0

# TRL's declared requirements, read from its own metadata, must hold in the project's environment.
deps_ok() {
    PYTHONPATH="$TARGET" "$PY" - <<'PY' >&2
import sys
from importlib.metadata import PackageNotFoundError, distribution, version

from packaging.requirements import Requirement

missing = []
for line in distribution("trl").requires or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue  # an extra (vllm, peft, deepspeed...): not used by the bench
    try:
        have = version(req.name)
    except PackageNotFoundError:
        missing.append(f"{req} (not installed)")
        continue
    if not req.specifier.contains(have, prereleases=True):
        missing.append(f"{req} (have {have})")
if missing:
    print("[trl] unmet requirements: " + "; ".join(missing) + ". Install them into the environment with torch "
          "pinned, e.g. pip install 'torch==2.13.0' '<requirement>'", file=sys.stderr)
    sys.exit(1)
PY
}

if PYTHONPATH="$TARGET" "$PY" -c "from importlib.metadata import version; assert version('trl') == '$VERSION'" \
        >/dev/null 2>&1; then
    echo "[trl] TRL $VERSION is ready in $TARGET" >&2
else
    echo "[trl] installing trl==$VERSION --no-deps into $TARGET" >&2
    rm -rf "$TARGET"
    "$PY" -m pip install -q --disable-pip-version-check --no-deps --target "$TARGET" "trl==$VERSION" >&2
fi
deps_ok
PYTHONPATH="$TARGET" "$PY" -c "import torch; from trl import GRPOConfig, GRPOTrainer; print('[trl] imports with torch',
torch.__version__)" >&2
