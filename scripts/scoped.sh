#!/usr/bin/env bash
# Run COMMAND so that whatever it starts ends with it: finished, failed or killed.
#
#   scripts/scoped.sh [--cleanup SHELL-COMMAND] COMMAND [ARGS...]
#
# COMMAND runs in the background with a mark of its own in its environment
# (TORCHX_RUN_SCOPE), which every process it starts inherits, in the background or not,
# reparented to init or in a session of its own (a venv builder's pip, a local job's
# supervisor, a service). When COMMAND ends, or this script gets SIGTERM, SIGINT or SIGHUP,
# every process still carrying the mark or descending from COMMAND gets SIGTERM, then SIGKILL
# after up to TORCHX_SCOPE_GRACE seconds (default 20); then the clean-up command runs (the test
# command's: stop the services), outside the scope. The exit status is COMMAND's (143, 130 or
# 129 when this script was signalled). Started inside a scope, COMMAND runs in the caller's:
# scopes do not nest.
set -uo pipefail
cleanup=""
if [ "${1:-}" = --cleanup ]; then
    cleanup=${2:?usage: $0 [--cleanup SHELL-COMMAND] COMMAND [ARGS...]}
    shift 2
fi
[ $# -gt 0 ] || { echo "usage: $0 [--cleanup SHELL-COMMAND] COMMAND [ARGS...]" >&2; exit 2; }
if [ -n "${TORCHX_RUN_SCOPE:-}" ]; then
    exec "$@"
fi
grace=${TORCHX_SCOPE_GRACE:-20}
export TORCHX_RUN_SCOPE="scope-$$-$(date +%s%N)"

# The pids, but ours, of every process carrying the mark or descending from pid $1.
members() {
    python3 - "$TORCHX_RUN_SCOPE" "$$" "$1" <<'EOF'
import os, sys

mark = f"TORCHX_RUN_SCOPE={sys.argv[1]}".encode()
me, root = int(sys.argv[2]), int(sys.argv[3])
parents: dict[int, int] = {}
marked: set[int] = set()
for name in os.listdir("/proc"):
    if not name.isdigit():
        continue
    pid = int(name)
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state, ppid = f.read().rsplit(b")", 1)[1].split()[:2]
        if state == b"Z":  # a zombie is gone already; its parent reaps it
            continue
        parents[pid] = int(ppid)
        with open(f"/proc/{pid}/environ", "rb") as f:
            if mark in f.read().split(b"\0"):
                marked.add(pid)
    except OSError:
        continue
found = set(marked)
grew = True
while grew:
    children = {p for p, pp in parents.items() if pp in found | {root} and p not in found}
    found |= children
    grew = bool(children)
found.add(root)
print(" ".join(str(p) for p in sorted(found - {me, os.getpid(), os.getppid()}) if p in parents))
EOF
}

child=0
finish() {
    local status=$1 pids
    trap '' TERM INT HUP
    pids=$(members "$child")
    if [ -n "$pids" ]; then
        # shellcheck disable=SC2086 # one word per pid
        kill -TERM $pids 2>/dev/null
        for _ in $(seq 1 $((grace * 5))); do
            pids=$(members "$child")
            [ -n "$pids" ] || break
            sleep 0.2
        done
        # shellcheck disable=SC2086
        [ -z "$pids" ] || kill -KILL $pids 2>/dev/null
    fi
    [ -z "$cleanup" ] || env -u TORCHX_RUN_SCOPE bash -c "$cleanup"
    exit "$status"
}
trap 'finish 143' TERM
trap 'finish 130' INT
trap 'finish 129' HUP
"$@" &
child=$!
wait "$child"
status=$?
# `wait` returns early when a trapped signal arrives; its trap then exits with its own status.
finish "$status"
