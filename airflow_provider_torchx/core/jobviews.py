"""What the CLI shows of jobs: a readable form (no Python reprs) and a JSON form whose keys are
documented in docs/cli.md ("JSON output") and kept stable, for ``status``, ``describe`` and
``list``. Secrets in env vars are masked by the caller (``core/masking.py``) before they get here.

Plain text shows a job's strings (names, labels, messages, log lines) through ``printable``, so
that a newline, carriage return or terminal escape in them cannot forge lines of the CLI's own
output; JSON needs nothing (``json.dumps`` escapes every control character).
"""

from __future__ import annotations

import dataclasses
import enum
import re
import shlex
import time
from collections.abc import Callable
from dataclasses import asdict, is_dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from airflow_provider_torchx.core.failures import classify
from airflow_provider_torchx.core.identity import task_label
from airflow_provider_torchx.core.schedulers.api import DescribeAppResponse, ListAppResponse
from airflow_provider_torchx.core.specs import AppDef, ReplicaStatus, Resource, Role
from airflow_provider_torchx.core.usage import Usage

if TYPE_CHECKING:
    from airflow_provider_torchx.core.errorfile import RootCause

T = TypeVar("T")

#: What ``printable`` escapes: the C0 controls but tab, DEL, the C1 controls and Unicode's line
#: and paragraph separators. Tab stays: it cannot leave its line nor overwrite what is printed.
_CONTROLS = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")


def printable(text: str) -> str:
    """``text`` with every character ``_CONTROLS`` names written as Python writes it in a
    string literal (``\\n``, ``\\r``, ``\\x1b``): what plain-text output shows of a job's
    own strings cannot start a line, move the cursor or send a terminal command."""
    return _CONTROLS.sub(lambda m: repr(m.group())[1:-1], text)


def map_strings(value: T, fn: Callable[[str], str]) -> T:
    """A copy of ``value`` (dataclasses, dicts, lists, tuples: an ``AppDef``, a status) with
    ``fn`` applied to every string, dict keys included; enums and other objects are kept as
    they are."""
    result: Any
    if isinstance(value, str) and not isinstance(value, enum.Enum):
        result = fn(value)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = [f.name for f in dataclasses.fields(value) if f.init]
        result = dataclasses.replace(value, **{name: map_strings(getattr(value, name), fn) for name in fields})
    elif isinstance(value, dict):
        result = {map_strings(k, fn): map_strings(v, fn) for k, v in value.items()}
    elif isinstance(value, list | tuple) and type(value) in (list, tuple):
        result = type(value)(map_strings(v, fn) for v in value)
    else:
        result = value
    return result


def printable_tree(value: T) -> T:
    """A copy of ``value`` with ``printable`` applied to every string (``map_strings``)."""
    return map_strings(value, printable)


def plain(value: Any) -> Any:
    """``value`` as JSON-able data: dataclasses as dicts (a mount also names its ``type``),
    enums as their values, tuples as lists."""
    if is_dataclass(value) and not isinstance(value, type):
        fields = {k: plain(getattr(value, k)) for k in asdict(value)}
        return {"type": type(value).__name__, **fields} if type(value).__name__.endswith("Mount") else fields
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def replica_dict(rep: ReplicaStatus) -> dict[str, Any]:
    """One replica's status: ``id``, ``state``, ``hostname``, ``exit_code``, ``msg``, ``devices``."""
    return {
        "id": rep.id,
        "state": rep.state.name,
        "hostname": rep.hostname,
        "exit_code": rep.exit_code,
        "msg": rep.msg or rep.structured_error_msg,
        "devices": rep.devices or None,
    }


def failure_line(desc: DescribeAppResponse | None, root_cause: RootCause | None = None) -> str:
    """``Failure kind: app (ValueError on trainer/0)`` of an ended job that failed
    (``core/failures.py``); "" otherwise."""
    failure = classify(desc, root_cause) if desc is not None else None
    return f"Failure kind: {failure.kind.value} ({failure.why})" if failure else ""


def usage_so_far(desc: DescribeAppResponse, now: float) -> dict[str, float | None] | None:
    """What a live job used until ``now`` (epoch seconds): its GPU-hours (None: it asked for
    none) and cost in US dollars (None: not priced); None for an ended job, or one whose
    scheduler keeps no live usage."""
    usage = desc.usage_so_far
    if usage is None or desc.state.is_terminal():
        return None
    return {"gpu_hours": usage.gpu_hours_at(now), "cost_usd": usage.cost_so_far(now)}


def cost_usd(desc: DescribeAppResponse, now: float) -> float | None:
    """What a job cost in US dollars: so far for a live one (``usage_so_far``), in full for an
    ended one (its usage summary's); None: not priced. The UI's jobs list and job page agree."""
    if desc.state.is_terminal():
        return desc.usage.cost_usd if desc.usage is not None else None
    so_far = usage_so_far(desc, now)
    return so_far["cost_usd"] if so_far is not None else None


def used_so_far(usage: Usage, now: float) -> str:
    """``0.0123 GPU-h, $0.03``: the GPU-hours (where the job asked for GPUs) and cost (where it
    is priced) of a live job's ``usage`` until ``now``; empty when it has neither."""
    gpu_hours, cost = usage.gpu_hours_at(now), usage.cost_so_far(now)
    figures = [f"{gpu_hours:.4f} GPU-h"] if gpu_hours is not None else []
    figures += [f"${cost:.2f}"] if cost is not None else []
    return ", ".join(figures)


def so_far_line(desc: DescribeAppResponse, now: float) -> str:
    """``  Used so far: 0.0123 GPU-h, $0.03`` for a live job; nothing for an ended one or one
    with no such figures."""
    if desc.usage_so_far is None or desc.state.is_terminal():
        return ""
    used = used_so_far(desc.usage_so_far, now)
    return f"  Used so far: {used}" if used else ""


def status_dict(handle: str, desc: DescribeAppResponse, root_cause: RootCause | None = None) -> dict[str, Any]:
    """``status --json``: the job's state and why (with a failed job's ``root_cause``,
    ``core/errorfile.py``, and ``failure_kind``, ``core/failures.py``), its replicas, times,
    usage and, while it runs, what it used so far (``usage_so_far``)."""
    failure = classify(desc, root_cause)
    return {
        "handle": handle,
        "state": desc.state.name,
        "terminal": desc.state.is_terminal(),
        "num_restarts": desc.num_restarts,
        "msg": desc.msg,
        "structured_error_msg": desc.structured_error_msg,
        "ui_url": desc.ui_url,
        "started": desc.started,
        "ended": desc.ended,
        "cancel_requested": desc.cancel_requested,
        "cancel_reason": desc.cancel_reason,
        "cancelled_by": None if desc.cancelled_by is None else desc.cancelled_by.value,
        "labels": dict(desc.labels),
        "roles": [{"role": rs.role, "replicas": [replica_dict(r) for r in rs.replicas]} for rs in desc.roles_statuses],
        "usage": {**desc.usage.to_dict(), "checkpoint_dir": desc.checkpoint_dir} if desc.usage is not None else None,
        "usage_so_far": usage_so_far(desc, time.time()),
        "checkpoint_dir": desc.checkpoint_dir,
        "root_cause": plain(root_cause) if root_cause is not None else None,
        "failure_kind": failure.kind.value if failure else None,
    }


def describe_dict(
    handle: str, app: AppDef, desc: DescribeAppResponse, root_cause: RootCause | None = None
) -> dict[str, Any]:
    """``describe --json``: the app as the scheduler keeps it and the job's status."""
    return {"handle": handle, "app": plain(app), "status": status_dict(handle, desc, root_cause)}


def list_dict(apps: list[ListAppResponse]) -> dict[str, Any]:
    """``list --json``: one entry per job."""
    return {
        "jobs": [
            {
                "handle": a.app_handle,
                "state": a.state.name,
                "name": a.name,
                "submitted": a.created,
                "airflow_task": task_label(a.labels),
                "labels": dict(a.labels),
            }
            for a in apps
        ]
    }


def count(n: int, noun: str) -> str:
    """``1 GPU``, ``2 GPUs``."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


def resource_text(res: Resource) -> str:
    """``2 CPUs, 1 GPU, 1024 MiB`` and the capabilities and devices asked for."""
    parts = [count(res.cpu, "CPU"), count(res.gpu, "GPU"), f"{res.memMB} MiB"]
    parts += [f"{k}={v}" for k, v in res.capabilities.items()]
    parts += [f"device {k} x{v}" for k, v in res.devices.items()]
    return ", ".join(parts)


def replica_text(role: str, rep: ReplicaStatus) -> str:
    """``trainer[0]@host RUNNING (exit 1) GPUs 0,1``."""
    host = f"@{rep.hostname}" if rep.hostname else ""
    code = f" (exit {rep.exit_code})" if rep.exit_code is not None else ""
    devices = f" GPUs {rep.devices}" if rep.devices else ""
    return f"{role}[{rep.id}]{host} {rep.state.name}{code}{devices}"


def _role_text(role: Role, replicas: list[ReplicaStatus]) -> list[str]:
    lines = [
        f"Role {role.name}: {count(role.num_replicas, 'replica')}"
        + (f" (at least {role.min_replicas})" if role.min_replicas is not None else ""),
        f"  image: {role.image or '-'}",
        f"  command: {shlex.join([role.entrypoint, *role.args])}",
        f"  resource: {resource_text(role.resource)}",
        f"  retries: {role.max_retries} (policy {role.retry_policy.value})",
    ]
    if any("${" in a for a in role.args):
        lines.append("  (${...} macros are filled in per replica when the job runs)")
    if role.env:
        lines.append("  env: " + ", ".join(f"{k}={v}" for k, v in role.env.items()))
    if role.port_map:
        lines.append("  ports: " + ", ".join(f"{k}={v}" for k, v in role.port_map.items()))
    for m in role.mounts:
        fields = plain(m)
        lines.append(f"  mount ({fields.pop('type')}): " + ", ".join(f"{k}={v}" for k, v in fields.items()))
    if role.workspace:
        lines.append(f"  workspace: {role.workspace}")
    if role.metadata:
        lines.append("  metadata: " + ", ".join(f"{k}={v}" for k, v in role.metadata.items()))
    for rep in replicas:
        lines.append("  " + replica_text(role.name, rep) + (f": {rep.msg}" if rep.msg and not rep.devices else ""))
    return lines


def describe_text(app: AppDef, desc: DescribeAppResponse | None, root_cause: RootCause | None = None) -> str:
    """``describe``: the app (its roles: image, command, resources, retries, env, ports,
    mounts), each replica's state and devices, and a failed job's root cause, as plain lines."""
    replicas = {rs.role: rs.replicas for rs in (desc.roles_statuses if desc else [])}
    lines = [f"App: {app.name}"]
    if app.metadata:
        lines.append("Metadata: " + ", ".join(f"{k}={v}" for k, v in app.metadata.items()))
    if desc is not None:
        lines.append(f"State: {desc.state.name}" + (f" ({desc.msg})" if desc.msg else ""))
        kind = failure_line(desc, root_cause)
        if kind:
            lines.append(kind)
        if desc.labels:
            lines.append("Labels: " + ", ".join(f"{k}={v}" for k, v in sorted(desc.labels.items())))
        if desc.checkpoint_dir:
            lines.append(f"Checkpoints: {desc.checkpoint_dir}")
    for role in app.roles:
        lines += _role_text(role, replicas.get(role.name, []))
    if root_cause is not None:
        lines.append(root_cause.format())
    return "\n".join(lines)


def when(epoch: float | None) -> str:
    """A local time ``YYYY-MM-DD HH:MM:SS`` (``-`` when unknown)."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch)) if epoch else "-"
