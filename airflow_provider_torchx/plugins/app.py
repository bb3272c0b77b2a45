"""The TorchX web app the api-server mounts under ``/torchx``: a jobs page, a job page and the
JSON API they read, behind Airflow's auth manager.

Who may do what follows the task instances the jobs belong to (their ``airflow.dag_id`` label):
seeing a job or its log needs read access to the DAG's task instances, cancelling it edit
access (the rights that let a user mark the task failed). A job started outside Airflow (no DAG
label) is checked against DAGs in general.

API guarantees:
1. Every answer is JSON; an error is ``{"detail": message}``: 401 without a valid token, 403
   without the rights (naming the user, the DAG and the right), 400 for a bad handle, role,
   replica or cursor (naming it), 404 for a job the scheduler does not know; never a traceback.
2. ``GET api/jobs`` lists what the user may read, with ``errors`` per unreachable source.
3. ``GET api/log`` returns one page of a replica's log after the given cursor and the cursor to
   continue from, so a page polling it shows each line once.
4. ``POST api/cancel`` asks the scheduler to stop the job (idempotent) and returns its state.
"""

from __future__ import annotations

import inspect
import logging
from importlib import resources
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from airflow_provider_torchx.cancels import ui_cancel_reason
from airflow_provider_torchx.core.errors import UnknownAppError
from airflow_provider_torchx.plugins import jobs

log = logging.getLogger(__name__)

_READ, _EDIT = "GET", "PUT"
_RIGHTS = {_READ: "read", _EDIT: "edit"}


class _LoginRequiredError(Exception):
    """An HTML page was asked for without a valid login."""


def _auth_manager() -> Any:
    from airflow.api_fastapi.app import get_auth_manager

    return get_auth_manager()


def _token(request: Request) -> str | None:
    """The JWT of the request: an ``Authorization: Bearer`` header (API clients) or the cookie
    Airflow's UI logs in with."""
    from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN

    header = request.headers.get("authorization", "")
    if header[:7].lower() == "bearer ":
        return header[7:].strip()
    cookie: str | None = request.cookies.get(COOKIE_NAME_JWT_TOKEN)
    return cookie


async def current_user(request: Request) -> Any:
    """The logged-in Airflow user (the auth manager decodes the token); 401 otherwise."""
    from jwt import InvalidTokenError

    token = _token(request)
    if not token:
        raise HTTPException(401, "not authenticated: log in to Airflow, or send 'Authorization: Bearer <token>'")
    try:
        user = _auth_manager().get_user_from_token(token)
        if inspect.isawaitable(user):
            user = await user
    except InvalidTokenError as err:
        raise HTTPException(401, f"not authenticated: the token is invalid or expired ({err})") from None
    return user


async def page_user(request: Request) -> Any:
    """``current_user`` for the HTML pages: without a login, redirect to Airflow's."""
    try:
        return await current_user(request)
    except HTTPException as err:
        if err.status_code == 401:
            raise _LoginRequiredError() from None
        raise


User = Annotated[Any, Depends(current_user)]
PageUser = Annotated[Any, Depends(page_user)]


def _allowed(user: Any, dag_id: str | None, method: str) -> bool:
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails

    return bool(
        _auth_manager().is_authorized_dag(
            method=method, access_entity=DagAccessEntity.TASK_INSTANCE, details=DagDetails(id=dag_id), user=user
        )
    )


def _require(user: Any, dag_id: str | None, method: str, what: str) -> None:
    """403 unless ``user`` has ``method`` rights on the task instances of ``dag_id``."""
    if not _allowed(user, dag_id, method):
        dag = f"DAG {dag_id!r}" if dag_id else "DAGs (the job has no DAG)"
        raise HTTPException(
            403, f"{user.get_name()!r} may not {what}: needs {_RIGHTS[method]} rights on the task instances of {dag}"
        )


def _job(user: Any, handle: str, conn_id: str | None, method: str, what: str) -> tuple[Any, Any]:
    """``(runner, describe response)`` of the job ``handle``, checked for ``user``."""
    runner = jobs.runner_for(handle, conn_id)
    desc = jobs.describe(runner, handle)
    _require(user, desc.labels.get(jobs.IDENTITY_LABELS["dag_id"]), method, what)
    return runner, desc


def _page() -> HTMLResponse:
    html = resources.files(__package__).joinpath("page.html").read_text(encoding="utf-8")
    return HTMLResponse(html, headers={"Cache-Control": "no-store"})


def create_app() -> FastAPI:
    """The app the plugin registers (mounted by the api-server under ``/torchx``)."""
    app = FastAPI(title="TorchX jobs", description=__doc__, docs_url=None, redoc_url=None)

    @app.exception_handler(_LoginRequiredError)
    async def login(request: Request, exc: _LoginRequiredError) -> Response:
        return RedirectResponse(_login_url(str(request.url)))

    @app.exception_handler(UnknownAppError)
    async def unknown_job(request: Request, exc: UnknownAppError) -> Response:
        return JSONResponse({"detail": str(exc)}, status_code=404)

    @app.exception_handler(ValueError)
    async def bad_input(request: Request, exc: ValueError) -> Response:
        return JSONResponse({"detail": str(exc)}, status_code=400)

    @app.exception_handler(Exception)
    async def failure(request: Request, exc: Exception) -> Response:
        log.exception("TorchX UI: %s %s failed", request.method, request.url.path)
        return JSONResponse({"detail": f"{type(exc).__name__}: {exc}"}, status_code=500)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def jobs_page(user: PageUser) -> HTMLResponse:
        return _page()

    @app.get("/job", response_class=HTMLResponse, include_in_schema=False)
    def job_page(user: PageUser) -> HTMLResponse:
        return _page()

    @app.get("/api/jobs")
    def list_jobs(
        user: User,
        dag_id: str | None = None,
        task_id: str | None = None,
        run_id: str | None = None,
        state: str | None = None,
    ) -> dict[str, Any]:
        """The jobs the host can see that the user may read, filtered by identity and state."""
        found = jobs.list_jobs({"dag_id": dag_id, "task_id": task_id, "run_id": run_id, "state": state})
        readable: dict[str | None, bool] = {}
        rows = []
        for row in found.jobs:
            dag = row.labels.get(jobs.IDENTITY_LABELS["dag_id"])
            if dag not in readable:
                readable[dag] = _allowed(user, dag, _READ)
            if readable[dag]:
                rows.append(row.as_json())
        return {"jobs": rows, "errors": found.errors}

    @app.get("/api/job")
    def get_job(user: User, handle: Annotated[str, Query()], conn_id: str | None = None) -> dict[str, Any]:
        """One job: state, failure reason, roles, replicas, console URL."""
        _, desc = _job(user, handle, conn_id, _READ, "see this job")
        details = jobs.job_details(handle, conn_id, desc)
        details["can_cancel"] = _allowed(user, details["dag_id"], _EDIT)
        return details

    @app.get("/api/log")
    def get_log(
        user: User,
        handle: Annotated[str, Query()],
        role: Annotated[str, Query()],
        replica: int = 0,
        cursor: str | None = None,
        conn_id: str | None = None,
    ) -> dict[str, Any]:
        """One page of replica ``replica`` of ``role``'s log after ``cursor``."""
        runner, _ = _job(user, handle, conn_id, _READ, "read this job's log")
        return jobs.read_log(runner, handle, role, replica, cursor)

    @app.post("/api/cancel", status_code=202)
    def cancel(user: User, handle: Annotated[str, Query()], conn_id: str | None = None) -> dict[str, Any]:
        """Ask the scheduler to stop the job; it ends CANCELLED (the task fails)."""
        runner, desc = _job(user, handle, conn_id, _EDIT, "cancel this job")
        if not desc.state.is_terminal():
            log.info("TorchX UI: %s cancels %s", user.get_name(), handle)
            runner.cancel(handle, reason=ui_cancel_reason(user.get_name()))
        return {"handle": handle, "state": desc.state.name, "cancel_requested": not desc.state.is_terminal()}

    return app


def _login_url(next_url: str) -> str:
    """Airflow's login page, coming back to ``next_url``."""
    try:
        url: str = _auth_manager().get_url_login(next_url=next_url)
    except TypeError:  # an auth manager without next_url
        url = _auth_manager().get_url_login()
    return url
