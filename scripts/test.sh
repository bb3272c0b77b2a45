#!/usr/bin/env bash
# Set up everything the tests need (virtualenv, PyTorch's and the browser's own venvs, Docker
# engine, local registry, busybox image), lint and type-check, run the whole test suite on the
# pinned Airflow 3.3.2, then the Airflow tests, the live local-deployment tests (but the PyTorch
# ones) and the orphaned-jobs tests again on Airflow 3.1.8 (the pre-3.3 cancel-while-deferred
# path) and on 3.2.2, each line in its own venv with its own constraints
# (scripts/test-airflow-line.sh). Services are stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/browser-venv.sh
bash scripts/torch-venv.sh
bash scripts/services.sh start
trap 'bash scripts/services.sh stop' EXIT
# shellcheck disable=SC1091
source .ci/state/services.env
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/python -m pytest tests "$@"
older=(tests/airflow tests/e2e/test_live_local.py tests/e2e/test_live_orphans.py -m "not torch")
bash scripts/test-airflow-line.sh 3.1 "${older[@]}"
bash scripts/test-airflow-line.sh 3.2 "${older[@]}"
