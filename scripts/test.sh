#!/usr/bin/env bash
# Set up everything the tests need (virtualenv, PyTorch's, TorchX's and the browser's own venvs,
# Docker engine, local registry, PostgreSQL), lint and type-check, run the whole test suite on the
# pinned Airflow 3.3.2, then the tests whose behaviour differs between Airflow lines (marker
# `airflow_line`, but the PyTorch ones) again on Airflow 3.1.8 and on 3.2.2, each line in its
# own venv with its own constraints (scripts/test-airflow-line.sh), and the TorchX plugin's tests
# in TorchX's venv without Airflow (scripts/torchx-venv.sh), in two lanes at once. Every
# pass runs even when one before it failed; each writes its output and JUnit XML under
# .ci/state/, and the end prints each pass's time and the run's slowest tests
# (scripts/test_times.py). Services are stopped on exit. Arguments, if any, select what to run
# on 3.3.2 alone (`bash scripts/test.sh tests/core -x`). It runs under scripts/scoped.sh: every
# process it starts (the background venv builders, services, jobs) ends when it ends, passed,
# failed or killed.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${TORCHX_RUN_SCOPE:-}" ] || exec bash scripts/scoped.sh --cleanup 'bash scripts/services.sh stop' bash "$0" "$@"
bash scripts/setup.sh
# The older lines' venvs, TorchX's and PyTorch's (a large download) are made in the background
# while the browser's venv, the services and the checks are set up one after the other (apt
# takes one install at a time), and waited for before the tests start. Their dependencies go in
# at once; the package itself, editable, one venv after the other, last: each such install
# rewrites the source tree's egg-info, from which the tests read the entry points.
logs=$(mktemp -d)
(
    deps=()
    bash scripts/test-airflow-line.sh --deps-only 3.1 & deps+=($!)
    bash scripts/test-airflow-line.sh --deps-only 3.2 & deps+=($!)
    bash scripts/torchx-venv.sh --deps-only & deps+=($!)
    for pid in "${deps[@]}"; do wait "$pid"; done
    bash scripts/test-airflow-line.sh --prepare 3.1 &&
        bash scripts/test-airflow-line.sh --prepare 3.2 &&
        bash scripts/torchx-venv.sh
) >"$logs/older" 2>&1 &
older_pid=$!
bash scripts/torch-venv.sh >"$logs/torch" 2>&1 &
torch_pid=$!
trap 'kill "$older_pid" "$torch_pid" 2>/dev/null || true; rm -rf "$logs"; bash scripts/services.sh stop' EXIT
bash scripts/browser-venv.sh
bash scripts/services.sh start
# shellcheck disable=SC1091
source .ci/state/services.env
echo "test.sh: services up at $(date +%T)"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
echo "test.sh: checks done at $(date +%T)"
wait "$older_pid" || { cat "$logs/older"; echo "test.sh: making the Airflow 3.1/3.2 or TorchX venvs failed" >&2; exit 1; }
wait "$torch_pid" || { cat "$logs/torch"; echo "test.sh: making the PyTorch venv failed" >&2; exit 1; }
echo "test.sh: venvs ready at $(date +%T)"

state=.ci/state
rm -f "$state"/junit-*.xml "$state"/pass-*.log "$state/passes.txt"
run_() { # NAME COMMAND...: run one pass into its log; record its time and exit status; print it
    local name=$1 start rc=0
    shift
    start=$(date +%s)
    "$@" >"$state/pass-$name.log" 2>&1 || rc=$?
    echo "$name $(($(date +%s) - start)) $rc" >>"$state/passes.txt"
    # One pass's output at a time, whole, though the two lanes end passes at any moment.
    flock "$state/passes.txt" sh -c 'echo "===== pass $1 (exit $2)"; cat "$3"' - "$name" "$rc" "$state/pass-$name.log"
    return "$rc"
}
pass_() { # NAME PYTEST-COMMAND...: run_ with pytest's JUnit XML under the state dir
    local name=$1
    shift
    run_ "$name" "$@" -p no:cacheprovider --junitxml="$state/junit-$name.xml"
}
older=(-m "airflow_line and not torch")
if [ "$#" -gt 0 ]; then
    # A developer's selection: on the pinned line only.
    status=0
    pass_ 3.3 .venv/bin/python -m pytest "$@" || status=$?
else
    # Two lanes at once (the live tests mostly wait on their deployments and jobs, the others
    # mostly compute), of about equal length: the pinned line's own tests and its two FAB and
    # multi-team UI modules, then the 3.1 pass, the Slurm tests (long after the pinned line's
    # live ones, which use the same two-node cluster: one lane holds it at a time), the TorchX
    # plugin's tests (TorchX's venv, about 45 s) and the package check (the built sdist and
    # wheel installed into clean venvs: scripts/package-check.sh), beside the pinned line's
    # other live tests, then the 3.2 pass. Every pass runs, whatever failed before it.
    ui=(tests/e2e/test_ui_fab.py tests/e2e/test_ui_security.py)
    (
        rc=0
        pass_ 3.3-own .venv/bin/python -m pytest tests/core tests/airflow "${ui[@]}" -m "not slurm" || rc=$?
        pass_ 3.1 bash scripts/test-airflow-line.sh 3.1 tests "${older[@]}" || rc=$?
        pass_ slurm .venv/bin/python -m pytest tests/core tests/airflow -m slurm || rc=$?
        pass_ torchx-plugin .venv-torchx/bin/python -m pytest tests/torchx_plugin || rc=$?
        run_ package bash scripts/package-check.sh || rc=$?
        exit "$rc"
    ) &
    lane=$!
    status=0
    pass_ 3.3-live .venv/bin/python -m pytest tests/e2e "${ui[@]/#/--ignore=}" || status=$?
    pass_ 3.2 bash scripts/test-airflow-line.sh 3.2 tests "${older[@]}" || status=$?
    wait "$lane" || status=$?
fi
.venv/bin/python scripts/test_times.py "$state"
exit "$status"
