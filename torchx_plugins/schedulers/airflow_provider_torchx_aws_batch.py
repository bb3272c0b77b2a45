"""Registers ``aws_batch`` with TorchX (``torchx.plugins``): TorchX imports every module of the
``torchx_plugins.schedulers`` namespace package and collects the factories decorated with
``register.scheduler``. The scheduler itself loads on first use (docs/torchx-plugin.md).

The module is named after this distribution so that it cannot clash with another
distribution's module in the same namespace.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torchx.plugins import register

if TYPE_CHECKING:
    from airflow_provider_torchx.torchx_plugin.scheduler import BatchPluginScheduler


@register.scheduler(name="aws_batch")
def aws_batch(session_name: str, **kwargs: Any) -> BatchPluginScheduler:
    """AWS Batch, by airflow-provider-torchx: single-node and multi-node parallel jobs."""
    from airflow_provider_torchx.torchx_plugin.scheduler import create_scheduler

    return create_scheduler(session_name, **kwargs)
