"""The local scheduler's native request (``PopenRequest``) and its JSON form in the job store."""

from __future__ import annotations

import copy
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from airflow_provider_torchx.core.specs import (
    NULL_RESOURCE,
    BindMount,
    DeviceMount,
    Mount,
    Resource,
    RetryPolicy,
    Role,
    VolumeMount,
)


@dataclass
class ReplicaParam:
    """What the supervisor passes to ``subprocess.Popen`` for one replica (``env`` is added
    to the supervisor's environment), and where the replica's logs go."""

    args: list[str]
    env: dict[str, str]
    stdout: str | None = None
    stderr: str | None = None
    combined: str | None = None
    cwd: str | None = None


@dataclass
class PopenRequest:
    """Everything needed to run every replica of every role of an app.

    Besides TorchX's fields: ``app_name``, the ``roles`` as submitted (for ``describe`` and the
    retry policies), the grace period between SIGTERM and SIGKILL, the run options
    ``attempt_timeout`` (seconds; None: no limit), ``start_timeout`` (seconds) and
    ``max_gpu_hours`` (the task's guards, which the supervisor holds: ``core/guards.py``; None:
    none) and, with ``auto_set_cuda_visible_devices``, the job's GPU plan (``gpus.plan``;
    empty: none).
    """

    app_id: str
    log_dir: str
    role_params: dict[str, list[ReplicaParam]]
    role_log_dirs: dict[str, list[str]]
    app_name: str = ""
    roles: list[Role] = field(default_factory=list)
    cancel_grace_period: float = 10.0
    gpus: dict[str, Any] = field(default_factory=dict)
    attempt_timeout: int | None = None
    start_timeout: float | None = None
    max_gpu_hours: float | None = None


_MOUNT_TYPES: dict[str, type] = {"bind": BindMount, "volume": VolumeMount, "device": DeviceMount}


def _json_safe(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def role_to_json(role: Role) -> dict[str, Any]:
    """A JSON-able dict of ``role`` (``overrides`` and ``pre_proc`` are not kept; metadata
    values that are not JSON become strings)."""
    mounts = []
    for m in role.mounts:
        kind = next(k for k, t in _MOUNT_TYPES.items() if isinstance(m, t))
        mounts.append({"type": kind, **asdict(m)})
    return {
        "name": role.name,
        "image": role.image,
        "entrypoint": role.entrypoint,
        "args": list(role.args),
        "env": dict(role.env),
        "num_replicas": role.num_replicas,
        "min_replicas": role.min_replicas,
        "max_retries": role.max_retries,
        "retry_policy": RetryPolicy(role.retry_policy).value,
        "resource": _json_safe(asdict(role.resource)),
        "port_map": dict(role.port_map),
        "metadata": _json_safe(role.metadata),
        "mounts": mounts,
        "workspace": role.workspace,
    }


def role_from_json(data: dict[str, Any]) -> Role:
    """The ``Role`` stored by ``role_to_json``."""
    mounts: list[Mount] = []
    for m in data.get("mounts", []):
        fields = dict(m)
        mounts.append(_MOUNT_TYPES[fields.pop("type")](**fields))
    return Role(
        name=data["name"],
        image=data.get("image", ""),
        entrypoint=data.get("entrypoint", ""),
        args=list(data.get("args", [])),
        env=dict(data.get("env", {})),
        num_replicas=int(data.get("num_replicas", 1)),
        min_replicas=data.get("min_replicas"),
        max_retries=int(data.get("max_retries", 0)),
        retry_policy=RetryPolicy(data.get("retry_policy", "APPLICATION")),
        resource=Resource(**data["resource"]) if "resource" in data else copy.deepcopy(NULL_RESOURCE),
        port_map=dict(data.get("port_map", {})),
        metadata=dict(data.get("metadata", {})),
        mounts=mounts,
        workspace=data.get("workspace"),
    )


def request_to_json(req: PopenRequest) -> dict[str, Any]:
    """The JSON form of ``req`` (what the supervisor reads)."""
    return {
        "app_id": req.app_id,
        "app_name": req.app_name,
        "log_dir": req.log_dir,
        "role_params": {role: [asdict(p) for p in params] for role, params in req.role_params.items()},
        "role_log_dirs": req.role_log_dirs,
        "roles": [role_to_json(r) for r in req.roles],
        "cancel_grace_period": req.cancel_grace_period,
        "gpus": req.gpus,
        "attempt_timeout": req.attempt_timeout,
        "start_timeout": req.start_timeout,
        "max_gpu_hours": req.max_gpu_hours,
    }


def request_from_json(data: dict[str, Any]) -> PopenRequest:
    """The ``PopenRequest`` stored by ``request_to_json``."""
    return PopenRequest(
        app_id=data["app_id"],
        log_dir=data["log_dir"],
        role_params={role: [ReplicaParam(**p) for p in params] for role, params in data["role_params"].items()},
        role_log_dirs=data["role_log_dirs"],
        app_name=data.get("app_name", ""),
        roles=[role_from_json(r) for r in data.get("roles", [])],
        cancel_grace_period=float(data.get("cancel_grace_period", 10.0)),
        gpus=dict(data.get("gpus") or {}),
        attempt_timeout=data.get("attempt_timeout"),
        start_timeout=data.get("start_timeout"),
        max_gpu_hours=data.get("max_gpu_hours"),
    )


def format_request(req: PopenRequest) -> str:
    """A readable dump of ``req`` (how ``AppDryRunInfo`` prints it)."""
    return json.dumps(request_to_json(req), indent=2, sort_keys=True)
