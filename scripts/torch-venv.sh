#!/usr/bin/env bash
# PyTorch (CPU) in a virtualenv of its own (.venv-torch, or $TORCHX_TEST_TORCH_VENV) for the
# tests that run real torchrun/DDP jobs: the jobs get its bin/ on PATH; the project's venv and
# the package never depend on torch. Idempotent (a stamp file names what was installed).
# torch 2.13.0 is a CPU build where pip finds the local wheel (find-links); elsewhere PyPI's
# build of that release is taken (larger, still runs on the CPU). numpy silences torch's warning.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${TORCHX_TEST_TORCH_VENV:-.venv-torch}
pins=(torch==2.13.0 numpy==2.3.5)
stamp="$venv/.installed"
[ "$(cat "$stamp" 2>/dev/null)" = "${pins[*]}" ] && exit 0
python=${PYTHON:-python3}
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${pins[@]}"
"$venv/bin/python" -c "import torch, torch.distributed as d; assert d.is_gloo_available(), 'torch without gloo'"
echo "${pins[*]}" >"$stamp"
