#!/usr/bin/env bash
# Run the GPU-marked tests (pytest marker `gpu`, deselected elsewhere) against this host's real
# NVIDIA devices: detection and the local scheduler's GPU ledger. Needs nvidia-smi and the
# project's venv (scripts/setup.sh). Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v nvidia-smi >/dev/null || { echo "gpu-check: nvidia-smi not found: no NVIDIA GPU here" >&2; exit 1; }
bash scripts/setup.sh
TORCHX_TEST_GPU=1 exec .venv/bin/python -m pytest -m gpu tests "$@"
