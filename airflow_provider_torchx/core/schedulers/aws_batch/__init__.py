"""The AWS Batch scheduler: each app runs as one single-node or multi-node parallel job (see ``scheduler``).

The names are loaded on first use: a DAG's parse-time check of its literal cfg imports
``run_options`` of this package and must not pay for the scheduler's imports.
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from airflow_provider_torchx.core.schedulers.aws_batch.render import BatchJob
    from airflow_provider_torchx.core.schedulers.aws_batch.scheduler import AWSBatchScheduler, create_scheduler

__all__ = ["AWSBatchScheduler", "BatchJob", "create_scheduler"]
_HOMES = {"AWSBatchScheduler": "scheduler", "BatchJob": "render", "create_scheduler": "scheduler"}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
