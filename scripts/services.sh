#!/usr/bin/env bash
# Start/stop the services the tests need: a Docker engine with its data and socket under the
# state dir, a tiny local busybox image and a local image registry (the Docker and AWS Batch
# tests), a PostgreSQL server on loopback whose databases the live Airflow deployments of
# tests/e2e/ run on (tests/e2e/deployment.py: one migrated template per Airflow line, a copy
# per deployment), and a Slurm cluster on this host (scripts/slurm.sh: the slurm scheduler's
# tests).
#
#   scripts/services.sh start   # idempotent; writes $STATE/services.env
#   scripts/services.sh stop    # stops what `start` started, by pid
#   scripts/services.sh env     # prints the env file (source it: `. <(scripts/services.sh env)`)
#
# STATE defaults to <repo>/.ci/state (gitignored); override with TORCHX_SERVICES_DIR. What a
# service's own user must reach (PostgreSQL's data, run as `postgres`) lives in a run folder of
# this state dir's own under /var/tmp, mode 0755, whose path STATE/rundir keeps: the checkout may
# sit in a folder only root can enter (a clone under /root, a `mktemp -d` folder).
# The moto server itself is started per test session by tests/fixtures/aws.py.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE="${TORCHX_SERVICES_DIR:-$REPO/.ci/state}"
D="$STATE/docker"
ENV_FILE="$STATE/services.env"
SOCK="$D/docker.sock"
REGISTRY_DIR="$STATE/registry"
export DOCKER_HOST="unix://$SOCK"

log() { echo "services: $*" >&2; }

# The run folder (see above): made once per state dir, reused while its path is recorded.
run_dir() {
    local dir
    dir=$(cat "$STATE/rundir" 2>/dev/null || true)
    if [[ -z "$dir" || ! -d "$dir" ]]; then
        mkdir -p "$STATE"
        dir=$(mktemp -d /var/tmp/airflow-provider-torchx.XXXXXXXX)
        chmod 0755 "$dir"
        echo "$dir" >"$STATE/rundir"
    fi
    echo "$dir"
}

# shellcheck source=scripts/pids.sh
source "$REPO/scripts/pids.sh"

install_packages() {
    local missing=()
    command -v dockerd >/dev/null || missing+=(docker.io)
    [[ -x /bin/busybox ]] || missing+=(busybox-static)
    command -v docker-registry >/dev/null || missing+=(docker-registry)
    pg_bin >/dev/null || missing+=(postgresql)
    command -v slurmctld >/dev/null || missing+=(slurmctld slurmd slurm-client munge)
    # the Slurm tests' second run, with accounting (test.sh restarts the cluster with it)
    command -v slurmdbd >/dev/null || [[ -x /usr/sbin/slurmdbd ]] || missing+=(slurmdbd)
    command -v mariadbd >/dev/null || [[ -x /usr/sbin/mariadbd ]] || missing+=(mariadb-server)
    if ((${#missing[@]})); then
        [[ $(id -u) -eq 0 ]] || { log "missing ${missing[*]}; install them as root"; exit 1; }
        log "installing ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

pg_bin() {
    local dir
    dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
    [[ -n "$dir" && -x "$dir/pg_ctl" ]] && echo "$dir"
}

# Run a PostgreSQL program as the cluster's owner: `postgres` when we are root (the server
# refuses to run as root), else ourselves; from `/`, which that user can enter.
as_pg_owner() {
    if [[ $(id -u) -eq 0 ]]; then
        (cd / && runuser -u postgres -- "$@")
    else
        "$@"
    fi
}

start_postgres() {
    local bin port
    bin=$(pg_bin)
    PG="$(run_dir)/postgres"
    if [[ -f "$PG/port" ]] && as_pg_owner "$bin/pg_isready" -q -h 127.0.0.1 -p "$(cat "$PG/port")"; then
        return
    fi
    mkdir -p "$PG"
    [[ $(id -u) -ne 0 ]] || chown postgres "$PG"
    if [[ ! -f "$PG/data/PG_VERSION" ]]; then
        log "creating a PostgreSQL cluster in $PG/data"
        as_pg_owner "$bin/initdb" -D "$PG/data" -A trust -U airflow >"$PG/initdb.log" 2>&1 ||
            { cat "$PG/initdb.log" >&2; exit 1; }
    fi
    port="$(free_port)"
    log "starting PostgreSQL on 127.0.0.1:$port"
    # Durability is not the point of a test database: fsync and synchronous commits off.
    as_pg_owner "$bin/pg_ctl" -D "$PG/data" -l "$PG/postgres.log" -w -t 60 start \
        -o "-p $port -k $PG -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=300" \
        >/dev/null || { log "PostgreSQL did not start; last log lines:"; tail -n 20 "$PG/postgres.log" >&2; exit 1; }
    echo "$port" >"$PG/port"
}

stop_postgres() {
    local bin
    bin=$(pg_bin) || return 0
    [[ -f "$STATE/rundir" ]] || return 0
    PG="$(cat "$STATE/rundir")/postgres"
    if [[ -f "$PG/data/postmaster.pid" ]]; then
        log "stopping PostgreSQL"
        as_pg_owner "$bin/pg_ctl" -D "$PG/data" -m fast -w stop >/dev/null 2>&1 || true
    fi
    rm -f "$PG/port"
}

start_dockerd() {
    if alive "$D/dockerd.pid" && docker version >/dev/null 2>&1; then
        return
    fi
    [[ $(id -u) -eq 0 ]] || { log "dockerd needs root"; exit 1; }
    mkdir -p "$D/data" "$D/exec"
    rm -f "$SOCK"
    log "starting dockerd (socket $SOCK)"
    setsid dockerd --iptables=false --ip6tables=false --bridge=none --storage-driver=vfs \
        --data-root "$D/data" --exec-root "$D/exec" --pidfile "$D/dockerd.pid.internal" \
        --host "unix://$SOCK" >"$D/dockerd.log" 2>&1 </dev/null &
    echo $! >"$D/dockerd.pid"
    for _ in $(seq 1 150); do
        docker version >/dev/null 2>&1 && return
        alive "$D/dockerd.pid" || break
        sleep 0.2
    done
    log "dockerd did not become ready; last log lines:"
    tail -n 20 "$D/dockerd.log" >&2
    exit 1
}

import_busybox() {
    docker image inspect busybox:local >/dev/null 2>&1 && return
    log "importing busybox:local from /bin/busybox"
    local root="$D/rootfs"
    rm -rf "$root"
    mkdir -p "$root/bin" "$root/tmp"
    cp /bin/busybox "$root/bin/"
    for c in sh echo sleep cat env ls printf true false test expr seq; do ln -sf busybox "$root/bin/$c"; done
    tar -C "$root" -c . | docker import - busybox:local >/dev/null
    rm -rf "$root"
}

start_registry() {
    if alive "$STATE/registry.pid" && [[ -f "$STATE/registry.port" ]]; then
        return
    fi
    local port
    port="$(free_port)"
    mkdir -p "$REGISTRY_DIR/data"
    cat >"$REGISTRY_DIR/config.yml" <<EOF
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $REGISTRY_DIR/data
  delete:
    enabled: true
http:
  addr: 127.0.0.1:$port
EOF
    log "starting docker-registry on 127.0.0.1:$port"
    setsid docker-registry serve "$REGISTRY_DIR/config.yml" >"$REGISTRY_DIR/registry.log" 2>&1 </dev/null &
    echo $! >"$STATE/registry.pid"
    echo "$port" >"$STATE/registry.port"
    for _ in $(seq 1 100); do
        python3 - "$port" <<'EOF' && return
import sys, urllib.request
urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/v2/", timeout=1)
EOF
        sleep 0.1
    done
    log "docker-registry did not become ready"
    tail -n 20 "$REGISTRY_DIR/registry.log" >&2
    exit 1
}

write_env() {
    cat >"$ENV_FILE" <<EOF
export DOCKER_HOST=unix://$SOCK
export TORCHX_TEST_REGISTRY=127.0.0.1:$(cat "$STATE/registry.port")
export TORCHX_TEST_POSTGRES=postgresql+psycopg2://airflow@127.0.0.1:$(cat "$(run_dir)/postgres/port")
EOF
    bash "$REPO/scripts/slurm.sh" env >>"$ENV_FILE"
}

stop_containers() {
    alive "$D/dockerd.pid" || return 0
    local ids
    ids="$(docker ps -aq 2>/dev/null || true)"
    [[ -z "$ids" ]] || docker rm -f $ids >/dev/null 2>&1 || true
}

case "${1:-}" in
start)
    mkdir -p "$STATE"
    install_packages
    start_dockerd
    import_busybox
    start_registry
    start_postgres
    bash "$REPO/scripts/slurm.sh" start >/dev/null
    write_env
    cat "$ENV_FILE"
    ;;
stop)
    stop_containers
    stop_pid "$STATE/registry.pid" docker-registry
    rm -f "$STATE/registry.port" "$ENV_FILE"
    stop_pid "$D/dockerd.pid" dockerd
    stop_postgres
    bash "$REPO/scripts/slurm.sh" stop
    ;;
env)
    [[ -f "$ENV_FILE" ]] || { log "not started; run: $0 start"; exit 1; }
    cat "$ENV_FILE"
    ;;
*)
    echo "usage: $0 start|stop|env" >&2
    exit 2
    ;;
esac
