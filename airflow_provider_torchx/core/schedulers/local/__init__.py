"""The local scheduler (``local_cwd``, ``local_dir``): replicas run as processes on this host
under a per-job supervisor; jobs live in an on-disk store, so they outlive their launcher.

The names are loaded on first use: the supervisor imports a module of this package at its
start-up and must not pay for the scheduler's imports.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not ``typing``: the supervisor's start-up must stay fast
if TYPE_CHECKING:
    from typing import Any

    from airflow_provider_torchx.core.schedulers.local.images import (
        CWDImageProvider,
        ImageProvider,
        LocalDirectoryImageProvider,
    )
    from airflow_provider_torchx.core.schedulers.local.logs import LogIterator
    from airflow_provider_torchx.core.schedulers.local.request import PopenRequest, ReplicaParam
    from airflow_provider_torchx.core.schedulers.local.scheduler import (
        LocalScheduler,
        create_cwd_scheduler,
        create_dir_scheduler,
        create_scheduler,
    )

__all__ = [
    "CWDImageProvider",
    "ImageProvider",
    "LocalDirectoryImageProvider",
    "LocalScheduler",
    "LogIterator",
    "PopenRequest",
    "ReplicaParam",
    "create_cwd_scheduler",
    "create_dir_scheduler",
    "create_scheduler",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        import importlib  # here, not above: the supervisor's start-up does without it

        return getattr(importlib.import_module(f"{__name__}.scheduler"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
