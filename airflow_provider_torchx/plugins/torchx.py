"""``TorchXPlugin``, registered through the ``airflow.plugins`` entry point: the api-server
mounts its web app (``plugins/app.py``) under ``/torchx`` and the UI shows a "TorchX Jobs" entry
in the Browse menu and a "TorchX" tab on each task instance (the jobs of that task instance).

Every Airflow process loads plugins, so this module is light: the web app, FastAPI and the job
listing are imported only when the api-server asks for ``fastapi_apps``.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from airflow.plugins_manager import AirflowPlugin

from airflow_provider_torchx import reaper

#: Where the api-server mounts the app (the operator's job link points under it).
URL_PREFIX = "/torchx"


class TorchXPlugin(AirflowPlugin):
    """TorchX jobs in Airflow's UI."""

    name = "torchx"
    #: Cancels the jobs that outlive their task instance (``reaper.py``).
    listeners = [reaper]
    external_views = [
        {"name": "TorchX Jobs", "href": f"{URL_PREFIX}/", "url_route": "torchx", "category": "browse"},
        {
            "name": "TorchX",
            "href": f"{URL_PREFIX}/?dag_id={{DAG_ID}}&run_id={{RUN_ID}}&task_id={{TASK_ID}}",
            "url_route": "torchx_task",
            "destination": "task_instance",
        },
    ]

    @cached_property
    def fastapi_apps(self) -> list[dict[str, Any]]:  # type: ignore[override]
        """The web app, built when the api-server first asks (only it does)."""
        from airflow_provider_torchx.plugins.app import create_app

        return [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "TorchX jobs"}]
