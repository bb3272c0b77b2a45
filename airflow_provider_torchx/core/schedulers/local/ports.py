"""Ports per job on the local scheduler: every port a role declares in its ``port_map`` gets a
port of its own per job, free when the job is submitted, so jobs that listen on "the same"
port (two multi-node ``dist.spmd`` jobs rendezvousing on 29500) run side by side.

Each replica of the role finds its port in ``TORCHX_PORT_<NAME>`` (``port_env``); a component
reads it there (``dist.spmd`` does, unless given an explicit ``--rdzv_port``). Ports handed
out are reserved in the host ledger (``ledger.py``) until their job is over, so two jobs
submitted at the same moment never get the same port, also before either listens on it.
"""

from __future__ import annotations

import re
import socket

from airflow_provider_torchx.core.schedulers.local import ledger
from airflow_provider_torchx.core.schedulers.local.request import PopenRequest

#: How many ports the kernel may offer that are already reserved before giving up.
_ATTEMPTS = 100


def port_env(name: str) -> str:
    """The env var that holds the job's port for the ``port_map`` entry ``name``
    (``c10d`` -> ``TORCHX_PORT_C10D``)."""
    return "TORCHX_PORT_" + re.sub(r"[^A-Za-z0-9]", "_", name).upper()


def _free_port(reserved: dict[str, str]) -> int:
    for _ in range(_ATTEMPTS):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            port = int(s.getsockname()[1])
        if str(port) not in reserved:
            return port
    raise RuntimeError(f"no free port: the kernel offered {_ATTEMPTS} ports that other jobs have reserved")


def assign(root: str, req: PopenRequest) -> dict[str, dict[str, int]]:
    """Give each ``port_map`` entry of each role of ``req`` a free port, reserved for the job
    in the host ledger of the store at ``root``, and set ``TORCHX_PORT_<NAME>`` in each of the
    role's replicas. Returns ``{role: {name: port}}``."""
    wanted = [(role.name, name) for role in req.roles for name in role.port_map]
    if not wanted:
        return {}
    chosen: dict[str, dict[str, int]] = {}
    with ledger.Locked(root) as data:
        reserved: dict[str, str] = data.setdefault("ports", {})
        over = {o for o in set(reserved.values()) if o != req.app_id and ledger.job_over(root, o)}
        for stale in [p for p, owner in reserved.items() if owner in over]:
            del reserved[stale]
        for role_name, name in wanted:
            port = _free_port(reserved)
            reserved[str(port)] = req.app_id
            chosen.setdefault(role_name, {})[name] = port
    for role_name, by_name in chosen.items():
        for param in req.role_params[role_name]:
            param.env.update({port_env(name): str(p) for name, p in by_name.items()})
    return chosen
