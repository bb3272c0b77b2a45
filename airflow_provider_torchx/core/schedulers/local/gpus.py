"""The host's GPU ledger (``auto_set_cuda_visible_devices``): devices are handed to jobs from
the host ledger (``ledger.py``), so concurrent jobs of every process on the host get disjoint
devices.

The launcher plans (``plan``: the host's devices and each GPU role's devices per replica) and
queues the job (``enqueue``) at submission; the job's supervisor then ``take``s its devices,
waiting PENDING while they do not fit, and gives them back (``release``) when the job ends.

Guarantees:

1. Devices go to jobs in submission order: a job never overtakes an earlier one still
   waiting, even when it would fit.
2. No device is held by two jobs; a job takes all its devices at once or none.
3. A holder whose supervisor died is found by the next ``take`` (its supervisor's identity is
   recorded): what is left of the job is killed and its devices are free again. Queue entries
   of jobs that are over are dropped.
4. While waiting, ``take`` says why: how many devices the job needs, how many are free, who
   holds them or which earlier job is ahead.

Standard library only: the supervisor imports this.
"""

from __future__ import annotations

import os

from airflow_provider_torchx.core.schedulers.local import ledger, procfs, store

TYPE_CHECKING = False  # not ``typing``: the supervisor's start-up must stay fast
if TYPE_CHECKING:
    from typing import Any

#: Overrides detection: comma-separated device indices (empty: no GPU).
GPUS_ENV = "AIRFLOW_TORCHX_LOCAL_GPUS"
#: How often a waiting supervisor looks at the ledger again (ms).
POLL_MS = 250
_DETECTED: list[list[int]] = []


def gpus_text(n: int) -> str:
    """``1 GPU``, ``2 GPUs``."""
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def host_devices() -> list[int]:
    """The host's GPU indices: ``$AIRFLOW_TORCHX_LOCAL_GPUS`` if set, else those
    ``nvidia-smi -L`` lists, else one per entry of ``/proc/driver/nvidia/gpus`` (detection
    runs once per process)."""
    value = os.environ.get(GPUS_ENV)
    if value is not None:
        items = [v.strip() for v in value.split(",") if v.strip()]
        if not all(v.isdigit() for v in items) or len(set(items)) != len(items):
            raise ValueError(
                f"{GPUS_ENV}: {value!r} is not a comma-separated list of distinct device indices "
                "(e.g. 0,1,2,3; empty: no GPU)"
            )
        return [int(v) for v in items]
    if not _DETECTED:
        _DETECTED.append(_detect())
    return list(_DETECTED[0])


def _detect() -> list[int]:
    import re
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=True).stdout
        found = [int(m.group(1)) for m in re.finditer(r"^GPU (\d+):", out, re.MULTILINE)]
        if found:
            return found
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        return list(range(len(os.listdir("/proc/driver/nvidia/gpus"))))
    except OSError:
        return []


def plan(per_replica: dict[str, int], replicas: dict[str, int], devices: list[int]) -> dict[str, Any] | None:
    """What the supervisor needs to take devices for the job: the host's ``devices`` and each
    GPU role's devices per replica; None when the job asks for none. ``per_replica`` and
    ``replicas`` map role names to GPUs per replica and replica counts (in role order)."""
    roles = {name: n for name, n in per_replica.items() if n > 0}
    if not roles:
        return None
    return {"devices": list(devices), "roles": roles, "need": sum(n * replicas[name] for name, n in roles.items())}


def split(counts: list[int], devices: list[int]) -> list[list[int]]:
    """``devices`` cut into consecutive runs of ``counts`` (one per replica, in order)."""
    out, at = [], 0
    for n in counts:
        out.append(devices[at : at + n])
        at += n
    return out


def _gpus(data: dict[str, Any]) -> dict[str, Any]:
    section = data.setdefault("gpus", {})
    section.setdefault("holders", {})
    section.setdefault("queue", [])
    return section


def _prune(root: str, section: dict[str, Any]) -> None:
    """Free the devices of holders whose supervisor died (killing what is left of their job)
    and drop queue entries of jobs that are over."""
    for app_id, holder in list(section["holders"].items()):
        if not ledger.supervisor_alive(holder["supervisor"]):
            procfs.kill_job(None, [], env_marker=store.job_marker(os.path.join(root, app_id)))
            del section["holders"][app_id]
    section["queue"] = [e for e in section["queue"] if not ledger.job_over(root, e["app_id"])]


def enqueue(root: str, app_id: str, need: int) -> None:
    """Queue the job for ``need`` devices (at submission: the queue's order is the
    submission order)."""
    with ledger.Locked(root) as data:
        _gpus(data)["queue"].append({"app_id": app_id, "need": need})


def take(root: str, app_id: str, supervisor: dict[str, Any], plan: dict[str, Any]) -> tuple[list[int] | None, str]:
    """Take the job's devices if it is its turn and they fit: ``(devices, "")``; else
    ``(None, why)``. ``supervisor`` is the caller's identity (pid, start, boot)."""
    need, devices = int(plan["need"]), plan["devices"]
    with ledger.Locked(root) as data:
        section = _gpus(data)
        _prune(root, section)
        holders, queue = section["holders"], section["queue"]
        if app_id in holders:
            return list(holders[app_id]["devices"]), ""
        ids = [e["app_id"] for e in queue]
        if app_id not in ids:  # dropped as stale by a process that misjudged it: back in line
            queue.append({"app_id": app_id, "need": need})
            ids.append(app_id)
        held = {d for h in holders.values() for d in h["devices"]}
        free = [d for d in devices if d not in held]
        ahead = queue[: ids.index(app_id)]
        if ahead:
            first = ahead[0]
            return None, (
                f"waiting for {gpus_text(need)}, {len(free)} free, behind {len(ahead)} earlier job(s) "
                f"({first['app_id']} waits for {first['need']})"
            )
        if len(free) < need:
            by = ", ".join(f"{a} ({','.join(map(str, h['devices']))})" for a, h in holders.items())
            return None, f"waiting for {gpus_text(need)}, {len(free)} free, held by {by or 'nobody'}"
        holders[app_id] = {"devices": free[:need], "supervisor": supervisor}
        del queue[ids.index(app_id)]
        return free[:need], ""


def release(root: str, app_id: str) -> None:
    """Give back the job's devices and leave the queue (idempotent)."""
    with ledger.Locked(root) as data:
        section = _gpus(data)
        section["holders"].pop(app_id, None)
        section["queue"] = [e for e in section["queue"] if e["app_id"] != app_id]
