"""The Slurm scheduler: each app runs as one Slurm batch job (see ``scheduler``).

The names are loaded on first use: a DAG's parse-time check of its literal cfg imports
``options`` of this package and must not pay for the scheduler's imports.
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from airflow_provider_torchx.core.schedulers.slurm.scheduler import SlurmScheduler, create_scheduler

__all__ = ["SlurmScheduler", "create_scheduler"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module(f"{__name__}.scheduler"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
