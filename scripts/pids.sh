# Sourced by the scripts that start services (scripts/slurm.sh): a daemon is known by its pid
# file, and stopped by that pid only. The caller defines `log`.

# Whether the process of pid file $1 runs.
alive() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

# Stop the process of pid file $1 (named $2 in the log): SIGTERM, SIGKILL after 10 s.
stop_pid() {
    local pidfile="$1" name="$2"
    if alive "$pidfile"; then
        local pid
        pid="$(cat "$pidfile")"
        log "stopping $name (pid $pid)"
        kill "$pid"
        for _ in $(seq 1 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    fi
    rm -f "$pidfile"
}
