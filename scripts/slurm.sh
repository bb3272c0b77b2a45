#!/usr/bin/env bash
# Start/stop a real Slurm cluster on this host for the `slurm` scheduler's tests: munged, a
# controller (slurmctld) and two compute nodes (slurmd -N n1, slurmd -N n2, each on its own
# port, 2 CPUs, 2000 MB and two stand-in GPUs counted through gres.conf), one partition
# `debug` (MaxTime 60 minutes), and accounting where asked for: with TORCHX_SLURM_ACCOUNTING=1,
# a MariaDB server of its own (datadir and socket under STATE, a 127.0.0.1 port) and slurmdbd on
# it, as production clusters run (sacct then knows ended jobs); else none.
#
#   scripts/slurm.sh start   # idempotent; writes $STATE/slurm.env (SLURM_CONF=...)
#   scripts/slurm.sh stop    # stops what `start` started, by pid
#   scripts/slurm.sh env     # prints the env file (source it: `. <(scripts/slurm.sh env)`)
#
# STATE (munge socket, slurm.conf, spool, logs) lives under /var/tmp, in a directory named after
# the repository's path (mode 0755), never inside the repository: munged runs as the `munge`
# user and refuses a socket directory others cannot search, so a clone in a private folder
# (/root/...) must not hold it. Override with TORCHX_SLURM_DIR.
#
# MinJobAge is short (TORCHX_SLURM_MIN_JOB_AGE, default 2 s): slurmctld forgets an ended job
# at its next purge (every 60 s), which the tests of describing a forgotten job rely on.
# Root only (slurmd runs jobs as their user; the packages are Debian's slurmctld, slurmd,
# slurm-client and munge).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE="${TORCHX_SLURM_DIR:-/var/tmp/airflow-torchx-slurm-$(printf '%s' "$REPO" | sha256sum | cut -c1-12)}"
ENV_FILE="$STATE/slurm.env"
CONF="$STATE/slurm.conf"
MUNGE="$STATE/munge"
NODES=(n1 n2)
MIN_JOB_AGE="${TORCHX_SLURM_MIN_JOB_AGE:-2}"
ACCOUNTING="${TORCHX_SLURM_ACCOUNTING:-0}"
DB="$STATE/mysql"

log() { echo "slurm: $*" >&2; }

# shellcheck source=scripts/pids.sh
source "$REPO/scripts/pids.sh"

check_tools() {
    local missing=()
    for cmd in munged slurmctld slurmd sbatch squeue scontrol scancel sinfo; do
        command -v "$cmd" >/dev/null || [[ -x "/usr/sbin/$cmd" ]] || missing+=("$cmd")
    done
    if ((${#missing[@]})); then
        log "missing ${missing[*]}: apt-get install slurmctld slurmd slurm-client munge"
        exit 1
    fi
    if [[ $ACCOUNTING == 1 ]]; then
        for cmd in slurmdbd sacct sacctmgr mariadbd mariadb-install-db mariadb; do
            command -v "$cmd" >/dev/null || [[ -x "/usr/sbin/$cmd" ]] || missing+=("$cmd")
        done
        if ((${#missing[@]})); then
            log "missing ${missing[*]}: apt-get install slurmdbd mariadb-server"
            exit 1
        fi
    fi
    [[ $(id -u) -eq 0 ]] || { log "the test cluster runs as root"; exit 1; }
}

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Two consecutive free ports (the nodes' SlurmdPort range), then one more (the controller's).
free_ports() {
    python3 - <<'EOF'
import socket
def free(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
while True:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        p = s.getsockname()[1]
    if p < 65000 and free(p + 1) and free(p + 2):
        print(p, p + 2)
        break
EOF
}

# slurm.conf's accounting lines: slurmdbd's (its port in $STATE/dbd.port), or none.
accounting_conf() {
    if [[ $ACCOUNTING == 1 ]]; then
        printf '%s\n' AccountingStorageType=accounting_storage/slurmdbd AccountingStorageHost=localhost \
            "AccountingStoragePort=$(cat "$STATE/dbd.port")" "AccountingStoragePass=$MUNGE/munge.sock" \
            AccountingStoreFlags=job_comment JobAcctGatherType=jobacct_gather/linux
    else
        printf '%s\n' AccountingStorageType=accounting_storage/none JobAcctGatherType=jobacct_gather/none
    fi
}

# MariaDB (run as `mysql`, its files in $DB) and slurmdbd on it, the cluster registered.
start_accounting() {
    [[ $ACCOUNTING == 1 ]] || return 0
    if ! alive "$DB/mariadbd.pid"; then
        mkdir -p "$DB"
        chown mysql: "$DB"
        if [[ ! -d "$DB/data/mysql" ]]; then
            mariadb-install-db --no-defaults --user=mysql --datadir="$DB/data" --skip-test-db \
                --auth-root-authentication-method=normal >"$STATE/log/mariadb-install.log" 2>&1 ||
                { log "mariadb-install-db failed"; tail -n 20 "$STATE/log/mariadb-install.log" >&2; exit 1; }
        fi
        free_port >"$STATE/db.port"
        log "starting mariadbd"
        setsid /usr/sbin/mariadbd --no-defaults --user=mysql --datadir="$DB/data" --socket="$DB/mysqld.sock" \
            --port="$(cat "$STATE/db.port")" --bind-address=127.0.0.1 --skip-name-resolve \
            --pid-file="$DB/mariadbd.pid" --log-error="$DB/mariadb.log" --innodb-buffer-pool-size=16M \
            </dev/null >/dev/null 2>&1 &
        for _ in $(seq 1 150); do
            [[ -S "$DB/mysqld.sock" ]] && alive "$DB/mariadbd.pid" && break
            sleep 0.1
        done
        alive "$DB/mariadbd.pid" || { log "mariadbd did not start"; tail -n 20 "$DB/mariadb.log" >&2; exit 1; }
        mariadb --no-defaults -S "$DB/mysqld.sock" -uroot -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
            CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
            GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
    fi
    if ! alive "$STATE/slurmdbd.pid"; then
        printf '%s\n' AuthType=auth/munge "AuthInfo=socket=$MUNGE/munge.sock" DbdHost=localhost \
            "DbdPort=$(cat "$STATE/dbd.port")" SlurmUser=root "PidFile=$STATE/slurmdbd.pid" \
            "LogFile=$STATE/log/slurmdbd.log" StorageType=accounting_storage/mysql StorageHost=127.0.0.1 \
            "StoragePort=$(cat "$STATE/db.port")" StorageUser=slurm StoragePass=slurm StorageLoc=slurm_acct_db \
            >"$STATE/slurmdbd.conf"
        chmod 0600 "$STATE/slurmdbd.conf"
        log "starting slurmdbd"
        SLURM_CONF="$CONF" /usr/sbin/slurmdbd
    fi
    for _ in $(seq 1 100); do
        SLURM_CONF="$CONF" timeout 5 sacctmgr -n list cluster format=cluster%30 2>/dev/null | grep -qw torchx && return
        SLURM_CONF="$CONF" timeout 5 sacctmgr -i add cluster torchx >/dev/null 2>&1 || sleep 0.2
    done
    log "slurmdbd does not answer"
    tail -n 20 "$STATE/log/slurmdbd.log" >&2
    exit 1
}

write_conf() {
    local node_port ctl_port
    read -r node_port ctl_port < <(free_ports)
    mkdir -p "$STATE/state" "$STATE/log"
    if [[ $ACCOUNTING == 1 ]]; then free_port >"$STATE/dbd.port"; fi
    for n in "${NODES[@]}"; do mkdir -p "$STATE/spool/$n"; done
    : >"$STATE/gpu0"
    : >"$STATE/gpu1"
    cat >"$CONF" <<EOF
ClusterName=torchx
SlurmctldHost=localhost
SlurmctldPort=$ctl_port
SlurmdPort=$node_port
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket=$MUNGE/munge.sock
CredType=cred/munge
StateSaveLocation=$STATE/state
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd-%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
$(accounting_conf)
ReturnToService=2
MinJobAge=$MIN_JOB_AGE
KillWait=2
InactiveLimit=0
SlurmctldTimeout=10
SlurmdTimeout=30
NodeName=n[1-2] NodeHostname=localhost Port=[$node_port-$((node_port + 1))] CPUs=2 RealMemory=2000 Gres=gpu:2 State=UNKNOWN
PartitionName=debug Nodes=n[1-2] Default=YES MaxTime=60 State=UP
EOF
    cat >"$STATE/gres.conf" <<EOF
AutoDetect=off
NodeName=n[1-2] Name=gpu File=$STATE/gpu[0-1]
EOF
}

start_munge() {
    alive "$MUNGE/munged.pid" && return
    mkdir -p "$MUNGE"
    chown munge: "$MUNGE"
    chmod 0755 "$MUNGE"
    su -s /bin/sh munge -c "/usr/sbin/munged --socket=$MUNGE/munge.sock --pid-file=$MUNGE/munged.pid \
        --log-file=$MUNGE/munged.log --seed-file=$MUNGE/munged.seed" ||
        { log "munged did not start"; tail -n 20 "$MUNGE/munged.log" >&2 || true; exit 1; }
}

start_daemons() {
    if ! alive "$STATE/slurmctld.pid"; then
        log "starting slurmctld"
        /usr/sbin/slurmctld -f "$CONF" -i
    fi
    for n in "${NODES[@]}"; do
        if ! alive "$STATE/slurmd-$n.pid"; then
            log "starting slurmd -N $n"
            /usr/sbin/slurmd -f "$CONF" -N "$n"
        fi
    done
}

wait_idle() {
    local state
    for _ in $(seq 1 100); do
        state="$(SLURM_CONF="$CONF" sinfo -h -N -o '%N %t' 2>/dev/null | sort -u || true)"
        if [[ "$(grep -c -E ' (idle|mix|alloc)$' <<<"$state")" -eq ${#NODES[@]} ]]; then
            return
        fi
        sleep 0.1
    done
    log "the nodes did not come up: $(tr '\n' ';' <<<"$state")"
    tail -n 20 "$STATE/log/slurmctld.log" >&2 || true
    exit 1
}

write_env() {
    cat >"$ENV_FILE" <<EOF
export SLURM_CONF=$CONF
export TORCHX_SLURM_DIR=$STATE
EOF
}

case "${1:-}" in
start)
    check_tools
    mkdir -p "$STATE"
    chmod 0755 "$STATE"
    if ! alive "$STATE/slurmctld.pid" || [[ ! -f "$CONF" ]]; then
        # a new slurm.conf (new ports): no slurmd of the old one may stay behind
        for n in "${NODES[@]}"; do stop_pid "$STATE/slurmd-$n.pid" "slurmd -N $n"; done
        write_conf
    fi
    start_munge
    start_accounting
    start_daemons
    wait_idle
    write_env
    cat "$ENV_FILE"
    ;;
stop)
    for n in "${NODES[@]}"; do stop_pid "$STATE/slurmd-$n.pid" "slurmd -N $n"; done
    stop_pid "$STATE/slurmctld.pid" slurmctld
    stop_pid "$STATE/slurmdbd.pid" slurmdbd
    stop_pid "$DB/mariadbd.pid" mariadbd
    stop_pid "$MUNGE/munged.pid" munged
    rm -f "$ENV_FILE"
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
