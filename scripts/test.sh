#!/usr/bin/env bash
# Set up (idempotent), then run the tests: the kernels under the Triton interpreter (CPU) or on
# the GPU, everything else with the kernels' torch references on CPU, and every kernel compiled
# ahead of time for sm_90 and gfx942 (tests/portability, about 6 minutes on two cores, 2 with
# Triton's cache warm), after ruff. Extra args go to pytest.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh || exit 1
PY=${PYTHON:-python3}
interp=1
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" && interp=0
status=0
# the linter first (a second): its rules are pyproject.toml's [tool.ruff]
"$PY" -m ruff check . || status=$?
# TRITON_INTERPRET must be set before triton is imported, hence three pytest processes.
TRITON_INTERPRET=$interp "$PY" -m pytest tests/kernels -q "$@" || status=$?
"$PY" -m pytest tests --ignore=tests/kernels --ignore=tests/portability -q "$@" || { s=$?; [[ $s == 5 ]] || status=$s; }
# Real compilation (not the interpreter), for GPUs this machine need not have.
TRITON_INTERPRET=0 "$PY" -m pytest tests/portability -q "$@" || { s=$?; [[ $s == 5 ]] || status=$s; }
[[ $status == 5 ]] && status=0  # pytest's "no tests collected" is not a failure here
exit $status
