"""Who cancelled a job: the reasons the Airflow layer gives its own cancels, and how a task
tells a cancel from outside (a person through the CLI, the UI's jobs page or AWS by hand, the
orphaned-jobs rule) from one of its own making (its timeout, its kill, a guardrail). The job's
record says who asked (``DescribeAppResponse.cancelled_by``, given as ``cancel(by=...)``); the
reason is words for people. An outside cancel fails the task without retry
(docs/behaviour.md, "Cancelling").
"""

from __future__ import annotations

from airflow_provider_torchx.core.identity import TaskIdentity
from airflow_provider_torchx.core.schedulers.api import CancelledBy, DescribeAppResponse
from airflow_provider_torchx.core.specs import AppState
from airflow_provider_torchx.orphans import task_name


def task_cancel_reason(identity: TaskIdentity | None, what: str) -> str:
    """The reason a task gives its own cancel of its job (made with ``by=CancelledBy.TASK``):
    the task instance as messages name it (``orphans.task_name``), then ``what``."""
    return f"{task_name(identity)} {what}"


def ui_cancel_reason(user: str) -> str:
    """The reason of a cancel from the UI's jobs page by ``user``."""
    return f"the Airflow UI's TorchX jobs page, by {user}"


def outside_canceller(desc: DescribeAppResponse | None) -> str | None:
    """Who or what cancelled the ended job ``desc`` from outside its task, for the task's
    failure message; None when it was not cancelled or the task cancelled it itself
    (``CancelledBy.TASK``). Derived from who the record says asked: a user (the reason names
    them), the orphaned-jobs rule (with its reason); where it does not say, the recorded reason
    (a Batch job stopped by hand carries the reason given there), else a cancel requested with
    neither is from outside: the task always says it is its own."""
    if desc is None or desc.state not in (AppState.CANCELLED, AppState.FAILED):
        return None
    reason = desc.cancel_reason
    if desc.cancelled_by == CancelledBy.TASK:
        return None
    if desc.cancelled_by == CancelledBy.REAPER:
        return "the orphaned-jobs rule" + (f" ({reason})" if reason else "")
    if desc.cancelled_by == CancelledBy.USER:
        return reason or "a user (who was not recorded)"
    if reason is not None:
        return reason
    if desc.cancel_requested and desc.state == AppState.CANCELLED:
        return "a cancel request through the scheduler (who asked was not recorded)"
    return None
