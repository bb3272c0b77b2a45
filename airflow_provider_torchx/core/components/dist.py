"""Builtin distributed components: ``dist.spmd``, a torchrun launch across nodes.

``torchrun`` (from PyTorch) must be in the image; it is not a dependency of this package.
"""

from __future__ import annotations

import os
import re
import shlex
from typing import Annotated

from airflow_provider_torchx.core.components._common import PYTHON_IMAGE, replica_resource, role_mounts
from airflow_provider_torchx.core.errors import ComponentError
from airflow_provider_torchx.core.schedulers.local.ports import port_env
from airflow_provider_torchx.core.specs import AppDef, Role, macros

#: Env vars ``debug=True`` sets (the user's ``env`` wins).
DEBUG_ENV = {
    "LOGLEVEL": "DEBUG",
    "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
    "TORCH_SHOW_CPP_STACKTRACES": "1",
    "NCCL_DEBUG": "INFO",
}
#: torchrun's template of the prefix of a line it tees (``--tee``); ``${role_name}`` with the
#: empty role (``--role ''``) makes it empty, so tee'd lines reach the log unchanged.
PREFIX_TEMPLATE_ENV = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"
_NO_PREFIX = {PREFIX_TEMPLATE_ENV: "${role_name}"}
#: The rendezvous's ``port_map`` entry, and its port where the scheduler picks none.
_RDZV, _DEFAULT_PORT = "c10d", 29500
_J_FORM = re.compile(r"^(?:(\d+)x)?(\d+)$")


def _parse_j(j: str) -> tuple[int, int]:
    """``"NODESxPROCS"`` or ``"PROCS"`` (one node) as ``(nodes, procs per node)``."""
    m = _J_FORM.match(j.strip())
    nodes, procs = (int(m.group(1) or 1), int(m.group(2))) if m else (0, 0)
    if nodes <= 0 or procs <= 0:
        raise ComponentError(f"-j: {j!r} is not NODESxPROCS or PROCS with positive integers (e.g. 2x4 or 4)")
    return nodes, procs


def _check_j(flag: str, j: str) -> None:
    """``-j``'s check (``Annotated``): the form ``_parse_j`` reads."""
    _parse_j(j)


def spmd(
    *script_args: str,
    script: str | None = None,
    m: str | None = None,
    image: str = PYTHON_IMAGE,
    name: str = "spmd",
    h: str | None = None,
    cpu: int = 1,
    gpu: int = 0,
    memMB: int = 1024,
    j: Annotated[str, _check_j] = "1x2",
    env: dict[str, str] | None = None,
    max_retries: int = 0,
    rdzv_port: int | None = None,
    mounts: list[str] | None = None,
    debug: bool = False,
) -> AppDef:
    """Runs a script or module on NODES nodes with PROCS processes each, through torchrun
    (single program, multiple data: the DDP/FSDP way).

    Every node runs ``torchrun`` under ``sh -c`` (``exec``: the replica's process is torchrun
    itself, so a stop's SIGTERM reaches it and the job waits for it to shut its workers down);
    the nodes meet at node 0 (c10d rendezvous on ``rdzv_port``), whose address the shell reads
    from the scheduler's ``rank0_env`` variable.
    Without ``rdzv_port`` the port is ``$TORCHX_PORT_C10D`` where the scheduler sets it (the
    local scheduler gives each job a free one, so multi-node jobs run side by side), else
    29500. A single node rendezvouses on localhost with a free port.

    torchrun tees each rank's stderr (``--tee 2``) into a file of its own under its log directory
    (``--log-dir``, or ``$PET_LOG_DIR``, which the local scheduler points into the replica's log
    directory): a failed job's root cause quotes the failing rank's own last lines from it
    (``core/errorfile.py``), not the lines of the node's other ranks. The lines still reach the
    node's stderr unchanged: the empty role and ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE``
    (``${role_name}``, unless ``env`` sets it) leave them unprefixed (torch before 2.2 ignores
    the template and prefixes them with ``[<local rank>]:``).

    ``OMP_NUM_THREADS`` defaults to the node's CPUs divided by its processes (at least 1),
    unless it is set (``env``, or the environment the replica inherits): torchrun would set it
    to 1 and print a warning into every node's log.

    Args:
        script_args: arguments passed on to the script or module
        script: the training script to run
        m: the module to run instead of a script, as python -m
        image: the image to run in; it must provide torchrun (local_cwd ignores it)
        name: the app name (the role is named after the script or module)
        h: a named resource (e.g. aws_p3.2xlarge) instead of cpu, gpu and memMB
        cpu: vCPUs per node
        gpu: GPUs per node
        memMB: memory per node in MB
        j: NODESxPROCS (e.g. 2x4) or PROCS (one node)
        env: environment variables, k1=v1,k2=v2
        max_retries: how many times the job is retried when a node fails
        rdzv_port: the port of the rendezvous on node 0 (more than one node; default: one the
            scheduler picks per job, else 29500)
        mounts: mounts, type=bind,src=/host,dst=/container[,readonly] (also volume, device)
        debug: set verbose distributed-debugging env vars (LOGLEVEL, TORCH_DISTRIBUTED_DEBUG ...)
    """
    if (script is None) == (m is None):
        raise ComponentError(f"--script/-m: give exactly one of them (got script={script!r}, m={m!r})")
    nodes, procs = _parse_j(j)
    if script is not None:
        role_name = os.path.splitext(os.path.basename(script))[0]
        target = [script]
    else:
        role_name = str(m).rsplit(".", 1)[-1]
        target = ["-m", str(m)]
    # ``$$`` survives macro substitution as one ``$``: the shell then expands the variable
    # whose name the scheduler substitutes for ``rank0_env``.
    port = f"$${{{port_env(_RDZV)}:-{_DEFAULT_PORT}}}" if rdzv_port is None else str(rdzv_port)
    endpoint = "localhost:0" if nodes == 1 else f"$${macros.rank0_env}:{port}"
    resource = replica_resource(cpu, gpu, memMB, h)
    omp_threads = max(1, int(resource.cpu) // procs)
    cmd = [
        f"export OMP_NUM_THREADS=$${{OMP_NUM_THREADS:-{omp_threads}}};",
        "exec",
        "torchrun",
        f"--nnodes {nodes}",
        f"--nproc_per_node {procs}",
        "--rdzv_backend c10d",
        f"--rdzv_endpoint {endpoint}",
        f"--rdzv_id {macros.app_id}",
        "--tee 2",
        "--role ''",
        *(shlex.quote(a) for a in (*target, *script_args)),
    ]
    return AppDef(
        name=name,
        roles=[
            Role(
                name=role_name,
                image=image,
                entrypoint="sh",
                args=["-c", " ".join(cmd)],
                env={**_NO_PREFIX, **(DEBUG_ENV if debug else {}), **(env or {})},
                num_replicas=nodes,
                max_retries=max_retries,
                resource=resource,
                port_map={_RDZV: _DEFAULT_PORT if rdzv_port is None else rdzv_port},
                mounts=role_mounts(mounts),
            )
        ],
    )
