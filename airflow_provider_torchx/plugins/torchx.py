"""``TorchXPlugin``, registered through the ``airflow.plugins`` entry point: the api-server
mounts its web app (``plugins/app.py``) under ``/torchx`` and the UI shows a "TorchX Jobs" entry
in the Browse menu and a "TorchX" tab on each task instance (the jobs of that task instance).
A mount serves the paths below its prefix only, so a root middleware sends the bare ``/torchx``
to ``/torchx/`` (``BarePrefixRedirect``).

Every Airflow process loads plugins, so this module is light: the web app, FastAPI and the job
listing are imported only when the api-server asks for ``fastapi_apps``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from functools import cached_property
from typing import Any

from airflow.plugins_manager import AirflowPlugin

from airflow_provider_torchx.reaper import listeners as reaper_listeners

#: Where the api-server mounts the app (the operator's job link points under it).
URL_PREFIX = "/torchx"


Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def bare_prefix_location(path: str, root_path: str, query: bytes) -> str | None:
    """Where a request for ``path`` (under ``root_path``, the api-server's own prefix) goes
    instead: ``torchx/`` with its query, relative, so it stays under whatever prefix the
    browser used, when ``path`` is the bare ``URL_PREFIX``; None for every other path."""
    if path.removeprefix(root_path) != URL_PREFIX:
        return None
    name = URL_PREFIX.rsplit("/", 1)[-1]
    return f"{name}/?{query.decode('latin-1')}" if query else f"{name}/"


class BarePrefixRedirect:
    """ASGI middleware of the api-server's root app: ``GET /torchx`` (or any method) answers
    307 to ``/torchx/`` (``bare_prefix_location``); every other request passes untouched."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        location = None
        if scope["type"] == "http":
            location = bare_prefix_location(scope["path"], scope.get("root_path", ""), scope.get("query_string", b""))
        if location is None:
            await self.app(scope, receive, send)
            return
        headers = [(b"location", location.encode("latin-1")), (b"content-length", b"0")]
        await send({"type": "http.response.start", "status": 307, "headers": headers})
        await send({"type": "http.response.body", "body": b""})


class TorchXPlugin(AirflowPlugin):
    """TorchX jobs in Airflow's UI."""

    name = "torchx"
    #: Cancels the jobs that outlive their task instance (``reaper/listeners.py``).
    listeners = [reaper_listeners]
    fastapi_root_middlewares = [{"middleware": BarePrefixRedirect, "name": "TorchX: /torchx to /torchx/"}]
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
        """The web app, built when the api-server first asks (only it does); from then on this
        process acts on the task and DAG run ends Airflow announces (``reaper/listeners.py``)."""
        from airflow_provider_torchx.plugins.app import create_app

        reaper_listeners.serve_announcements("api-server")
        return [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "TorchX jobs"}]
