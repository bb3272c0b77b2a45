"""Who cancelled a job: the reasons the Airflow layer gives its own cancels, and how a task
tells a cancel from outside (a person through the CLI, the UI's jobs page or AWS by hand)
from one of its own making (its timeout, ``on_kill``). An outside cancel fails the task
without retry (docs/behaviour.md, "Cancelling").
"""

from __future__ import annotations

from collections.abc import Mapping

from airflow_provider_torchx.core.identity import TaskIdentity
from airflow_provider_torchx.core.schedulers.api import DescribeAppResponse
from airflow_provider_torchx.core.specs import AppState
from airflow_provider_torchx.orphans import task_name

#: How the reason of every cancel of a task's own making begins.
TASK_CANCEL_PREFIX = "Airflow task "


def task_cancel_reason(dag_id: str | None, task_id: str | None, what: str) -> str:
    """The reason a task gives its own cancel of its job (``what``: timeout, killed, ...)."""
    return f"{TASK_CANCEL_PREFIX}{dag_id}.{task_id}: {what}"


def task_instance_cancel_reason(labels: Mapping[str, str], what: str) -> str:
    """The reason a trigger gives its own cancel of the job of the task instance its job
    ``labels`` name: the instance as messages name it (``orphans.task_name``: task, run, map
    index), then ``what``; it begins with ``TASK_CANCEL_PREFIX``, as every cancel of a task's
    own making does (labels that name no task instance: "task (unnamed)")."""
    if TaskIdentity.from_labels(labels) is None:
        return f"{TASK_CANCEL_PREFIX}(unnamed) {what}"
    return f"Airflow {task_name(labels)} {what}"


def ui_cancel_reason(user: str) -> str:
    """The reason of a cancel from the UI's jobs page by ``user``."""
    return f"the Airflow UI's TorchX jobs page, by {user}"


def outside_canceller(desc: DescribeAppResponse | None) -> str | None:
    """Who or what cancelled the ended job ``desc`` from outside its task: the recorded
    reason (a Batch job stopped by hand carries the reason given there); None when it was not
    cancelled or the task cancelled it itself. A cancel requested through the scheduler with
    no reason recorded is from outside: the task always gives one."""
    if desc is None or desc.state not in (AppState.CANCELLED, AppState.FAILED):
        return None
    if desc.cancel_reason is None:
        if desc.cancel_requested and desc.state == AppState.CANCELLED:
            return "a cancel request through the scheduler (who asked was not recorded)"
        return None
    return None if desc.cancel_reason.startswith(TASK_CANCEL_PREFIX) else desc.cancel_reason
