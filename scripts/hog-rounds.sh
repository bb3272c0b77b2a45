#!/usr/bin/env bash
# The real-DDP tests in rounds with a CPU hog beside them (a busy loop on every core): what
# "reliable under load" means for the tests that run real torchrun jobs. Stops at the first
# failing round; prints one line per round (exit status, seconds, load average, pytest's
# summary) and keeps each round's output in LOGDIR. Needs the venvs of `scripts/test.sh`.
#
#   scripts/hog-rounds.sh ROUNDS LOGDIR [PYTEST ARGS...]
#   (default tests: tests/core/local/test_ddp.py tests/airflow/test_ddp.py)
set -uo pipefail
cd "$(dirname "$0")/.."
rounds=${1:?usage: $0 ROUNDS LOGDIR [PYTEST ARGS...]}
logdir=${2:?usage: $0 ROUNDS LOGDIR [PYTEST ARGS...]}
shift 2
[ $# -gt 0 ] || set -- tests/core/local/test_ddp.py tests/airflow/test_ddp.py
mkdir -p "$logdir"
hogs=()
for _ in $(seq 1 "$(nproc)"); do
    (while :; do :; done) &
    hogs+=($!)
done
trap 'kill "${hogs[@]}" 2>/dev/null' EXIT
export TORCHX_TEST_TORCH_VENV=${TORCHX_TEST_TORCH_VENV:-$PWD/.venv-torch}
for r in $(seq 1 "$rounds"); do
    start=$(date +%s)
    .venv/bin/python -m pytest -q -p no:cacheprovider -m torch "$@" >"$logdir/round$r.log" 2>&1
    rc=$?
    echo "round $r rc=$rc $(($(date +%s) - start))s load=$(cut -d' ' -f1 /proc/loadavg) $(tail -1 "$logdir/round$r.log")"
    [ "$rc" -eq 0 ] || exit "$rc"
done
