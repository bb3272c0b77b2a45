#!/usr/bin/env bash
# The Airflow 3.1 pass of scripts/test-airflow-line.sh (kept under its old name): arguments go
# to pytest (default: the tests marked airflow_line).
exec bash "$(dirname "$0")/test-airflow-line.sh" 3.1 "$@"
