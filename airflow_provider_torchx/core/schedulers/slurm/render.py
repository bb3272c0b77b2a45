"""The ``slurm`` scheduler's dry run: an app as one ``sbatch`` script (pure, offline).

Each role is a component of a heterogeneous job (one component: a plain job), one replica per
node (``--nodes``, ``--ntasks-per-node=1``), ``Resource.gpu`` GPUs per node
(``--gpus-per-node``), ``cpu`` CPUs (``--cpus-per-task``) and ``memMB`` (``--mem``). The batch
script starts one ``srun`` step per role and waits for them; every replica runs a small shell
wrapper that sets our environment and writes its stdout, stderr and both (``combined``) to its
own files under the job's directory, ``<job_dir>/<job id>/<role>/<k>/``, then its exit code,
end time and run (``exit``): that directory is the job's record once Slurm forgot it
(``record.py``).

A job Slurm requeues (preemption, a node failure, ``scontrol requeue``) runs its batch script
again, with ``SLURM_RESTART_COUNT`` one higher: each replica's ``TORCHX_ATTEMPT`` is the role's
plus that count, so a resumed replica knows it is a later attempt; its wrapper first appends its
previous run's start and end to ``runs`` and clears ``exit``, and the batch script clears
``ended``, so that the new run is not read as ended. Logs go on in the same files.

The environment every replica gets, as the other schedulers give it: ``TORCHX_ROLE_NAME``,
``TORCHX_ROLE_IDX``, ``TORCHX_REPLICA_ID``, ``TORCHX_RANK0_HOST`` (the address Slurm reaches
the first node of the first role at, from the job's node list), ``TORCHX_PORT_<NAME>`` for each
``port_map`` entry (a per-job port from the job id: two jobs whose ids are less than
``PORT_SPAN`` / the number of entries apart never share one), ``TORCHELASTIC_ERROR_FILE`` and
``PET_LOG_DIR`` in the replica's directory, and ``TORCHX_ATTEMPT`` (above).

The job does not inherit the submitting process's environment (an Airflow worker's or
triggerer's connections, keys and secrets): it is submitted with ``--export=NONE``, so the batch
script starts from what Slurm gives a job on the node (the ``SLURM_*`` variables and the user's
login environment, with a default ``PATH`` should it have none) and each replica gets exactly that
plus the role's env and ours, exported by its wrapper (``srun --export=ALL`` hands the batch
script's environment to the step, overriding the ``SLURM_EXPORT_ENV=NONE`` it inherits).

Images: an absolute directory is where the replica runs (as ``local_dir``); another image (a
container name) is ignored, as ``local_cwd`` does, since the replicas run on the nodes' own
software. Mounts: Slurm mounts nothing; a bind mount of a path onto itself is honoured as is
(the nodes see the path), anything else is refused.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_torchx.core.checkpoints import ATTEMPT_ENV
from airflow_provider_torchx.core.errorfile import ERROR_FILE_ENV, ERROR_FILE_NAME, RANK_LOGS_ENV, RANK_LOGS_NAME
from airflow_provider_torchx.core.errors import InvalidSpecError
from airflow_provider_torchx.core.schedulers.local.ports import port_env
from airflow_provider_torchx.core.schedulers.slurm.options import time_limit
from airflow_provider_torchx.core.specs import AppDef, BindMount, Role, macros

#: Env vars every replica gets.
ENV_ROLE_NAME = "TORCHX_ROLE_NAME"
ENV_ROLE_IDX = "TORCHX_ROLE_IDX"
ENV_REPLICA_ID = "TORCHX_REPLICA_ID"
RANK0_ENV = "TORCHX_RANK0_HOST"
#: The job's id (``${app_id}``) and directory, set by the batch script for its replicas.
ENV_APP_ID = "TORCHX_SLURM_JOB_ID"
ENV_JOB_DIR = "TORCHX_SLURM_JOB_DIR"
#: The job's run: Slurm's restart count (0 until it is requeued), as the batch script exports it.
ENV_RUN = "TORCHX_SLURM_RUN"
#: The ``PATH`` of a batch script whose node gave it none.
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
#: The first port handed out to a job's ``port_map`` entries, and how many follow.
PORT_BASE = 20000
PORT_SPAN = 20000
#: ``--comment`` holds this JSON object: our mark, the app's name, its labels, the user's comment.
COMMENT_MARK = "airflow-torchx"
#: Files of a replica's directory: where and since when it runs (``host``: ``<node> <epoch
#: seconds>``), its end (``exit``: ``<exit code> <epoch seconds> <run>``) and its logs.
EXIT_FILE = "exit"
#: A replica's earlier runs of a requeued job (``record.py``).
RUNS_FILE = "runs"
# Markers no user string contains, substituted for macros and turned into shell expansions.
_MARKS = {"\x00app_id\x00": ENV_APP_ID, "\x00replica_id\x00": ENV_REPLICA_ID}

#: The batch script's own output (``srun``'s and Slurm's words), beside the job's directory
#: under ``job_dir`` (Slurm opens it before the directory exists); ``%j`` is the job id.
BATCH_OUTPUT = "slurm-%j.out"


@dataclass
class SlurmRequest:
    """What ``sbatch`` is given: its options (``args``, before the script) and the script,
    plus what the job's record keeps of the app (``roles``: name, replicas, command)."""

    job_dir: str
    args: list[str]
    script: str
    name: str
    roles: list[dict[str, Any]] = field(default_factory=list)

    def __str__(self) -> str:
        return f"# sbatch {shlex.join(self.args)} <<'EOF'\n{self.script}EOF\n"


def comment(app_name: str, labels: Mapping[str, str], user_comment: str | None) -> str:
    """The job's ``--comment``: our mark, the app's name and labels and the user's comment."""
    doc: dict[str, Any] = {COMMENT_MARK: 1, "app": app_name, "labels": dict(labels)}
    if user_comment:
        doc["comment"] = user_comment
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)


def parse_comment(text: str) -> dict[str, Any] | None:
    """What ``comment`` wrote, or None for a job that is not ours."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or doc.get(COMMENT_MARK) != 1 or not isinstance(doc.get("labels"), dict):
        return None
    return doc


def _word(text: str) -> str:
    """``text`` as one shell word: quoted, with the macro markers as expansions of our vars."""
    parts = [text]
    for mark, var in _MARKS.items():
        parts = [piece for part in parts for piece in _split_keep(part, mark, var)]
    return "".join(p if p.startswith('"${') else shlex.quote(p) for p in parts if p) or "''"


def _split_keep(text: str, mark: str, var: str) -> list[str]:
    out: list[str] = []
    for i, piece in enumerate(text.split(mark)):
        if i:
            out.append(f'"${{{var}}}"')
        out.append(piece)
    return out


def gpus(roles: Iterable[Role | Mapping[str, Any]]) -> int:
    """The GPUs a job holds in all: each role's per node, times its nodes (``roles`` as the app
    has them or as its record keeps them)."""
    total = 0
    for role in roles:
        if isinstance(role, Role):
            total += max(0, role.resource.gpu) * role.num_replicas
        else:
            total += max(0, int((role.get("resource") or {}).get("gpu", 0))) * int(role.get("num_replicas", 0))
    return total


def _check_role(index: int, role: Role) -> None:
    """Refuse what Slurm cannot honour: mounts other than a path onto itself."""
    for j, mount in enumerate(role.mounts):
        if not (isinstance(mount, BindMount) and mount.src_path == mount.dst_path):
            raise InvalidSpecError(
                f"roles[{index}].mounts[{j}]: role {role.name!r}: {mount!r} cannot be honoured on Slurm, which "
                "mounts nothing; the nodes' own file systems are what a replica sees (a bind mount of a path onto "
                "itself is accepted)"
            )


def validate(app: AppDef) -> None:
    """What a dry run refuses before rendering (``InvalidSpecError`` naming the field)."""
    for i, role in enumerate(app.roles):
        _check_role(i, role)


def _replica_script(role: Role, idx: int) -> str:
    """The shell code one replica of ``role`` runs under ``srun`` (the batch script exported
    the job's ports and rank 0's host; ``srun --export=ALL`` hands them on)."""
    img = role.image if role.image.startswith("/") else ""
    values = macros.Values(img_root=img, app_id="\x00app_id\x00", replica_id="\x00replica_id\x00", rank0_env=RANK0_ENV)
    r = values.apply(role)
    env = {ENV_ROLE_NAME: role.name, ENV_ROLE_IDX: str(idx), **r.env}
    lines = [
        f"export {ENV_REPLICA_ID}=$SLURM_PROCID",
        f'R="${ENV_JOB_DIR}"/{shlex.quote(role.name)}/"${ENV_REPLICA_ID}"',
        'mkdir -p "$R"',
        "# a requeued job's run: keep the previous run's start and end, then clear its end",
        f'if [ -e "$R/host" ]; then echo "$(cat "$R/host") $(cat "$R/{EXIT_FILE}" 2>/dev/null)" >>"$R/{RUNS_FILE}"; fi',
        f'rm -f "$R/host" "$R/{EXIT_FILE}" "$R/rc"',
        'echo "${SLURMD_NODENAME:-$(hostname)} $(date +%s.%N)" >"$R/host"',
        f'export {ERROR_FILE_ENV}="$R/{ERROR_FILE_NAME}" {RANK_LOGS_ENV}="$R/{RANK_LOGS_NAME}"',
        *(f"export {k}={_word(v)}" for k, v in env.items()),
        f"export {ATTEMPT_ENV}=$(( ${{{ATTEMPT_ENV}:-0}} + {ENV_RUN} ))",
    ]
    if img:
        lines.append(f"cd {shlex.quote(img)} || exit 127")
    cmd = " ".join(_word(a) for a in [r.entrypoint, *r.args])
    lines += [
        f'{{ {{ {cmd}; echo $? >"$R/rc"; }} 2>&1 1>&3 3>&- | tee -a "$R/stderr.log" "$R/combined.log" >/dev/null; }} '
        '3>&1 | tee -a "$R/stdout.log" "$R/combined.log" >/dev/null',
        'rc=$(cat "$R/rc" 2>/dev/null || echo 255)',
        f'echo "$rc $(date +%s.%N) ${ENV_RUN}" >"$R/{EXIT_FILE}"',
        'exit "$rc"',
    ]
    return "\n".join(lines)


def _component(role: Role, cfg: Mapping[str, Any], limit: str | None) -> list[str]:
    """The ``#SBATCH`` options of one component (a role): nodes, resources, cfg's options and
    the job's time ``limit`` (``options.time_limit``)."""
    res = role.resource
    opts = [f"--nodes={role.num_replicas}", "--ntasks-per-node=1"]
    if res.cpu > 0:
        opts.append(f"--cpus-per-task={res.cpu}")
    if res.memMB > 0:
        opts.append(f"--mem={res.memMB}M")
    if res.gpu > 0:
        opts.append(f"--gpus-per-node={res.gpu}")
    values = {**cfg, "time": limit}
    for key in ("partition", "account", "qos", "time", "constraint"):
        if values.get(key):
            opts.append(f"--{key}={values[key]}")
    if cfg.get("exclusive"):
        opts.append("--exclusive")
    return [f"#SBATCH {o}" for o in opts]


def render(app: AppDef, cfg: Mapping[str, Any], labels: Mapping[str, str]) -> SlurmRequest:
    """The ``sbatch`` request of ``app`` (``validate``d) with the resolved ``cfg`` and the job's
    ``labels``."""
    job_dir = str(cfg["job_dir"]).rstrip("/") or "/"
    header = ["#!/bin/sh"]
    limit = time_limit(gpus(app.roles), cfg)
    for i, role in enumerate(app.roles):
        if i:
            header.append("#SBATCH hetjob")
        header += _component(role, cfg, limit[0] if limit else None)
    names = list(dict.fromkeys(name for role in app.roles for name in role.port_map))
    port_lines = [
        f"export {port_env(n)}=$(( {PORT_BASE} + (SLURM_JOB_ID * {len(names)} + {k}) % {PORT_SPAN} ))"
        for k, n in enumerate(names)
    ]
    body = [
        f'export PATH="${{PATH:-{DEFAULT_PATH}}}"',
        "set -u",
        f"export {ENV_APP_ID}=$SLURM_JOB_ID {ENV_RUN}=${{SLURM_RESTART_COUNT:-0}}",
        f'export {ENV_JOB_DIR}={shlex.quote(job_dir)}/"$SLURM_JOB_ID"',
        f'mkdir -p "${ENV_JOB_DIR}"',
        f'rm -f "${ENV_JOB_DIR}/ended"',
        "# rank 0's host: the address Slurm reaches the first node of the first role at",
        'first=$(scontrol show hostnames "${SLURM_JOB_NODELIST_HET_GROUP_0:-$SLURM_JOB_NODELIST}" | head -n 1)',
        f"export {RANK0_ENV}=$(scontrol show node \"$first\" -o | sed -n 's/.* NodeAddr=\\([^ ]*\\).*/\\1/p')",
        *port_lines,
        f'[ -e "${ENV_JOB_DIR}/started" ] || date +%s >"${ENV_JOB_DIR}/started"',
        "pids=",
    ]
    for i, role in enumerate(app.roles):
        group = f" --het-group={i}" if len(app.roles) > 1 else ""
        step = _replica_script(role, i)
        body += [
            f"srun{group} --nodes={role.num_replicas} --ntasks-per-node=1 --kill-on-bad-exit=1 --export=ALL "
            f"sh -c {shlex.quote(step)} &",
            'pids="$pids $!"',
        ]
    body += [
        "rc=0",
        'for pid in $pids; do wait "$pid" || rc=$?; done',
        f'echo "$(date +%s) ${ENV_RUN}" >"${ENV_JOB_DIR}/ended"',
        'exit "$rc"',
    ]
    args = [
        "--export=NONE",
        f"--job-name={app.name}",
        f"--comment={comment(app.name, labels, cfg.get('comment'))}",
        f"--chdir={job_dir}",
        f"--output={job_dir}/{BATCH_OUTPUT}",
    ]
    if cfg.get("mail-user"):
        args.append(f"--mail-user={cfg['mail-user']}")
    if cfg.get("mail-type"):
        args.append(f"--mail-type={cfg['mail-type']}")
    roles = [
        {
            "name": r.name,
            "num_replicas": r.num_replicas,
            "entrypoint": r.entrypoint,
            "args": list(r.args),
            "env": dict(r.env),
            "resource": {"cpu": r.resource.cpu, "gpu": r.resource.gpu, "memMB": r.resource.memMB},
        }
        for r in app.roles
    ]
    script = "\n".join([*header, *body]) + "\n"
    return SlurmRequest(job_dir=job_dir, args=args, script=script, name=app.name, roles=roles)
