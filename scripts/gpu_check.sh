#!/usr/bin/env bash
# The checks only a CUDA machine can run, in one call (see scripts/gpu_check.py for the steps):
#   bash scripts/gpu_check.sh OUT_DIR [--wheels DIR] [--dry-run] [--only STEP,...]
# Offline: torch and triton must already be installed; other packages come from --wheels DIR,
# prepared beforehand with scripts/prepare_gpu_wheels.sh. Exits non-zero when any step fails.
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" scripts/gpu_check.py "$@"
