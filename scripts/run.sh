#!/usr/bin/env bash
# Set up (idempotent), then serve the embedded default: python run_spec.py [hydra overrides...]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh
exec "${PYTHON:-python3}" run_spec.py "$@"
