"""What the TorchX UI shows, independent of the web framework: the jobs the api-server's host can
see, one job in detail, a replica's log page and cancelling.

Jobs come from the deployment's job sources (``sources.py``: the host-bound schedulers' job
store and every ``torchx`` connection of another scheduler), runners too (``sources.runner_for``).

Guarantees:
1. ``list_jobs`` never raises for one unreachable source: its error is returned beside the jobs
   of the others.
2. A bad handle raises ``MalformedAppHandleError``/``UnknownSchedulerError`` (``ValueError``), an
   unknown job ``UnknownAppError``; the messages name the handle.
3. No ``file://`` URL leaves this module (a local job's log directory means nothing in a
   browser on another machine).
4. Listing costs the same with one open page or many: one listing per filters answers every
   caller and is renewed in the background (``list_jobs``), and a local store's ended jobs
   are read from its index (``core/schedulers/local/store.py``).
"""

from __future__ import annotations

import base64
import binascii
import collections
import functools
import json
import logging
import math
import secrets
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_torchx.core import jobviews
from airflow_provider_torchx.core.clock import SYSTEM_CLOCK, Clock
from airflow_provider_torchx.core.errorfile import RootCause, find_root_cause
from airflow_provider_torchx.core.errors import UnknownAppError, shown
from airflow_provider_torchx.core.failures import classify
from airflow_provider_torchx.core.identity import DAG_ID, MAP_INDEX, RUN_ID, TASK_ID, TaskIdentity
from airflow_provider_torchx.core.rates import rates_of
from airflow_provider_torchx.core.runner import Runner
from airflow_provider_torchx.core.schedulers.api import DescribeAppResponse, cursor_object
from airflow_provider_torchx.core.specs import AppState, Role, parse_app_handle
from airflow_provider_torchx.core.usage import Usage
from airflow_provider_torchx.ladder import RUNG_LABEL
from airflow_provider_torchx.links.torchx import job_page_url
from airflow_provider_torchx.sources import runner_for, source_listings, torchx_connection_ids

log = logging.getLogger(__name__)

#: Identity labels the operator puts on each job (``core/identity.py``), by the UI's filter names.
IDENTITY_LABELS = {"dag_id": DAG_ID, "task_id": TASK_ID, "run_id": RUN_ID}
#: At most this many lines per log request (the page asks again with the cursor).
LOG_PAGE_LINES = 1000
#: Jobs per page of the list: by default, and at most.
DEFAULT_PAGE, MAX_PAGE = 100, 1000
#: How long one listing answers every page asking with the same filters before it is renewed
#: (in the background), and how long one nobody asks for is kept.
LIST_REUSE_S, LIST_FORGET_S = 2.0, 60.0
#: The scheduler (AWS Batch's name) whose ended jobs are priced at AWS's own prices without rates.
AWS_PRICED_SCHEDULER = "aws_batch"
_LIST_LOCK = threading.Lock()
_LISTED: dict[Any, _Listing] = {}


@dataclass
class JobRow:
    """One job in the list."""

    handle: str
    scheduler: str
    name: str
    state: str
    conn_id: str | None
    labels: dict[str, str] = field(default_factory=dict)
    #: Why the job outlived its task instance (it is cancelled soon, or never when
    #: ``[torchx] cancel_orphaned_jobs`` is off); None: it did not.
    orphaned: str | None = None
    #: When the job was submitted (epoch seconds; None: unknown): the list's order.
    created: float | None = None
    #: When it started running and when it ended (epoch seconds; None: not yet, or unknown).
    started: float | None = None
    ended: float | None = None
    #: The scheduler's description the row prices its job from (``cost_usd``), once read.
    priced: DescribeAppResponse | None = field(default=None, repr=False)
    priced_read: bool = field(default=False, repr=False)

    def as_json(self) -> dict[str, Any]:
        identity = {key: self.labels.get(label) for key, label in IDENTITY_LABELS.items()}
        return {
            "handle": self.handle,
            "app_id": parse_app_handle(self.handle).app_id,
            "scheduler": self.scheduler,
            "name": self.name,
            "state": self.state,
            "conn_id": self.conn_id,
            **identity,
            "map_index": self.labels.get(MAP_INDEX),
            "created": self.created,
            "started": self.started,
            "ended": self.ended,
            "url": _job_page_url(self.handle, self.conn_id),
            "orphaned": self.orphaned,
            "cost_usd": self.cost_usd(SYSTEM_CLOCK.wall()),
        }

    def cost_usd(self, now: float) -> float | None:
        """What the job cost, as its page says (``jobviews.cost_usd``: so far while it runs), for
        a job that carries rates (``core/rates.py``) or an ended AWS Batch job (AWS's own prices,
        each attempt priced once: ``aws_batch/pricing.py``); None for others, or one that cannot
        be described now (the list goes on without its cost). Its description is read once,
        when a page first shows the row (a listing's other rows cost nothing), and kept while
        the job's state and start stay the same (``_list_jobs``)."""
        aws_priced = self.scheduler == AWS_PRICED_SCHEDULER and AppState[self.state].is_terminal()
        if rates_of(self.labels) is None and not aws_priced:
            return None
        if not self.priced_read:
            try:
                self.priced = runner_for(self.handle, self.conn_id).describe_app(self.handle)
            except Exception as err:  # blank this time; the next look tries again
                log.warning("TorchX UI: cannot price %s: %s", self.handle, err)
                return None
            self.priced_read = True
        return jobviews.cost_usd(self.priced, now) if self.priced is not None else None


#: The job page's URL of a handle (reads ``[api] base_url``, which does not change in a process).
_job_page_url = functools.lru_cache(maxsize=65536)(job_page_url)


@dataclass
class JobList:
    """The jobs found and, per source that failed, why."""

    jobs: list[JobRow]
    errors: dict[str, str]
    #: Each row by handle with the scheduler's answer it was made from: the next listing
    #: reuses the row of an answer it gets again (the local scheduler hands out the same
    #: answer for an ended job each time; such answers never change).
    made_from: dict[str, tuple[Any, JobRow]] = field(default_factory=dict, repr=False)


def list_jobs(filters: Mapping[str, str | None], clock: Clock = SYSTEM_CLOCK) -> JobList:
    """Every job the host can see whose identity labels match ``filters`` (``dag_id``,
    ``task_id``, ``run_id``; empty values ignored) and whose state is ``filters["state"]`` if
    given; newest first (by submission time, then handle). A connection of a host-bound
    scheduler adds nothing (its jobs are listed once, without it).

    One listing serves every caller with the same filters and connections (pages poll every
    5 s): younger than ``LIST_REUSE_S`` it is the answer; older, it is still the answer while
    one background thread lists again, so no caller waits for a walk of the store but the
    first (guarantee 4). A listing nobody asked for in ``LIST_FORGET_S`` is dropped. Ages
    are counted on ``clock``'s monotonic time."""
    connections = tuple(torchx_connection_ids())
    key = (tuple(sorted((k, v or "") for k, v in filters.items())), connections)
    with _LIST_LOCK:
        now = clock.monotonic()
        for stale in [k for k, entry in _LISTED.items() if now - entry.asked >= LIST_FORGET_S]:
            del _LISTED[stale]
        entry = _LISTED.get(key)
        if entry is not None:
            entry.asked = now
            if now - entry.at >= LIST_REUSE_S and not entry.refreshing:
                entry.refreshing = True
                threading.Thread(target=_refresh, args=(key, filters, connections, clock), daemon=True).start()
            return entry.found
    found = _list_jobs(filters, connections, None)
    with _LIST_LOCK:
        now = clock.monotonic()
        _LISTED[key] = _Listing(found, now, now)
    return found


@dataclass
class _Listing:
    found: JobList
    at: float
    asked: float
    refreshing: bool = False


def _refresh(key: Any, filters: Mapping[str, str | None], connections: tuple[str, ...], clock: Clock) -> None:
    with _LIST_LOCK:
        previous = _LISTED[key].found if key in _LISTED else None
    try:
        found = _list_jobs(dict(filters), connections, previous)
    except Exception:  # the old listing stays; the next caller tries again
        log.exception("TorchX UI: listing the jobs failed")
        with _LIST_LOCK:
            if key in _LISTED:
                _LISTED[key].refreshing = False
        return
    with _LIST_LOCK:
        now = clock.monotonic()
        asked = _LISTED[key].asked if key in _LISTED else now
        _LISTED[key] = _Listing(found, now, asked)


def _list_jobs(filters: Mapping[str, str | None], connections: tuple[str, ...], previous: JobList | None) -> JobList:
    want = {label: filters[key] for key, label in IDENTITY_LABELS.items() if filters.get(key)}
    state = (filters.get("state") or "").upper()
    rows: dict[str, JobRow] = {}
    made_from: dict[str, tuple[Any, JobRow]] = {}
    reusable = previous.made_from if previous is not None else {}
    errors: dict[str, str] = {}
    for conn_id, scheduler, apps in source_listings(connections):
        if isinstance(apps, Exception):
            errors[conn_id or "local job store"] = f"{type(apps).__name__}: {apps}"
            continue
        for app in reversed(apps):
            if app.app_handle in rows:
                continue
            if any(app.labels.get(k) != v for k, v in want.items()) or (state and app.state.name != state):
                continue
            kept = reusable.get(app.app_handle)
            if kept is not None and kept[0] is app:
                row = kept[1]
            else:
                labels = dict(app.labels)
                row = JobRow(
                    app.app_handle,
                    scheduler,
                    app.name,
                    app.state.name,
                    conn_id,
                    labels,
                    created=epoch(app.created),
                    started=epoch(app.started),
                    ended=epoch(app.ended),
                )
                if kept is not None and (kept[1].state, kept[1].started) == (row.state, row.started):
                    row.priced, row.priced_read = kept[1].priced, kept[1].priced_read  # its cost so far grows
            rows[app.app_handle] = row
            made_from[app.app_handle] = (app, row)
    listed = sorted(rows.values(), key=sort_key, reverse=True)
    mark_orphans(listed)
    return JobList(listed, errors, made_from)


def internal_error(exc: BaseException, what: str) -> str:
    """Log ``exc`` (raised while doing ``what``) with its traceback under a new lookup ID and
    return what a user is told: Airflow's own generic answer naming that ID, without the
    exception's text (a database error's names the database's host and port)."""
    lookup = secrets.token_hex(8)
    log.error("TorchX UI: %s failed; error ID %s", what, lookup, exc_info=exc)
    return (
        "Serious error when handling your request. Check logs for more details - "
        f"you will find it in api server when you look for ID {lookup}"
    )


def epoch(value: Any) -> float | None:
    """``value`` if it is a finite number of epoch seconds, else None (what a page can show)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def errors_that_matter(filters: Mapping[str, str | None], rows: list[JobRow], errors: dict[str, str]) -> dict[str, str]:
    """The listing ``errors`` (per source that could not be listed) worth showing beside
    ``rows``, the jobs found for ``filters``: all of them, unless the filters name one task
    instance (DAG, task and run) and its jobs were found (in a source that could be listed: a
    task instance's jobs come from its one connection, so the others' errors do not hide any
    of them, and a local task's TorchX tab shows no AWS error)."""
    one_task = all(filters.get(key) for key in IDENTITY_LABELS)
    return {} if one_task and rows else dict(errors)


def sort_key(row: JobRow) -> tuple[float, str]:
    """Where ``row`` stands in the list (descending)."""
    return (row.created or 0.0, row.handle)


def page_after(rows: list[JobRow], cursor: str | None, limit: int) -> tuple[list[JobRow], str | None]:
    """The ``limit`` rows after ``cursor`` (None: from the newest) of ``rows`` (sorted newest
    first) and the cursor of the next page (None: this was the last). A cursor that is not one
    this function returned raises ``ValueError`` naming it."""
    start = 0
    if cursor:
        try:
            data = cursor_object(base64.urlsafe_b64decode(cursor.encode() + b"=" * (-len(cursor) % 4)))
            key = (float(data["created"]), str(data["handle"]))
            if not math.isfinite(key[0]):
                raise ValueError("not finite")
        except (ValueError, TypeError, KeyError, binascii.Error):
            raise ValueError(f"cursor: {shown(cursor)} is not a cursor api/jobs returned") from None
        start = next((i for i, row in enumerate(rows) if sort_key(row) < key), len(rows))
    page = rows[start : start + limit]
    if start + limit >= len(rows):
        return page, None
    last = sort_key(page[-1])
    token = json.dumps({"created": last[0], "handle": last[1]}).encode()
    return page, base64.urlsafe_b64encode(token).decode().rstrip("=")


def mark_orphans(rows: list[JobRow]) -> None:
    """Set ``orphaned`` on the live rows whose task instance ended (``reaper/decisions.py``, ``orphans_among``)."""
    from airflow_provider_torchx.reaper.decisions import orphans_among
    from airflow_provider_torchx.reaper.listing import LiveJob

    live = [
        LiveJob(r.handle, r.scheduler, r.conn_id, AppState[r.state], r.labels, r.created)
        for r in rows
        if not AppState[r.state].is_terminal() and TaskIdentity.from_labels(r.labels) is not None
    ]
    found = orphans_among(live) if live else {}
    for row in rows:
        row.orphaned = found.get(row.handle)


def describe(runner: Runner, app_handle: str) -> DescribeAppResponse:
    """The scheduler's view of the job; ``UnknownAppError`` when it has none."""
    desc = runner.describe_app(app_handle)
    if desc is None:
        raise UnknownAppError(f"handle: no job {app_handle!r} (the scheduler does not know it, or it was deleted)")
    return desc


#: The root causes found of ended jobs, by handle (an ended job's files no longer change), the
#: newest ``ROOT_CAUSES_KEPT``: a job page opened again does not read the logs again.
ROOT_CAUSES_KEPT = 256
_ROOT_CAUSES: collections.OrderedDict[str, RootCause | None] = collections.OrderedDict()
_ROOT_CAUSES_LOCK = threading.Lock()


def root_cause(runner: Runner, app_handle: str, desc: DescribeAppResponse) -> RootCause | None:
    """The root cause of a FAILED job (``core/errorfile.py``: the failing rank's error, as the
    task's failure message and the CLI's ``describe`` show it); None for any other state or
    when there is none to tell. Found once per ended job (kept by handle)."""
    if desc.state != AppState.FAILED:
        return None
    with _ROOT_CAUSES_LOCK:
        if app_handle in _ROOT_CAUSES:
            _ROOT_CAUSES.move_to_end(app_handle)
            return _ROOT_CAUSES[app_handle]
    status = runner.status(app_handle)  # the runner's view of the same answer (an ended job's)
    found = find_root_cause(runner, app_handle, status) if status is not None else None
    with _ROOT_CAUSES_LOCK:
        _ROOT_CAUSES[app_handle] = found
        while len(_ROOT_CAUSES) > ROOT_CAUSES_KEPT:
            _ROOT_CAUSES.popitem(last=False)
    return found


def job_details(
    app_handle: str, conn_id: str | None, desc: DescribeAppResponse, cause: RootCause | None = None
) -> dict[str, Any]:
    """The job page's data: state, failure reason, kind and root cause (``cause``), when it was
    submitted, started and ended, its usage once ended, roles with their resources (devices
    asked) and replicas (state, exit code, host, GPUs given), labels, the checkpoint location
    and the scheduler's console URL (never ``file://``)."""
    parsed = parse_app_handle(app_handle)
    replicas = {rs.role: rs.replicas for rs in desc.roles_statuses}
    roles = []
    for role in desc.roles or [Role(name=name) for name in replicas]:
        res = role.resource
        roles.append(
            {
                "name": role.name,
                "image": role.image,
                "entrypoint": role.entrypoint,
                "args": list(role.args),
                "num_replicas": role.num_replicas,
                "resource": {"cpu": res.cpu, "gpu": res.gpu, "memMB": res.memMB, "devices": dict(res.devices)},
                "replicas": [jobviews.replica_dict(r) for r in replicas.get(role.name, [])],
            }
        )
    console = desc.ui_url if desc.ui_url and desc.ui_url.startswith(("http://", "https://")) else None
    identity = {key: desc.labels.get(label) for key, label in IDENTITY_LABELS.items()}
    return {
        "handle": app_handle,
        "scheduler": parsed.scheduler_backend,
        "app_id": parsed.app_id,
        "conn_id": conn_id,
        "state": desc.state.name,
        "terminal": desc.state.is_terminal(),
        "msg": desc.msg or desc.structured_error_msg,
        "root_cause": _cause_json(cause) if cause is not None else None,
        "failure_kind": failure.kind.value if (failure := classify(desc, cause)) else None,
        "created": epoch(desc.created),
        "started": epoch(desc.started),
        "ended": epoch(desc.ended),
        "usage": _usage_json(desc.usage) if desc.usage is not None else None,
        "usage_so_far": jobviews.usage_so_far(desc, SYSTEM_CLOCK.wall()),
        "checkpoint_dir": desc.checkpoint_dir,
        "num_restarts": desc.num_restarts,
        "cancel_requested": desc.cancel_requested,
        "console_url": console,
        "labels": dict(desc.labels),
        **identity,
        "roles": roles,
    }


def ladder_jobs(app_handle: str, labels: Mapping[str, str]) -> list[dict[str, Any]]:
    """The other jobs a capacity ladder submitted for the task instance of the job ``app_handle``
    (whose ``labels`` carry ``RUNG_LABEL`` and its identity), on every rung and try, oldest
    first, each a row of the list with its ``rung``; none for a job of no ladder. Read from the
    listing of the task instance's jobs ``list_jobs`` keeps (one per filters, renewed in the
    background), so a page asking costs no walk of the schedulers but the first."""
    identity = TaskIdentity.from_labels(labels)
    if RUNG_LABEL not in labels or identity is None:
        return []
    found = list_jobs({"dag_id": identity.dag_id, "task_id": identity.task_id, "run_id": identity.run_id})
    same = identity.labels()
    rows = [
        row
        for row in found.jobs
        if row.handle != app_handle
        and RUNG_LABEL in row.labels
        and all(row.labels.get(k) == v for k, v in same.items())
    ]
    return [row.as_json() | {"rung": row.labels[RUNG_LABEL]} for row in sorted(rows, key=sort_key)]


def _cause_json(cause: RootCause) -> dict[str, Any]:
    """A root cause for the page: its fields and the text the task's failure message shows."""
    return {
        "error": cause.error,
        "replica": cause.replica,
        "rank": cause.rank,
        "exit_code": cause.exit_code,
        "frames": list(cause.frames),
        "stderr": list(cause.stderr),
        "text": cause.format(),
    }


def _usage_json(usage: Usage) -> dict[str, Any]:
    """A job's usage summary for the page (``Usage.to_dict`` without the per-attempt records)."""
    summary = usage.to_dict()
    summary.pop("attempts", None)
    return summary


def read_log(runner: Runner, app_handle: str, role: str, replica: int, cursor: str | None) -> dict[str, Any]:
    """One page of a replica's log after ``cursor`` (the scheduler's own resumable cursor):
    ``{"lines", "cursor", "eof"}``. Bad role/replica/cursor: ``ValueError`` naming it."""
    chunk = runner.read_log(app_handle, role, replica, cursor or None, max_lines=LOG_PAGE_LINES)
    return {"lines": [line.rstrip("\n") for line in chunk.lines], "cursor": chunk.cursor, "eof": chunk.eof}
