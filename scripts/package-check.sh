#!/usr/bin/env bash
# The distributions as a user gets them. Builds the sdist and the wheel (`python -m build`: the
# wheel from the sdist, so a file missing from the sdist fails here) from a copy of the files git
# knows (the source tree is left alone), checks both with `twine check --strict`, then installs
# the wheel twice, side by side:
#   - into a clean venv with Airflow: the wheel with its declared dependencies, pinned by
#     constraints.txt; scripts/package_smoke.py airflow (the provider, its entry points, its UI
#     plugin, a local job through the `airflow-torchx` CLI);
#   - into one with TorchX and no Airflow: scripts/torchx-venv.sh's pins (--deps-only), the wheel
#     without dependencies, as docs/torchx-plugin.md tells TorchX users; scripts/package_smoke.py
#     torchx (TorchX's registry, `torchx runopts`, a `torchx run --dryrun`).
# The smoke tests run from a scratch directory, so they import the installed package, not the
# source tree. Build and twine come from .venv (the test extra; scripts/setup.sh). Everything
# goes to a temporary directory, removed at the end; DIST_DIR=DIR keeps the built files in DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
tools=$repo/.venv/bin/python
python=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
dist=${DIST_DIR:-$work/dist}
mkdir -p "$work/src" "$work/scratch" "$dist"
pip_quiet=(--quiet --disable-pip-version-check)
step() { echo "package-check: $* (${SECONDS}s)"; }

git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$work/src"
"$tools" -m build --outdir "$dist" "$work/src" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
if grep -n "WARNING\|SetuptoolsDeprecationWarning" "$work/build.log"; then
    echo "package-check: the build warns (above)" >&2
    exit 1
fi
sdist=$(ls "$dist"/*.tar.gz)
wheel=$(ls "$dist"/*.whl)
"$tools" -m twine check --strict "$sdist" "$wheel"
step "built and checked $(basename "$sdist") $(basename "$wheel")"

airflow_venv() {
    "$python" -m venv "$work/airflow"
    "$work/airflow/bin/python" -m pip install "${pip_quiet[@]}" -c constraints.txt "$wheel"
}
torchx_venv() {
    TORCHX_TEST_TORCHX_VENV=$work/torchx bash scripts/torchx-venv.sh --deps-only
    "$work/torchx/bin/python" -m pip install "${pip_quiet[@]}" --no-deps "$wheel"
}
airflow_venv >"$work/airflow.log" 2>&1 &
airflow_pid=$!
torchx_venv >"$work/torchx.log" 2>&1 &
torchx_pid=$!
wait "$airflow_pid" || { cat "$work/airflow.log"; exit 1; }
wait "$torchx_pid" || { cat "$work/torchx.log"; exit 1; }
step "installed the wheel into a venv with Airflow and one with TorchX"

cd "$work/scratch"
AIRFLOW_HOME=$work/airflow-home AIRFLOW__CORE__LOAD_EXAMPLES=False AIRFLOW_TORCHX_STATE_DIR=$work/state \
    "$work/airflow/bin/python" "$repo/scripts/package_smoke.py" airflow
AIRFLOW_TORCHX_STATE_DIR=$work/state "$work/torchx/bin/python" "$repo/scripts/package_smoke.py" torchx
step "passed"
