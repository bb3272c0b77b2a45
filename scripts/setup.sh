#!/usr/bin/env bash
# Set up the development environment: a virtualenv in .venv with the package (editable) and its
# test extras, pinned by the committed constraints file. Idempotent; safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[test]"
