"""What the builtin components share: default images and the resource and mount arguments."""

from __future__ import annotations

from airflow_provider_torchx.core.errors import ComponentError
from airflow_provider_torchx.core.specs import Mount, Resource, parse_mounts, resource

#: Image of the shell components (``utils.echo``, ``utils.sh``, ``utils.touch``).
SHELL_IMAGE = "busybox"
#: Image of the Python components (``utils.python``, ``dist.spmd``).
PYTHON_IMAGE = "python:3.11-slim"


def replica_resource(cpu: int, gpu: int, memMB: int, h: str | None) -> Resource:
    """The named resource ``h`` if given, else ``cpu``/``gpu``/``memMB``."""
    try:
        return resource(cpu=cpu, gpu=gpu, memMB=memMB, h=h)
    except KeyError as err:
        raise ComponentError(f"-h: {err}") from err


def role_mounts(mounts: list[str] | None) -> list[Mount]:
    """``mounts`` (``type=bind,src=...,dst=...`` tokens) parsed into typed mounts."""
    try:
        return parse_mounts(mounts) if mounts else []
    except ValueError as err:
        raise ComponentError(f"--mounts: {err}") from err
