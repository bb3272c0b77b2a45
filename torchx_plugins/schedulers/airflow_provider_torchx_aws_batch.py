"""Registers ``aws_batch`` with TorchX (``torchx.plugins``): TorchX imports every module of the
``torchx_plugins.schedulers`` namespace package and collects the factories decorated with
``register.scheduler``. The scheduler itself loads on first use (docs/torchx-plugin.md).

TorchX makes the first registered plugin its default scheduler (the one ``torchx run`` and
``torchx list`` use without ``-s``), and collects a module's plugins in the order of their
attribute names. So that installing this package leaves TorchX's default alone, the module
first registers TorchX's own default (``_torchx_default``: the first of TorchX's builtin
schedulers, under its own name and loaded from TorchX's own module), then ``aws_batch``.

The module is named after this distribution so that it cannot clash with another
distribution's module in the same namespace.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from torchx.plugins import register
from torchx.schedulers import DEFAULT_SCHEDULER_MODULES

if TYPE_CHECKING:
    from torchx.schedulers.api import Scheduler

    from airflow_provider_torchx.torchx_plugin.scheduler import BatchPluginScheduler

#: TorchX's default scheduler without plugins (its first builtin).
TORCHX_DEFAULT = next(iter(DEFAULT_SCHEDULER_MODULES))


@register.scheduler(name=TORCHX_DEFAULT)
def _torchx_default(session_name: str, **kwargs: Any) -> Scheduler[Any]:
    """TorchX's own default scheduler, from TorchX's own module (registered first: see above)."""
    return importlib.import_module(DEFAULT_SCHEDULER_MODULES[TORCHX_DEFAULT]).create_scheduler(session_name, **kwargs)


@register.scheduler(name="aws_batch")
def aws_batch(session_name: str, **kwargs: Any) -> BatchPluginScheduler:
    """AWS Batch, by airflow-provider-torchx: single-node and multi-node parallel jobs."""
    from airflow_provider_torchx.torchx_plugin.scheduler import create_scheduler

    return create_scheduler(session_name, **kwargs)
