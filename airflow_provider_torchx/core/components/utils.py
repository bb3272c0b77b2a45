"""Builtin utility components: ``utils.echo``, ``utils.sh``, ``utils.python``, ``utils.touch``.

Each is a plain function returning an ``AppDef``; its signature and docstring are its
command-line interface (``airflow-torchx run -s local_cwd utils.echo --msg hi``).
"""

from __future__ import annotations

from typing import Annotated

from airflow_provider_torchx.core.components import AtLeast
from airflow_provider_torchx.core.components._common import (
    PYTHON_IMAGE,
    SHELL_IMAGE,
    replica_resource,
    role_mounts,
)
from airflow_provider_torchx.core.errors import ComponentError
from airflow_provider_torchx.core.specs import AppDef, Role, resource


def echo(msg: str = "hello world", image: str = SHELL_IMAGE, num_replicas: Annotated[int, AtLeast(1)] = 1) -> AppDef:
    """Prints a message to stdout: a smoke test of a scheduler.

    Args:
        msg: the message to print
        image: the image to run in (local_cwd ignores it)
        num_replicas: how many replicas print it
    """
    return AppDef(
        name="echo",
        roles=[
            Role(
                name="echo",
                image=image,
                entrypoint="echo",
                args=[msg],
                num_replicas=num_replicas,
                resource=resource(),
            )
        ],
    )


def sh(
    *args: str,
    image: str = SHELL_IMAGE,
    num_replicas: Annotated[int, AtLeast(1)] = 1,
    cpu: int = 1,
    gpu: int = 0,
    memMB: int = 1024,
    h: str | None = None,
    env: dict[str, str] | None = None,
    max_retries: int = 0,
    mounts: list[str] | None = None,
) -> AppDef:
    """Runs its arguments as one shell command line (``sh -c "ARGS..."``).

    Args:
        args: the command line; the words are joined with spaces, so pipes, ``&&`` and
            ``$VARS`` work as in a shell (``$$`` stands for a literal ``$``)
        image: the image to run in (local_cwd ignores it)
        num_replicas: how many replicas run the command
        cpu: vCPUs per replica
        gpu: GPUs per replica
        memMB: memory per replica in MB
        h: a named resource (e.g. aws_m5.2xlarge) instead of cpu, gpu and memMB
        env: environment variables, k1=v1,k2=v2
        max_retries: how many times a failed replica is retried
        mounts: mounts, type=bind,src=/host,dst=/container[,readonly] (also volume, device)
    """
    if not args:
        raise ComponentError("args: utils.sh needs a command line to run")
    return AppDef(
        name="sh",
        roles=[
            Role(
                name="sh",
                image=image,
                entrypoint="sh",
                args=["-c", " ".join(args)],
                env=dict(env or {}),
                num_replicas=num_replicas,
                max_retries=max_retries,
                resource=replica_resource(cpu, gpu, memMB, h),
                mounts=role_mounts(mounts),
            )
        ],
    )


def python(
    *args: str,
    m: str | None = None,
    c: str | None = None,
    script: str | None = None,
    image: str = PYTHON_IMAGE,
    name: str = "python",
    cpu: int = 1,
    gpu: int = 0,
    memMB: int = 1024,
    h: str | None = None,
    num_replicas: Annotated[int, AtLeast(1)] = 1,
    env: dict[str, str] | None = None,
    max_retries: int = 0,
    mounts: list[str] | None = None,
) -> AppDef:
    """Runs Python: a module (-m), a code string (-c) or a script file.

    Args:
        args: arguments passed on to the module, code or script
        m: a module to run, as python -m
        c: code to run, as python -c
        script: a script file to run
        image: the image to run in (local_cwd ignores it)
        name: the app and role name
        cpu: vCPUs per replica
        gpu: GPUs per replica
        memMB: memory per replica in MB
        h: a named resource (e.g. aws_m5.2xlarge) instead of cpu, gpu and memMB
        num_replicas: how many replicas run it
        env: environment variables, k1=v1,k2=v2
        max_retries: how many times a failed replica is retried
        mounts: mounts, type=bind,src=/host,dst=/container[,readonly] (also volume, device)
    """
    chosen = [(flag, value) for flag, value in (("-m", m), ("-c", c), ("--script", script)) if value is not None]
    if len(chosen) != 1:
        given = ", ".join(flag for flag, _ in chosen) or "none"
        raise ComponentError(f"-m/-c/--script: give exactly one of them (given: {given})")
    flag, value = chosen[0]
    cmd = [value] if flag == "--script" else [flag, value]
    return AppDef(
        name=name,
        roles=[
            Role(
                name=name,
                image=image,
                entrypoint="python",
                args=[*cmd, *args],
                env=dict(env or {}),
                num_replicas=num_replicas,
                max_retries=max_retries,
                resource=replica_resource(cpu, gpu, memMB, h),
                mounts=role_mounts(mounts),
            )
        ],
    )


def touch(file: str, image: str = SHELL_IMAGE) -> AppDef:
    """Creates an empty file (or updates its time): a check that a job can write.

    Args:
        file: the path of the file to touch
        image: the image to run in (local_cwd ignores it)
    """
    return AppDef(
        name="touch",
        roles=[Role(name="touch", image=image, entrypoint="touch", args=[file], resource=resource())],
    )
