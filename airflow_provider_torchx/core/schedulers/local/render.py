"""The local scheduler's dry run: an app as its replicas' processes (``ReplicaParam``: command,
environment, log files below the job's log directory) and its GPU plan, with what a dry run can
check (each role's program is an executable; GPUs asked for exist on this host)."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import warnings
from typing import Any

from airflow_provider_torchx.core.errorfile import ERROR_FILE_ENV, ERROR_FILE_NAME, RANK_LOGS_ENV, RANK_LOGS_NAME
from airflow_provider_torchx.core.errors import InvalidSpecError
from airflow_provider_torchx.core.schedulers.local import gpus
from airflow_provider_torchx.core.schedulers.local.images import ImageProvider
from airflow_provider_torchx.core.schedulers.local.request import ReplicaParam
from airflow_provider_torchx.core.specs import AppDef, Role, macros

#: The env var that holds rank 0's host (``${rank0_env}`` names it); locally, ``localhost``.
RANK0_ENV = "TORCHX_RANK0_HOST"


def make_app_id(app_name: str) -> str:
    """``<name>-<12 random hex digits>``; the name is reduced to ``[A-Za-z0-9_-]``."""
    safe = re.sub(r"[^A-Za-z0-9_-]+", "-", app_name).strip("-")[:40] or "app"
    return f"{safe}-{secrets.token_hex(6)}"


def replica_params(
    app: AppDef, app_id: str, log_dir: str, provider: ImageProvider, path_front: list[str]
) -> tuple[dict[str, list[ReplicaParam]], dict[str, list[str]]]:
    """``(role_params, role_log_dirs)``: each role's replicas as processes, with the app's macros
    applied, rank 0 on ``localhost``, ``path_front`` in front of their PATH, their logs, error
    file and torchrun's per-rank logs in ``<log_dir>/<role>/<k>``. ``InvalidSpecError`` when a
    role's program is not an executable."""
    role_params: dict[str, list[ReplicaParam]] = {}
    role_log_dirs: dict[str, list[str]] = {}
    for i, role in enumerate(app.roles):
        img_root = provider.fetch_role(role)
        params, dirs = [], []
        for k in range(role.num_replicas):
            values = macros.Values(img_root=img_root, app_id=app_id, replica_id=str(k), rank0_env=RANK0_ENV)
            replica_role = values.apply(role)
            replica_role.env[RANK0_ENV] = "localhost"
            replica_dir = os.path.join(log_dir, role.name, str(k))
            param = provider.get_replica_param(
                img_root,
                replica_role,
                stdout=os.path.join(replica_dir, "stdout.log"),
                stderr=os.path.join(replica_dir, "stderr.log"),
                combined=os.path.join(replica_dir, "combined.log"),
            )
            _put_in_front_of_path(param, path_front)
            param.env.setdefault(ERROR_FILE_ENV, os.path.join(replica_dir, ERROR_FILE_NAME))
            param.env.setdefault(RANK_LOGS_ENV, os.path.join(replica_dir, RANK_LOGS_NAME))
            params.append(param)
            dirs.append(replica_dir)
        _check_entrypoint(i, role, params[0])
        role_params[role.name] = params
        role_log_dirs[role.name] = dirs
    return role_params, role_log_dirs


def _put_in_front_of_path(param: ReplicaParam, front: list[str]) -> None:
    """Put the directories ``front`` in front of the replica's PATH (the role's, else ours)."""
    if front:
        base = param.env.get("PATH", os.environ.get("PATH", ""))
        param.env["PATH"] = os.pathsep.join([*front, base] if base else front)


def _check_entrypoint(index: int, role: Role, param: ReplicaParam) -> None:
    """Raise ``InvalidSpecError`` unless the role's program exists and is executable."""
    program = param.args[0]
    if os.sep in program:
        path = os.path.join(param.cwd or os.getcwd(), program)
        found = os.path.isfile(path) and os.access(path, os.X_OK)
        where = f"{path!r} is not an executable file"
    else:
        search = param.env.get("PATH", os.environ.get("PATH", ""))
        found = shutil.which(program, path=search) is not None
        where = f"{program!r} is not an executable on PATH ({search})"
    if not found:
        raise InvalidSpecError(
            f"roles[{index}].entrypoint: role {role.name!r}: {where}; give an executable on PATH or a path to one"
        )


def assign_gpus(role_params: dict[str, list[ReplicaParam]], app: AppDef, devices: list[int]) -> dict[str, Any] | None:
    """Give each replica of each GPU role its own consecutive ``devices`` in
    ``CUDA_VISIBLE_DEVICES`` (overwriting the role's), in role order, as on an idle host; or,
    when there are fewer devices than requested in total, set it nowhere and warn with both
    counts. Returns the job's GPU plan (``gpus.plan``; None: no GPU or too many)."""
    plan = gpus.plan(
        {r.name: max(r.resource.gpu, 0) for r in app.roles}, {r.name: r.num_replicas for r in app.roles}, devices
    )
    if plan is None:
        return None
    if plan["need"] > len(devices):
        warnings.warn(
            f"auto_set_cuda_visible_devices: app {app.name!r} requests {gpus.gpus_text(plan['need'])} but this "
            f"host has {len(devices)}; CUDA_VISIBLE_DEVICES is not set",
            UserWarning,
            stacklevel=4,
        )
        return None
    params = [p for r in app.roles if r.name in plan["roles"] for p in role_params[r.name]]
    counts = [plan["roles"][r.name] for r in app.roles if r.name in plan["roles"] for _ in role_params[r.name]]
    for param, chunk in zip(params, gpus.split(counts, devices), strict=True):
        param.env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, chunk))
    return plan


def no_gpus_error(app: AppDef) -> InvalidSpecError:
    """The error of a job asking for GPUs on a host without any (refused at the dry run, unless
    the run option ``allow_no_gpus``): its replicas would run on the CPU, or fail, far from
    where the mistake was made."""
    asks = "; ".join(
        f"role {r.name!r} asks for {gpus.gpus_text(r.resource.gpu)} per replica ({r.num_replicas} replicas)"
        for r in app.roles
        if r.resource.gpu > 0
    )
    return InvalidSpecError(
        f"resource.gpu: {asks}, but this host has no GPU (none detected by nvidia-smi -L or "
        f"/proc/driver/nvidia/gpus; {gpus.GPUS_ENV} is unset or empty). Run it on a host with GPUs, "
        "ask for gpu=0, or set the run option allow_no_gpus=True to run it without GPUs"
    )


def warn_shared_gpus(app: AppDef) -> None:
    """Warn that the GPU roles of ``app`` (those not setting ``CUDA_VISIBLE_DEVICES``
    themselves) will see every GPU of the host, as without ``auto_set_cuda_visible_devices``."""
    roles = [r.name for r in app.roles if r.resource.gpu > 0 and "CUDA_VISIBLE_DEVICES" not in r.env]
    if roles:
        warnings.warn(
            f"auto_set_cuda_visible_devices is off: the replicas of {', '.join(map(repr, roles))} (asking for GPUs) "
            "see every GPU of the host, also those other jobs use; set the run option "
            "auto_set_cuda_visible_devices=True to give each replica its own",
            UserWarning,
            stacklevel=4,
        )
