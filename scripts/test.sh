#!/usr/bin/env bash
# Set up everything the tests need (virtualenv, Docker engine, local registry, busybox image),
# lint and type-check, then run the whole test suite. Services started here are stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/services.sh start
trap 'bash scripts/services.sh stop' EXIT
# shellcheck disable=SC1091
source .ci/state/services.env
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/python -m pytest tests "$@"
