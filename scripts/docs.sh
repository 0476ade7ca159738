#!/usr/bin/env bash
# Build the documentation site (mkdocs.yml: MkDocs + Material, the API reference from docstrings by mkdocstrings) in
# strict mode: a broken link, a page missing from the nav or an unresolved API reference fails the build. Installs
# the pinned documentation tools into the active environment when they are missing (PyPI). Writes the site to
# SITE_DIR (default: the site/ folder, ignored by git). Extra arguments go to `mkdocs build`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh
PINS=("mkdocs==1.6.1" "mkdocs-material==9.8.2" "mkdocstrings==1.0.8" "mkdocstrings-python==2.0.11")
if ! python - "${PINS[@]}" >/dev/null 2>&1 <<'EOF'
import sys
from importlib.metadata import version

for pin in sys.argv[1:]:
    name, want = pin.split("==")
    assert version(name) == want, pin
EOF
then
    echo "[ragen] installing the documentation tools (${PINS[*]})" >&2
    python -m pip install -q "torch==2.13.0" "${PINS[@]}" >&2
fi
export NO_MKDOCS_2_WARNING=1  # Material's notice about a future MkDocs release, not about this site
python -m mkdocs build --strict --site-dir "${SITE_DIR:-site}" "$@"
