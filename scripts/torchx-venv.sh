#!/usr/bin/env bash
# TorchX (the pinned nightly build) in a virtualenv of its own (.venv-torchx, or
# $TORCHX_TEST_TORCHX_VENV) for the tests of the `aws_batch` TorchX scheduler plugin
# (tests/torchx_plugin/, docs/torchx-plugin.md). It holds no Airflow: this package goes in
# editable without its dependencies, plus only what the core needs at run time (boto3, docker)
# and the tests' tools (pytest, moto's server), so the tests show that the plugin works for a
# TorchX user without Airflow. Versions come from constraints.txt; TorchX's own dependencies
# that it does not list are pinned here. Idempotent (a stamp file names what was installed).
# --deps-only installs all but the package itself: it leaves the source tree alone (an editable
# install rewrites its egg-info), so test.sh runs it beside the other venvs' installs.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${TORCHX_TEST_TORCHX_VENV:-.venv-torchx}
pins=(torchx-nightly==2026.10.26 docstring-parser==0.18.0 filelock==4.3.1)
deps=(boto3 docker pytest pytest-timeout "moto[batch,logs,server]")
want="${pins[*]} ${deps[*]} $(sha256sum constraints.txt | cut -c1-16)"
stamp="$venv/.installed"
[ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && exit 0
python=${PYTHON:-python3}
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
deps_stamp="$venv/.deps-installed"
if [ "$(cat "$deps_stamp" 2>/dev/null)" != "$want" ]; then
    "${pip[@]}" -c constraints.txt "${pins[@]}" "${deps[@]}"
    echo "$want" >"$deps_stamp"
fi
[ "${1:-}" = "--deps-only" ] && exit 0
"${pip[@]}" --no-deps -e .
"$venv/bin/python" - <<'EOF'
import importlib.util

for name in ("airflow", "torch"):
    assert importlib.util.find_spec(name) is None, f"{name} is installed in the TorchX venv"
EOF
echo "$want" >"$stamp"
