"""Extra links of a TorchX task: the job's page in Airflow (the provider's plugin, every
scheduler) and, where the scheduler has one, its console (AWS Batch: the job in the AWS console).

The operator records each link's URL in XCom under the link's ``xcom_key`` as soon as the job is
submitted, so the buttons work while the job runs (the api-server reads that XCom). When the
task ends, Airflow's task runner asks ``get_link`` again and records the answer: the job page is
rebuilt from the operator's ``app_handle``; the console URL is read back from XCom. A task with
no job (a dry run, a failure before submitting) has no links, and nothing reads a missing XCom.
Only ``http(s)`` and same-site URLs are recorded: a ``file://`` one means nothing in a browser.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey

#: Where the provider's plugin (``plugins/torchx.py``) serves its pages on the api-server.
PLUGIN_PATH = "/torchx"


def job_page_url(app_handle: str, conn_id: str | None = None) -> str:
    """The job's page on the api-server, relative to the site (so Airflow's UI renders it as a
    same-site link), under ``[api] base_url``'s path when Airflow is served below a prefix."""
    from airflow_provider_torchx._compat import conf

    prefix = urlsplit(conf.get("api", "base_url", fallback="") or "").path.rstrip("/")
    url = f"{prefix}{PLUGIN_PATH}/job?handle={quote(app_handle, safe='')}"
    return url + (f"&conn_id={quote(conn_id, safe='')}" if conn_id else "")


def absolute_url(url: str) -> str:
    """``url`` as a full address: a same-site path (``job_page_url``) is put under ``[api]
    base_url``'s origin, as Airflow's Task SDK builds a task's log URL (the same fallback,
    ``http://localhost:8080/``), so a task log's line is a link from anywhere; an ``http(s)``
    URL is kept."""
    if not url.startswith("/") or url.startswith("//"):
        return url
    from airflow_provider_torchx._compat import conf

    base = urlsplit(conf.get("api", "base_url", fallback="") or "http://localhost:8080/")
    return f"{base.scheme or 'http'}://{base.netloc}{url}" if base.netloc else url


class _JobLink(BaseOperatorLink):
    """A link of the operator's current job (``operator.app_handle``)."""

    def persist(self, context: Any, url: str | None) -> None:
        """Record ``url`` (empty: no such link for this job) for this task instance."""
        context["ti"].xcom_push(key=self.xcom_key, value=url or "")


class TorchXJobLink(_JobLink):
    """The job's page in Airflow's UI: replicas, log tail, cancel."""

    name = "TorchX Job"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        handle = getattr(operator, "app_handle", None)
        return job_page_url(handle, getattr(operator, "torchx_conn_id", None)) if handle else ""


class TorchXConsoleLink(_JobLink):
    """The job in its scheduler's own console (AWS Batch: the AWS console)."""

    name = "AWS console"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        if not getattr(operator, "app_handle", None):
            return ""
        from airflow.sdk.execution_time.xcom import XCom

        return str(XCom.get_value(ti_key=ti_key, key=self.xcom_key) or "")


def job_links(app_handle: str, ui_url: str | None, conn_id: str | None) -> list[tuple[_JobLink, str | None]]:
    """Each link's URL for the job ``app_handle``: its page in Airflow, and the scheduler's
    ``ui_url`` as the console link when it is a web address (a local job's is a directory)."""
    console = ui_url if ui_url and ui_url.startswith(("https://", "http://")) else None
    return [(TorchXJobLink(), job_page_url(app_handle, conn_id)), (TorchXConsoleLink(), console)]
