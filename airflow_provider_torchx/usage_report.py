"""The end-of-task usage report of the operator and the sensor: one readable block in the task
log, the summary under the XCom key ``usage`` and Airflow metrics (``metrics.py``).

A report never changes a task's outcome: when the usage cannot be read it says so and the
task goes on to succeed or fail as it would have.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_provider_torchx.core.failures import FailureKind
from airflow_provider_torchx.core.guards import MAX_COST, Trip
from airflow_provider_torchx.core.specs import parse_app_handle
from airflow_provider_torchx.core.usage import Usage
from airflow_provider_torchx.ladder import ladder_line
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
    budget: Trip | None = None,
    failure_kind: FailureKind | None = None,
    ladder: Mapping[str, Any] | None = None,
) -> Usage | None:
    """Log, push and emit the usage of the ended job ``app_handle``; return it (None: the job
    has not ended or its scheduler keeps no usage). ``app_name`` tags the metrics (default:
    the handle's app id); ``checkpoint_dir``, the job's checkpoint location, joins the summary
    (priced at the rates the job carries, ``cost_usd``, as the runner reads it).
    ``budget``: the ``max_gpu_hours`` or ``max_cost`` trip that stopped the job: the summary
    says the budget was hit (XCom: key ``budget``), from the usage so far when the cancelled
    job has not ended yet. ``failure_kind``: a failed job's kind (XCom: key ``failure_kind``).
    ``ladder``: the totals over every rung a capacity ladder tried (``ladder.summed``; XCom: key
    ``ladder``), also logged."""
    try:
        status = runner.status(app_handle)
    except Exception as e:  # the report is a courtesy: never fail the task for it
        log.warning("Could not read the usage of %s: %s", app_handle, e)
        return None
    usage = status.usage if status is not None else None
    if usage is None and budget is not None and status is not None:
        usage = status.usage_so_far
    if usage is None:
        return None
    if checkpoint_dir is not None:
        usage = dataclasses.replace(usage, checkpoint_dir=checkpoint_dir)
    summary = usage.to_dict()
    text = usage.format()
    if budget is not None and budget.guard == MAX_COST:
        spent = f"${budget.cost_usd:.2f} spent when the job was cancelled"
        text += f"\n  Cost budget hit: max_cost={budget.limit:g}, {spent}"
        summary["budget"] = {"max_cost": budget.limit, "cost_usd": budget.cost_usd, "hit": True}
    elif budget is not None:
        hit = (
            f"GPU budget hit: max_gpu_hours={budget.limit:g}, {budget.gpu_hours:.4f} GPU-h used when the "
            "job was cancelled"
        )
        text += f"\n  {hit}"
        summary["budget"] = {"max_gpu_hours": budget.limit, "gpu_hours": budget.gpu_hours, "hit": True}
    if failure_kind is not None:
        summary["failure_kind"] = failure_kind.value
    if ladder is not None:
        summary["ladder"] = dict(ladder)
        text += f"\n  {ladder_line(ladder)}"
    log.info("TorchX job %s %s", app_handle, text)
    context["ti"].xcom_push(key=XCOM_KEY, value=summary)
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
