"""The TorchX web app the api-server mounts under ``/torchx``: a jobs page, a job page and the
JSON API they read, behind Airflow's auth manager.

Who may do what follows the task instances the jobs belong to (their ``airflow.dag_id`` label
and the DAG's team): seeing a job or its log needs read access to the DAG's task instances,
cancelling it, or setting its task instance's checkpoints aside ("Start over"), edit access
(the rights that let a user mark the task failed), decided by ``access.py`` as Airflow's own
routes decide; a job of no DAG needs the right on every DAG.
Everything sent is masked (``secrets.py``); cancelling and starting over need a JSON body and,
with the cookie only, the same origin.

API guarantees:
1. Every answer is JSON; an error is ``{"detail": message}``: 401 without a valid token, 403
   without the rights (naming the user, the DAG and the right) or for a refused cookie-only
   request (naming why), 400 for a bad handle, role, replica, cursor or any malformed value
   (naming it), 404 for a job the scheduler does not know; never a traceback. Anything else
   is a 500 that, as Airflow's own routes answer, says nothing of the error (a database
   error's text names the database's host and port) and gives the ID under which the
   api-server logged it (``jobs.internal_error``).
2. ``GET api/jobs`` lists what the user may read, one page at a time (newest first, ``next``
   the cursor of the following page), with ``errors`` per unreachable source that could hold
   jobs asked for (``jobs.errors_that_matter``) and the server's ``now`` (the pages' clock for
   the durations of running jobs). ``GET api/ladder`` lists the other jobs a ladder job's
   capacity ladder submitted for its task instance (every rung), oldest first, with their rung.
3. ``GET api/log`` returns one page of a replica's log after the given cursor and the cursor to
   continue from, so a page polling it shows each line once.
4. ``POST api/cancel`` asks the scheduler to stop the job (idempotent) and returns its state.
5. ``POST api/start-over`` sets the checkpoints of the job's task instance aside (renamed
   beside them, kept) and returns where they went (``set_aside_to``; None: nothing was
   there), with the rights and the same-origin rule of a cancel; 409 while a job still uses
   them, 400 for a job without a checkpoint location or one whose location is not on the
   api-server's host.
"""

from __future__ import annotations

import logging
import secrets as _random
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from pydantic import BaseModel

from airflow_provider_torchx.cancels import ui_cancel_reason
from airflow_provider_torchx.core import checkpoints
from airflow_provider_torchx.core.errors import (
    CancelDeliveredError,
    CancelNotRecordedError,
    CorruptEntryError,
    SchedulerSetupError,
    UnknownAppError,
    shown,
)
from airflow_provider_torchx.core.schedulers.api import CancelledBy
from airflow_provider_torchx.core.specs import AppState, parse_app_handle
from airflow_provider_torchx.plugins import access, jobs
from airflow_provider_torchx.plugins.access import EDIT, READ, PageUser, User
from airflow_provider_torchx.plugins.secrets import Masker, job_secrets
from airflow_provider_torchx.sources import runner_for

log = logging.getLogger(__name__)

#: What the pages may load and who may frame them (Airflow's own task tab does, same origin).
_CSP = (
    "default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; connect-src 'self'; "
    "img-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'self'"
)
#: Sent with every answer: no MIME sniffing, no framing by another origin.
_HEADERS = {"X-Content-Type-Options": "nosniff", "X-Frame-Options": "SAMEORIGIN", "Referrer-Policy": "same-origin"}


class JobRequest(BaseModel):
    """The body of ``POST api/cancel`` and ``POST api/start-over``."""

    handle: str
    conn_id: str | None = None


def _job(user: Any, handle: str, conn_id: str | None, method: str, what: str) -> tuple[Any, Any, Masker]:
    """``(runner, describe response, masker of its secrets)`` of the job ``handle``, checked
    for ``user``. A scheduler this api-server is not set up for (an AWS region or credentials
    missing) is a 400 naming the handle and what to set."""
    runner = runner_for(handle, conn_id)
    try:
        desc = jobs.describe(runner, handle)
    except SchedulerSetupError as err:
        raise HTTPException(400, f"handle: {shown(handle)}: the api-server cannot reach it: {err}") from None
    access.require(user, desc.labels.get(jobs.IDENTITY_LABELS["dag_id"]), method, what)
    return runner, desc, Masker(job_secrets(desc.roles))


def _page() -> HTMLResponse:
    nonce = _random.token_urlsafe(16)
    html = resources.files(__package__).joinpath("page.html").read_text(encoding="utf-8")
    html = html.replace("<script>", f'<script nonce="{nonce}">').replace("<style>", f'<style nonce="{nonce}">')
    return HTMLResponse(
        html, headers={"Cache-Control": "no-store", "Content-Security-Policy": _CSP.format(nonce=nonce)}
    )


def _masked_error(status: int, detail: str) -> JSONResponse:
    """The error answer ``{"detail": detail}``, masked; a 500 saying nothing of the error
    (``jobs.internal_error``) when the secrets to mask cannot be read (the database is down)."""
    try:
        masked = Masker().text(detail)
    except Exception as e:
        return _internal_error(e, f"masking a {status} answer")
    return JSONResponse({"detail": masked}, status_code=status)


def _internal_error(exc: BaseException, what: str) -> JSONResponse:
    """A 500 naming only the ID under which ``exc`` was logged (nothing in it to mask)."""
    return JSONResponse({"detail": jobs.internal_error(exc, what)}, status_code=500)


def _validation_message(exc: RequestValidationError) -> str:
    """One line per bad value: where it is, what was given and what is allowed."""
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err.get("loc", ()) if p not in ("query", "body"))
        given = f"{err['input']!r}: " if err.get("input") is not None and err.get("type") != "missing" else ""
        kind = "body" if err.get("loc", ("",))[0] == "body" else "query parameter"
        parts.append(f"{kind} {where or 'body'!r}: {given}{err.get('msg', 'invalid')}")
    return "; ".join(parts)


def create_app() -> FastAPI:
    """The app the plugin registers (mounted by the api-server under ``/torchx``). No
    ``openapi.json``: the API is described in ``docs/ui.md``, not served to anyone."""
    app = FastAPI(title="TorchX jobs", description=__doc__, docs_url=None, redoc_url=None, openapi_url=None)

    @app.middleware("http")
    async def security_headers(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        response = await call_next(request)
        for name, value in _HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    @app.exception_handler(access.LoginRequiredError)
    async def login(request: Request, exc: access.LoginRequiredError) -> Response:
        return RedirectResponse(_login_url(str(request.url)))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        return _masked_error(exc.status_code, str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> Response:
        return _masked_error(400, _validation_message(exc))

    @app.exception_handler(UnknownAppError)
    async def unknown_job(request: Request, exc: UnknownAppError) -> Response:
        return _masked_error(404, str(exc))

    @app.exception_handler(ValueError)
    async def bad_input(request: Request, exc: ValueError) -> Response:
        return _masked_error(400, str(exc))

    @app.exception_handler(Exception)
    async def failure(request: Request, exc: Exception) -> Response:
        return _internal_error(exc, f"{request.method} {request.url.path}")

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
        limit: Annotated[int, Query(ge=1, le=jobs.MAX_PAGE)] = jobs.DEFAULT_PAGE,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        """One page (newest first) of the jobs the host can see that the user may read,
        filtered by identity and state; ``next`` is the cursor of the following page."""
        found = jobs.list_jobs({"dag_id": dag_id, "task_id": task_id, "run_id": run_id, "state": state})
        dag_label = jobs.IDENTITY_LABELS["dag_id"]
        readable = access.allowed_dags(user, {row.labels.get(dag_label) for row in found.jobs}, READ)
        rows = [row for row in found.jobs if row.labels.get(dag_label) in readable]
        page, after = jobs.page_after(rows, cursor, limit)
        errors = jobs.errors_that_matter({"dag_id": dag_id, "task_id": task_id, "run_id": run_id}, rows, found.errors)
        listed = {"jobs": [row.as_json() for row in page], "next": after, "errors": errors, "now": time.time()}
        return Masker().tree(listed)

    @app.get("/api/job")
    def get_job(user: User, handle: Annotated[str, Query()], conn_id: str | None = None) -> dict[str, Any]:
        """One job: state, failure reason, roles, replicas, console URL."""
        runner, desc, masker = _job(user, handle, conn_id, READ, "see this job")
        details = jobs.job_details(handle, conn_id, desc, jobs.root_cause(runner, handle, desc))
        details["can_cancel"] = access.allowed(user, details["dag_id"], EDIT)
        details["now"] = time.time()
        return masker.tree(details)

    @app.get("/api/ladder")
    def get_ladder(user: User, handle: Annotated[str, Query()], conn_id: str | None = None) -> dict[str, Any]:
        """The other jobs the capacity ladder of job ``handle`` submitted for its task instance
        (``jobs.ladder_jobs``), asked once by the job page, never on its polls."""
        _, desc, masker = _job(user, handle, conn_id, READ, "see this job")
        return masker.tree({"jobs": jobs.ladder_jobs(handle, desc.labels)})

    @app.get("/api/log")
    def get_log(
        user: User,
        handle: Annotated[str, Query()],
        role: Annotated[str, Query()],
        replica: Annotated[int, Query(ge=0)] = 0,
        cursor: str | None = None,
        conn_id: str | None = None,
    ) -> dict[str, Any]:
        """One page of replica ``replica`` of ``role``'s log after ``cursor``."""
        runner, _, masker = _job(user, handle, conn_id, READ, "read this job's log")
        chunk = jobs.read_log(runner, handle, role, replica, cursor)
        return chunk | {"lines": masker.lines(chunk["lines"])}

    @app.post("/api/cancel", status_code=202, dependencies=[Depends(access.require_intent)])
    def cancel(user: User, body: JobRequest) -> dict[str, Any]:
        """Ask the scheduler to stop the job; it ends CANCELLED (the task fails)."""
        try:
            runner, desc, _ = _job(user, body.handle, body.conn_id, EDIT, "cancel this job")
        except CorruptEntryError:
            return _cancel_refused(user, body)
        answer = {"handle": body.handle, "state": desc.state.name, "cancel_requested": not desc.state.is_terminal()}
        if not desc.state.is_terminal():
            log.info("TorchX UI: %s cancels %s", user.get_name(), body.handle)
            try:
                runner.cancel(body.handle, reason=ui_cancel_reason(user.get_name()), by=CancelledBy.USER)
            except CancelNotRecordedError as err:  # delivered all the same
                answer["msg"] = str(err)
        return answer

    @app.post("/api/start-over", dependencies=[Depends(access.require_intent)])
    def start_over(user: User, body: JobRequest) -> dict[str, Any]:
        """Set the checkpoints of the ended job's task instance aside (renamed beside them, kept:
        ``checkpoints.set_aside_unused``), so that its next job starts over."""
        runner, desc, masker = _job(user, body.handle, body.conn_id, EDIT, "start this task instance over")
        location = desc.checkpoint_dir
        if location is None:
            raise HTTPException(
                400, f"handle: {shown(body.handle)} was given no TORCHX_CHECKPOINT_DIR: nothing to set aside"
            )
        scheduler = parse_app_handle(body.handle).scheduler_backend
        if not runner.capabilities(scheduler).host_bound:
            raise HTTPException(
                400,
                f"the checkpoints of a {scheduler} job ({location}) are not on the api-server's host: "
                "move them aside with the storage's own tools",
            )
        try:
            names, failed = runner.pruning_schedulers()
            for name, err in failed.items():
                log.warning("TorchX UI: start over: scheduler %s left out, it failed to load: %s", name, err)
            uses = runner.checkpoint_uses(names).get(location, [])
            moved = checkpoints.set_aside_unused(location, time.time(), uses)
        except checkpoints.CheckpointsInUseError as err:
            raise HTTPException(409, str(err)) from None
        log.info("TorchX UI: %s set aside %s -> %s (kept)", user.get_name(), location, moved)
        return masker.tree({"handle": body.handle, "checkpoint_dir": location, "set_aside_to": moved})

    return app


def _cancel_refused(user: Any, body: JobRequest) -> dict[str, Any]:
    """Cancel a job one of whose files is refused (it cannot be described): allowed as for the
    DAG its record names when the record can be read, else only with the right on every DAG.
    The scheduler reaches the job's supervisor without that file (202, ``msg`` naming the
    refused file) or raises the refusal (400: no supervisor runs; ``delete`` removes it)."""
    runner = runner_for(body.handle, body.conn_id)
    try:
        native = runner.describe_native(body.handle)
    except CorruptEntryError:
        native = None
    dag_id = native.labels.get(jobs.IDENTITY_LABELS["dag_id"]) if native is not None else None
    access.require(user, dag_id, EDIT, "cancel this job")
    log.info("TorchX UI: %s cancels %s (a file of the job is refused)", user.get_name(), body.handle)
    answer = {"handle": body.handle, "state": AppState.UNKNOWN.name, "cancel_requested": True}
    try:
        runner.cancel(body.handle, reason=ui_cancel_reason(user.get_name()), by=CancelledBy.USER)
    except CancelDeliveredError as err:
        answer["msg"] = str(err)
    return answer


def _login_url(next_url: str) -> str:
    """Airflow's login page, coming back to ``next_url``."""
    try:
        url: str = access.auth_manager().get_url_login(next_url=next_url)
    except TypeError:  # an auth manager without next_url
        url = access.auth_manager().get_url_login()
    return url
