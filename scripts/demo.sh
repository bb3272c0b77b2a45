#!/usr/bin/env bash
# The main job: set up, then run the example DAG `torchx_local_echo` with `airflow dags test`
# on SQLite and the local scheduler. Airflow state goes to .demo/ (or $AIRFLOW_HOME).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export AIRFLOW_HOME=${AIRFLOW_HOME:-$PWD/.demo/airflow}
export AIRFLOW__CORE__DAGS_FOLDER=$PWD/example_dags
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW_TORCHX_STATE_DIR=${AIRFLOW_TORCHX_STATE_DIR:-$PWD/.demo/torchx}
mkdir -p "$AIRFLOW_HOME"
.venv/bin/airflow db migrate >/dev/null
.venv/bin/airflow dags test torchx_local_echo
