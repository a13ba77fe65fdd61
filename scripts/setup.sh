#!/usr/bin/env bash
# Idempotent set-up for a fresh machine (sourced by scripts/run.sh and scripts/test.sh).
#  1. torch: a CPU machine without torch gets the 2.13.0 CPU build (an unpinned `torch` would pull a
#     multi-GB CUDA build); a GPU machine keeps the torch it has.
#  2. eaglet itself, editable, with its test extras.
#  3. the embedded default (SmolLM2-135M-Instruct GGUF, ShareGPT, MT-bench, HumanEval) into $EAGLET_CACHE.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
pipq() { "$PY" -m pip install --disable-pip-version-check -q "$@"; }
if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "[setup] installing torch==2.13.0 (CPU build)"
  pipq torch==2.13.0
fi
stamp=".setup-stamp"
want=$(cat pyproject.toml | sha1sum | cut -d' ' -f1)
# reinstall when pyproject changed, a dependency is missing, or eaglet is installed from another checkout
here_check="import eaglet.engine, hydra, wandb, gguf, pytest, sys; sys.exit(not eaglet.engine.__file__.startswith('$PWD/'))"
if [[ "$(cat "$stamp" 2>/dev/null)" != "$want" ]] || ! "$PY" -c "$here_check" 2>/dev/null; then
  echo "[setup] installing eaglet (editable) and its dependencies"
  pipq -e ".[test]"
  echo "$want" > "$stamp"
fi
"$PY" -m eaglet.data.assets
