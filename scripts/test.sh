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
# The older lines' venvs (a pip install each, about 70 s on a fresh machine) are made in the
# background while the other venvs, the services and the checks are set up, one after the
# other (an editable install rewrites the source tree's egg-info), and waited for before the
# tests start (which read the entry points from that egg-info).
older_log=$(mktemp)
(bash scripts/test-airflow-line.sh --prepare 3.1 && bash scripts/test-airflow-line.sh --prepare 3.2) >"$older_log" 2>&1 &
older_pid=$!
trap 'kill "$older_pid" 2>/dev/null || true; rm -f "$older_log"; bash scripts/services.sh stop' EXIT
bash scripts/browser-venv.sh
bash scripts/torch-venv.sh
bash scripts/services.sh start
# shellcheck disable=SC1091
source .ci/state/services.env
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
wait "$older_pid" || { cat "$older_log"; echo "test.sh: making the Airflow 3.1/3.2 venvs failed" >&2; exit 1; }
# --durations: the slowest tests of each pass, where the time to cut CI down would come from.
.venv/bin/python -m pytest tests --durations=25 "$@"
older=(tests/airflow tests/e2e/test_live_local.py tests/e2e/test_live_orphans.py -m "not torch" --durations=15)
bash scripts/test-airflow-line.sh 3.1 "${older[@]}"
bash scripts/test-airflow-line.sh 3.2 "${older[@]}"
