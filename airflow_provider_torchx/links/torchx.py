"""Extra links of a TorchX task: the job's page (AWS Batch console) or a local job's log directory.

The operator records each link's URL in XCom under the link's ``xcom_key`` as soon as the job
is submitted, so the buttons work while the job runs; ``get_link`` reads it back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey


class _XComLink(BaseOperatorLink):
    """A link whose URL the task pushed to XCom under ``xcom_key``."""

    def persist(self, context: Any, url: str | None) -> None:
        """Record ``url`` (empty: no such link for this job) for this task instance."""
        context["ti"].xcom_push(key=self.xcom_key, value=url or "")

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        if getattr(operator, "app_handle", "") is None:
            return ""  # the task submitted no job (a dry run, an error before submit): no XCom to read
        from airflow.sdk.execution_time.xcom import XCom

        return str(XCom.get_value(ti_key=ti_key, key=self.xcom_key) or "")


class TorchXJobLink(_XComLink):
    """The job's page in its scheduler's UI (AWS Batch: the job in the Batch console)."""

    name = "TorchX Job"


class TorchXLogDirLink(_XComLink):
    """The ``file://`` directory holding a local job's replica logs."""

    name = "TorchX Logs"


def job_links(ui_url: str | None) -> list[tuple[_XComLink, str | None]]:
    """Which link gets the scheduler's ``ui_url``: a ``file://`` one (a local job's log
    directory) the logs link, any other the job page."""
    is_dir = bool(ui_url and ui_url.startswith("file://"))
    return [(TorchXJobLink(), None if is_dir else ui_url), (TorchXLogDirLink(), ui_url if is_dir else None)]
