"""Who may do what in the TorchX UI, decided by Airflow's auth manager exactly as Airflow's own
routes decide it (``docs/ui.md``, "Who may do what"), and which requests may change state.

Guarantees:
1. A job belongs to the DAG of its ``airflow.dag_id`` label, and the DAG to its bundle's team:
   one job is checked with ``is_authorized_dag(method, TASK_INSTANCE, DagDetails(id, team_name))``
   (what Airflow's task-instance routes pass), a list of jobs as Airflow's task-instance list
   decides: ``is_authorized_dag(method, TASK_INSTANCE)`` (task instances at all: FAB's
   "Task Instances" and "DAG Runs" rights), then one ``filter_authorized_dag_ids`` call per
   team, so any auth manager (Simple, FAB, Keycloak) decides as on Airflow's own pages.
2. A job without a DAG label, or labelled with a DAG the deployment does not have (deleted,
   or never parsed), is allowed only to a user with the right on every DAG of the deployment
   (and on DAGs in general): nobody whose rights stop at some DAGs or teams.
3. A state-changing request carrying only the login cookie (no ``Authorization`` header) is
   refused unless it is same-origin (``Origin``, else ``Sec-Fetch-Site``, against
   ``[api] base_url``) and has a JSON body: a form or a page of another origin cannot reach it,
   even on the same site.
"""

from __future__ import annotations

import functools
import inspect
from collections import defaultdict
from collections.abc import Iterable
from typing import Annotated, Any
from urllib.parse import urlsplit

from fastapi import Depends, HTTPException, Request

READ, EDIT = "GET", "PUT"
_RIGHTS = {READ: "read", EDIT: "edit"}


class LoginRequiredError(Exception):
    """An HTML page was asked for without a valid login."""


def auth_manager() -> Any:
    from airflow.api_fastapi.app import get_auth_manager

    return get_auth_manager()


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    return header[7:].strip() if header[:7].lower() == "bearer " else None


def _token(request: Request) -> str | None:
    """The JWT of the request: an ``Authorization: Bearer`` header (API clients) or the cookie
    Airflow's UI logs in with."""
    from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN

    cookie: str | None = request.cookies.get(COOKIE_NAME_JWT_TOKEN)
    return _bearer(request) or cookie


async def current_user(request: Request) -> Any:
    """The logged-in Airflow user (the auth manager decodes the token); 401 otherwise."""
    from jwt import InvalidTokenError

    token = _token(request)
    if not token:
        raise HTTPException(401, "not authenticated: log in to Airflow, or send 'Authorization: Bearer <token>'")
    try:
        user = auth_manager().get_user_from_token(token)
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
            raise LoginRequiredError() from None
        raise


User = Annotated[Any, Depends(current_user)]
PageUser = Annotated[Any, Depends(page_user)]


def dag_teams(dag_ids: Iterable[str]) -> dict[str, str | None]:
    """The team of each DAG (its bundle's; None outside multi-team mode or for an unknown DAG),
    in one query (Airflow 3.1, which has no batched form: one per DAG)."""
    from airflow.models.dag import DagModel

    wanted = sorted(set(dag_ids))
    if not wanted:
        return {}
    if hasattr(DagModel, "get_dag_id_to_team_name_mapping"):
        found = DagModel.get_dag_id_to_team_name_mapping(wanted)
        return {dag_id: found.get(dag_id) for dag_id in wanted}
    return {dag_id: DagModel.get_team_name(dag_id) for dag_id in wanted}


@functools.cache
def _filter_takes_team(manager_type: Any) -> bool:
    """Whether the auth manager's ``filter_authorized_dag_ids`` takes ``team_name`` (3.2+)."""
    return "team_name" in inspect.signature(manager_type.filter_authorized_dag_ids).parameters


def _all_dags_allowed(user: Any, method: str) -> bool:
    """Whether ``user`` has ``method`` rights on DAGs in general and on every DAG there is (the
    bar for a job that belongs to no DAG)."""
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    manager = auth_manager()
    if not manager.is_authorized_dag(method=method, access_entity=DagAccessEntity.TASK_INSTANCE, user=user):
        return False
    with create_session() as session:
        every = set(session.scalars(select(DagModel.dag_id)))
    return every <= set(manager.get_authorized_dag_ids(user=user, method=method))


def allowed(user: Any, dag_id: str | None, method: str) -> bool:
    """Whether ``user`` has ``method`` rights on the task instances of ``dag_id`` (None: a job
    of no DAG, guarantee 2)."""
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails

    if not dag_id or not _known_dags({dag_id}):
        return _all_dags_allowed(user, method)
    details = DagDetails(id=dag_id, team_name=dag_teams([dag_id])[dag_id])
    return bool(
        auth_manager().is_authorized_dag(
            method=method, access_entity=DagAccessEntity.TASK_INSTANCE, details=details, user=user
        )
    )


def allowed_dags(user: Any, dag_ids: Iterable[str | None], method: str) -> set[str | None]:
    """Which of ``dag_ids`` (None: jobs of no DAG) ``user`` may ``method``: one
    ``filter_authorized_dag_ids`` call per team (one in all on Airflow 3.1, whose list does
    the same), after the check that the user may ``method`` task instances at all."""
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity

    manager = auth_manager()
    if not manager.is_authorized_dag(method=method, access_entity=DagAccessEntity.TASK_INSTANCE, user=user):
        return set()
    wanted = set(dag_ids)
    named = _known_dags({d for d in wanted if d})
    unknown = {d for d in wanted if d not in named}  # no DAG, or one the deployment does not have
    ok: set[str | None] = set()
    if not _filter_takes_team(manager.__class__):
        ok |= set(manager.filter_authorized_dag_ids(dag_ids=named, user=user, method=method)) if named else set()
        named = set()
    by_team: dict[str | None, set[str]] = defaultdict(set)
    for dag_id, team in dag_teams(named).items():
        by_team[team].add(dag_id)
    for team, ids in by_team.items():
        ok |= set(manager.filter_authorized_dag_ids(dag_ids=ids, user=user, method=method, team_name=team))
    if unknown and _all_dags_allowed(user, method):
        ok |= unknown
    return ok


def _known_dags(dag_ids: set[str]) -> set[str]:
    """Those of ``dag_ids`` the deployment has (one query)."""
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    if not dag_ids:
        return set()
    with create_session() as session:
        return set(session.scalars(select(DagModel.dag_id).where(DagModel.dag_id.in_(sorted(dag_ids)))))


def require(user: Any, dag_id: str | None, method: str, what: str) -> None:
    """403 unless ``user`` has ``method`` rights on the task instances of ``dag_id``."""
    if not allowed(user, dag_id, method):
        dag = f"DAG {dag_id!r}" if dag_id else "every DAG (the job has no DAG)"
        raise HTTPException(
            403, f"{user.get_name()!r} may not {what}: needs {_RIGHTS[method]} rights on the task instances of {dag}"
        )


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()


def own_origin(request: Request) -> str:
    """The origin the UI is served from: ``[api] base_url``'s, else the request's own."""
    from airflow.configuration import conf

    base = conf.get("api", "base_url", fallback="") or ""
    return _origin(base) if base.startswith(("http://", "https://")) else _origin(str(request.base_url))


def require_intent(request: Request) -> None:
    """Guarantee 3: 403 naming why for a cookie-only request that is cross-origin or not JSON."""
    if _bearer(request):
        return  # a header no other page can make the browser send
    origin = request.headers.get("origin")
    ours = own_origin(request)
    if origin is not None:
        if origin.lower() != ours:
            raise HTTPException(403, f"refused: a request from origin {origin!r}, not {ours!r} (cross-origin)")
    elif request.headers.get("sec-fetch-site") != "same-origin":
        raise HTTPException(
            403, "refused: a cookie-only request without an Origin header or 'Sec-Fetch-Site: same-origin'"
        )
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        raise HTTPException(403, f"refused: the body must be JSON (Content-Type {kind or 'missing'!r})")
