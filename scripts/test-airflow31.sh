#!/usr/bin/env bash
# Run the Airflow tests (tests/airflow) on Airflow 3.1, the oldest supported line, in their own
# virtualenv .venv-airflow31 pinned by constraints-airflow-3.1.txt. Idempotent: the venv is made
# once and reinstalled only when the constraints or pyproject.toml change. Arguments go to
# pytest (default: tests/airflow). The Docker-marked tests need the services
# (`bash scripts/services.sh start`; test.sh starts them).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
venv=.venv-airflow31
constraints=constraints-airflow-3.1.txt
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
stamp="$venv/.installed"
want=$(cat "$constraints" pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -c "$constraints" -e ".[test]"
    echo "$want" >"$stamp"
fi
"$venv/bin/python" -c 'import importlib.metadata as m, sys; sys.exit(not m.version("apache-airflow").startswith("3.1."))' ||
    { echo "test-airflow31: $venv does not hold Airflow 3.1" >&2; exit 1; }
[ "$#" -gt 0 ] || set -- tests/airflow
exec "$venv/bin/python" -m pytest "$@"
