"""The end-of-task usage report of the operator and the sensor: one readable block in the task
log, the summary under the XCom key ``usage`` and Airflow metrics (``metrics.py``).

A report never changes a task's outcome: when the usage cannot be read it says so and the
task goes on to succeed or fail as it would have.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from airflow_provider_torchx.core.specs import parse_app_handle
from airflow_provider_torchx.core.usage import Usage
from airflow_provider_torchx.metrics import emit_usage_metrics

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_torchx.core.runner import Runner

#: The XCom key the summary (``Usage.to_dict()``) is pushed under.
XCOM_KEY = "usage"


def report_usage(
    runner: Runner,
    app_handle: str,
    context: Context,
    log: logging.Logger | Any,
    app_name: str | None = None,
    *,
    checkpoint_dir: str | None = None,
) -> Usage | None:
    """Log, push and emit the usage of the ended job ``app_handle``; return it (None: the job
    has not ended or its scheduler keeps no usage). ``app_name`` tags the metrics (default:
    the handle's app id); ``checkpoint_dir``, the job's checkpoint location, joins the summary."""
    try:
        status = runner.status(app_handle)
    except Exception as e:  # the report is a courtesy: never fail the task for it
        log.warning("Could not read the usage of %s: %s", app_handle, e)
        return None
    usage = status.usage if status is not None else None
    if usage is None:
        return None
    if checkpoint_dir is not None:
        usage = dataclasses.replace(usage, checkpoint_dir=checkpoint_dir)
    log.info("TorchX job %s %s", app_handle, usage.format())
    context["ti"].xcom_push(key=XCOM_KEY, value=usage.to_dict())
    parsed = parse_app_handle(app_handle)
    ti = context["ti"]
    emit_usage_metrics(
        usage,
        scheduler=parsed.scheduler_backend,
        app_name=app_name or parsed.app_id,
        dag_id=ti.dag_id,
        task_id=ti.task_id,
    )
    return usage
