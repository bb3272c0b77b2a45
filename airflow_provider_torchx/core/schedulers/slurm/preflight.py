"""Whether a job fits its partition, before anything is submitted: pure rules over what
``scontrol show partition -o`` and ``scontrol show node -o`` print (``commands.parse_key_values``).

- The partition (``cfg["partition"]``, else the cluster's default) must exist
  (``InvalidRunConfigError`` listing the partitions) and be UP (``JobWontFitError``).
- ``time`` must not exceed the partition's ``MaxTime``; a longer limit that ``attempt_timeout``
  or ``max_gpu_hours`` give (``options.time_limit``) is lowered to it (``fit_time``).
- Each role needs ``num_replicas`` nodes of the partition that each have its CPUs, memory and
  GPUs (GRES ``gpu``), within the partition's ``MaxNodes`` and ``MaxMemPerNode``.

A ``JobWontFitError`` names the partition and the limit; the nodes counted are those configured
in the partition, whatever their state now (a node that is down may come back; one too small
never fits).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_provider_torchx.core.errors import InvalidRunConfigError, JobWontFitError
from airflow_provider_torchx.core.schedulers.slurm import render
from airflow_provider_torchx.core.schedulers.slurm.options import time_limit, time_minutes

_GPU = re.compile(r"(?:^|,)gpu(?::[^:,(]+)?:(\d+)")


def gpus_of(gres: str) -> int:
    """The GPUs a node's ``Gres`` counts (``gpu:2``, ``gpu:a100:4(S:0-1)``, several types summed)."""
    return sum(int(n) for n in _GPU.findall(gres or ""))


def _int(value: str | None) -> int | None:
    try:
        return int(str(value))
    except ValueError:
        return None  # UNLIMITED, N/A


def pick_partition(cfg: Mapping[str, Any], partitions: Sequence[Mapping[str, str]]) -> Mapping[str, str]:
    """The partition the job goes to; ``InvalidRunConfigError`` when it does not exist."""
    names = [p.get("PartitionName", "") for p in partitions]
    wanted = cfg.get("partition")
    if wanted:
        for p in partitions:
            if p.get("PartitionName") == wanted:
                return p
        raise InvalidRunConfigError(
            f"cfg: partition={wanted!r} does not exist on this Slurm cluster; "
            f"its partitions: {', '.join(names) or 'none'}"
        )
    for p in partitions:
        if p.get("Default") == "YES":
            return p
    raise InvalidRunConfigError(
        f"cfg: partition is not set and the cluster has no default partition; set one of: {', '.join(names) or 'none'}"
    )


def fit_time(script: str, roles: Sequence[Mapping[str, Any]], cfg: Mapping[str, Any], part: Mapping[str, str]) -> str:
    """The batch ``script`` with a time limit that a guard gave (``options.time_limit``:
    ``attempt_timeout``, ``max_gpu_hours``) and that is longer than the partition's ``MaxTime``
    lowered to ``MaxTime``: the partition stops the job by then anyway, and Slurm would hold a
    job asking for more pending for ever (``PartitionTimeLimit``). The user's own ``time`` is
    never changed (``check_fit`` refuses one over ``MaxTime``)."""
    limit = time_limit(render.gpus(roles), cfg)
    max_time = part.get("MaxTime", "UNLIMITED")
    if limit is None or limit[1].startswith("time=") or time_minutes(limit[0]) <= time_minutes(max_time):
        return script
    return script.replace(f"#SBATCH --time={limit[0]}\n", f"#SBATCH --time={max_time}\n")


def check_fit(
    roles: Sequence[Mapping[str, Any]],
    cfg: Mapping[str, Any],
    partitions: Sequence[Mapping[str, str]],
    nodes: Sequence[Mapping[str, str]],
) -> str:
    """Raise unless the job (its roles as ``render.SlurmRequest.roles``) fits; return the
    partition's name."""
    part = pick_partition(cfg, partitions)
    name = part.get("PartitionName", "")
    if part.get("State") != "UP":
        raise JobWontFitError(f"partition {name!r} is {part.get('State')}, not UP: Slurm would not start the job")
    max_time = part.get("MaxTime", "UNLIMITED")
    given = cfg.get("time")
    if given and time_minutes(str(given)) > time_minutes(max_time):
        raise JobWontFitError(f"cfg: time={given!r} exceeds partition {name!r}'s MaxTime {max_time}")
    members = [n for n in nodes if name in (n.get("Partitions") or "").split(",")]
    max_nodes = _int(part.get("MaxNodes"))
    max_mem = _int(part.get("MaxMemPerNode"))
    for role in roles:
        res = role.get("resource") or {}
        cpu, gpu, mem = int(res.get("cpu", -1)), int(res.get("gpu", -1)), int(res.get("memMB", -1))
        want = int(role["num_replicas"])
        need = f"role {role['name']!r} needs {want} node(s)"
        if max_nodes is not None and want > max_nodes:
            raise JobWontFitError(f"{need}; partition {name!r} allows at most MaxNodes={max_nodes} per job")
        if max_mem is not None and mem > max_mem:
            raise JobWontFitError(f"{need} with {mem} MB each; partition {name!r} has MaxMemPerNode={max_mem} MB")
        fit = [
            n
            for n in members
            if (cpu <= 0 or (_int(n.get("CPUTot")) or 0) >= cpu)
            and (mem <= 0 or (_int(n.get("RealMemory")) or 0) >= mem)
            and (gpu <= 0 or gpus_of(n.get("Gres", "")) >= gpu)
        ]
        if len(fit) < want:
            each = ", ".join(
                part
                for part in (
                    f"{cpu} CPUs" if cpu > 0 else "",
                    f"{mem} MB" if mem > 0 else "",
                    f"{gpu} GPUs" if gpu > 0 else "",
                )
                if part
            )
            most = max((gpus_of(n.get("Gres", "")) for n in members), default=0)
            raise JobWontFitError(
                f"{need}" + (f" with {each} each" if each else "") + f"; partition {name!r} has {len(fit)} such "
                f"node(s) of {len(members)} (at most {most} GPUs, "
                f"{max((_int(n.get('CPUTot')) or 0 for n in members), default=0)} CPUs and "
                f"{max((_int(n.get('RealMemory')) or 0 for n in members), default=0)} MB per node)"
            )
    return name
