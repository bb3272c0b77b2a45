"""A local job's record: its files in the job store (``store.py``) read, checked against the
shape their writer gives them, and what they say of the job derived from them.

- **Shapes** (``SHAPES``): one declarative table, per file, of the keys a reader relies on and
  their JSON types (``shapes.py``). ``read_entry`` reads a file through ``store.read_json`` (real directories
  below the store only) and raises ``store.CorruptEntryError`` naming the file and the first
  key that does not fit; keys a reader does not rely on are not checked.
- **Derivations**: pure functions over the parsed files, the host and a clock value: the
  state of a job whose end is not recorded (``live_state``), the end of a job whose
  supervisor is gone (``orphan_end``), the ``DescribeAppResponse`` of a job (``description``).
  ``tests/core/local/test_record.py`` tests each rule alone.
- **Reads** (``JobRecords``): the request record and the state as ``describe`` sees them, with
  a bounded cache of what never changes once written (the request record, a final state).
"""

from __future__ import annotations

import copy
import os
import socket
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

from airflow_provider_torchx.core import safefiles
from airflow_provider_torchx.core.clock import SYSTEM_CLOCK, Clock
from airflow_provider_torchx.core.guards import Trip
from airflow_provider_torchx.core.schedulers.api import CancelledBy, DescribeAppResponse
from airflow_provider_torchx.core.schedulers.local import ledger, procfs, store
from airflow_provider_torchx.core.schedulers.local.logs import open_log
from airflow_provider_torchx.core.schedulers.local.request import role_from_json
from airflow_provider_torchx.core.schedulers.local.shapes import (
    ANY,
    INTEGER,
    NUMBER,
    OBJECT,
    STRING,
    STRING_OR_NULL,
    Among,
    Each,
    Obj,
    Row,
    Shape,
    why_not,
)
from airflow_provider_torchx.core.schedulers.local.supervisor import is_supervisor_of
from airflow_provider_torchx.core.schedulers.local.usage import local_usage
from airflow_provider_torchx.core.specs import AppState, ReplicaStatus, RoleStatus

#: The names of the terminal app states (a job's ``state.json`` holds names).
TERMINAL_NAMES = frozenset(s.name for s in AppState if s.is_terminal())
#: What a job reports before its supervisor wrote its first ``state.json``.
PENDING_STATE: dict[str, Any] = {"state": "PENDING", "num_restarts": 0, "msg": "", "replicas": {}}
#: A job whose supervisor has not shown up this long after submission is FAILED.
SUPERVISOR_START_TIMEOUT = ledger.START_TIMEOUT
#: How much of the end of ``supervisor.log`` a reader quotes when the supervisor died.
LAST_WORDS_BYTES = 300
#: How many stray processes an orphan's message names (the others are counted).
STRAYS_NAMED = 10


# ------------------------------------------------------------------ shapes

APP_STATE = Among(frozenset(AppState.__members__), "an app state")
CANCELLED_BY = Among(
    frozenset(m.value for m in CancelledBy), f"one of {', '.join(m.value for m in CancelledBy)} or null", null=True
)

#: Each file of a job and the shape of what a reader relies on in it (``read_entry``).
SHAPES: dict[str, Shape] = {
    store.REQUEST: Obj(
        {
            "backend": STRING,
            "app_name": STRING,
            "log_dir": STRING,
            "labels": OBJECT,
            "cfg": OBJECT,
            "role_params": Each(Each(Obj({"args": ANY}, what="a replica's parameters")), keyed=True),
            "roles": Each(Obj({"name": STRING}, what="a role")),
            "created": NUMBER,
        }
    ),
    store.STATE: Obj(
        {"state": APP_STATE},
        optional={
            "replicas": Each(
                Each(Obj({"state": APP_STATE}, optional={"attempts": Each(OBJECT)}, what="a replica's state")),
                keyed=True,
            ),
            "tracked": Each(Row((INTEGER, INTEGER), "a [pid, start] pair")),
            "guard": OBJECT,  # the supervisor's guard trip (``Trip.from_dict`` reads it)
        },
    ),
    store.SUPERVISOR: Obj({"pid": INTEGER, "start": INTEGER}),
    # ``by`` may be missing: a record written without it reads as not said.
    store.CANCEL: Obj(optional={"reason": STRING_OR_NULL, "by": CANCELLED_BY, "refused": STRING_OR_NULL}),
}


def read_entry(root: str, app_id: str, name: str) -> Any:
    """The JSON of the job's file ``<root>/<app_id>/<name>`` (None when missing), read only
    through real directories below the store ``root`` (``store.read_json``) and checked
    against ``SHAPES[name]``; ``store.CorruptEntryError`` naming the job and file when it is
    not JSON, does not fit, or is a symbolic link or not a regular file."""
    path = os.path.join(root, app_id, name)
    try:
        value = store.read_json(path, root)
    except safefiles.UnsafeFileError as e:
        raise store.CorruptEntryError(app_id, path, e.why) from None
    except ValueError as e:
        raise store.CorruptEntryError(app_id, path, f"not JSON: {e}") from None
    except NotADirectoryError:
        raise store.CorruptEntryError(app_id, os.path.dirname(path), "a file, not a job directory") from None
    why = None if value is None else why_not(SHAPES[name], value)
    if why:
        raise store.CorruptEntryError(app_id, path, why)
    return value


# ------------------------------------------------------------------ derivations


def is_ended(st: Mapping[str, Any] | None) -> bool:
    """Whether the ``state.json`` ``st`` (None: none yet) records the job's end."""
    return st is not None and st["state"] in TERMINAL_NAMES


def on_this_host(rec: Mapping[str, Any], host: str | None = None) -> bool:
    """Whether the job of request record ``rec`` was launched on ``host`` (default: this one;
    a job store may be shared, e.g. on NFS). A record without a host is this host's."""
    here = host or socket.gethostname()
    return rec.get("host", here) == here


def live_state(
    rec: Mapping[str, Any],
    st: dict[str, Any] | None,
    sup: Mapping[str, Any] | None,
    *,
    here: bool,
    alive: bool,
    now: float,
) -> dict[str, Any] | None:
    """What a job whose end ``state.json`` does not record (``st``; None: not written yet) is
    at ``now``: its state while it may still run, None when its supervisor is gone (an orphan:
    ``orphan_end``). It may still run when it was launched on another host (``here`` False:
    its processes cannot be checked from here), while its supervisor (``sup``) is ``alive``,
    and, before the supervisor recorded itself, for ``SUPERVISOR_START_TIMEOUT`` after
    submission (PENDING)."""
    if not here or alive:
        return st or PENDING_STATE
    if sup is None and now - rec["created"] < SUPERVISOR_START_TIMEOUT:
        return PENDING_STATE
    return None


def orphan_end(
    st: Mapping[str, Any] | None,
    sup: Mapping[str, Any] | None,
    cancel: Mapping[str, Any] | None,
    *,
    now: float,
    last_words: str = "",
    strays: list[procfs.ProcInfo] | None = None,
) -> dict[str, Any]:
    """The end of a job whose supervisor is gone (``sup``; None: it never started), from its
    last ``state.json`` (``st``, left as it is): every unfinished replica FAILED, or CANCELLED
    when a cancel was requested (``cancel``), and why, ended at ``now``. ``last_words``: the
    last line of the supervisor's log, quoted when it died. ``strays``: the processes outside
    the replicas that ``finalize`` stopped (None: nothing was stopped yet, as ``describe``
    reports it)."""
    end = copy.deepcopy(dict(st or PENDING_STATE))
    replicas = end.get("replicas") or {}
    final = "CANCELLED" if cancel is not None else "FAILED"
    for reps in replicas.values():
        for r in reps:
            if r["state"] not in TERMINAL_NAMES:
                r["state"] = final
    if cancel is not None:
        why = f"{store.cancelled_msg(dict(cancel))} (the supervisor ended before it could record it)"
    elif sup is None:
        why = f"the supervisor did not start within {SUPERVISOR_START_TIMEOUT:.0f} s"
    else:
        why = f"the supervisor (pid {sup['pid']}) died before the job ended"
        if strays is not None:
            why += "; its replicas were stopped"
        if last_words:
            why += f"; its last words: {last_words}"
    if strays:
        named = ", ".join(f"{p.pid} ({p.comm})" for p in strays[:STRAYS_NAMED])
        more = f" and {len(strays) - STRAYS_NAMED} more" if len(strays) > STRAYS_NAMED else ""
        why += f"; stopped {len(strays)} process(es) left outside the replicas: {named}{more}"
    end.update(state=final, msg=why, ended=now, replicas=replicas)
    return end


def recorded_processes(st: Mapping[str, Any] | None) -> tuple[set[tuple[int, int]], set[tuple[int, int]]]:
    """``(replicas, tracked)``: the ``(pid, start)`` of each replica process the job's
    ``state.json`` (``st``) names, and of the other processes its supervisor tracked."""
    replicas = (st or {}).get("replicas") or {}
    reps = {(r["pid"], r["start"]) for rs in replicas.values() for r in rs if r.get("pid") and r.get("start")}
    return reps, {(p, t) for p, t in (st or {}).get("tracked") or []}


def unstarted_replica(app_state: str) -> dict[str, Any]:
    """The status of a replica the supervisor never started: PENDING while the job may still
    start it, else the job's end with a message saying it never ran."""
    if app_state not in TERMINAL_NAMES:
        return {"state": "PENDING"}
    return {"state": app_state, "msg": f"never started: the job ended {app_state} before this replica ran"}


def replica_status(role_name: str, k: int, r: Mapping[str, Any]) -> ReplicaStatus:
    """Replica ``k`` of ``role_name`` as ``state.json`` records it (``r``); its message names its
    GPUs (``devices``) when it has no other."""
    devices = r.get("devices") or ""
    return ReplicaStatus(
        id=k,
        state=AppState[r["state"]],
        role=role_name,
        hostname="localhost",
        exit_code=r.get("exit_code"),
        msg=r.get("msg") or (f"GPUs {devices}" if devices else ""),
        devices=devices,
    )


def cancel_fields(cancel: Mapping[str, Any] | None) -> dict[str, Any]:
    """The fields of a ``DescribeAppResponse`` that the job's ``cancel.json`` (None: no cancel
    was requested) gives."""
    return {
        "cancel_requested": cancel is not None,
        "cancel_reason": (cancel or {}).get("reason"),
        "cancelled_by": CancelledBy.parse((cancel or {}).get("by")),
        "stopped_while_refused": (cancel or {}).get("refused"),
    }


def description(
    app_id: str, rec: Mapping[str, Any], st: Mapping[str, Any], cancel: Mapping[str, Any] | None
) -> DescribeAppResponse:
    """The description of the job ``app_id`` from its request record ``rec``, its state ``st``
    (``state.json``, or what ``live_state``/``orphan_end`` derived) and its ``cancel.json``.
    Every replica of the request has a status: those the supervisor has not started yet
    (``unstarted_replica``) too. A job that ended has its ``usage``, a live one its
    ``usage_so_far``."""
    replicas = st.get("replicas") or {}
    unstarted = unstarted_replica(st["state"])
    statuses = [
        RoleStatus(
            name, [replica_status(name, k, r) for k, r in enumerate(replicas.get(name) or [unstarted] * len(ps))]
        )
        for name, ps in rec["role_params"].items()
    ]
    roles = [role_from_json(r) for r in rec["roles"]]
    state = AppState[st["state"]]
    usage = local_usage(rec, st, roles)
    return DescribeAppResponse(
        app_id=app_id,
        state=state,
        num_restarts=int(st.get("num_restarts", 0)),
        msg=st.get("msg", ""),
        ui_url=f"file://{rec['log_dir']}",
        roles_statuses=statuses,
        roles=roles,
        labels=dict(rec["labels"]),
        usage=usage if state.is_terminal() else None,
        usage_so_far=None if state.is_terminal() else usage,
        started=st.get("started"),
        ended=st.get("ended"),
        created=rec.get("created"),
        guard_trip=Trip.from_dict(st["guard"]) if "guard" in st else None,
        **cancel_fields(cancel),
    )


# ------------------------------------------------------------------ reads


def last_words(root: str, app_id: str) -> str:
    """The last non-empty line of the end of the job's ``supervisor.log`` (read as the logs
    are: ``logs.open_log``), at most ``LAST_WORDS_BYTES``; empty when there is none."""
    job_dir = os.path.join(root, app_id)
    path = os.path.join(job_dir, store.SUPERVISOR_LOG)
    try:
        fd = open_log(path, job_dir)
        if fd is None:
            return ""
        with open(fd, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - LAST_WORDS_BYTES))
            tail = f.read().decode("utf-8", "replace")
    except (OSError, safefiles.UnsafeFileError):
        return ""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return lines[-1] if lines else ""


class JobRecords:
    """The job records of the store ``root`` as this process reads them. What never changes
    once written (a job's request record; its state once it ended) is cached, up to
    ``cache_size`` jobs, the least recently read dropped first; the cache is shared by the
    threads of a process (a triggerer's pool, sensors). ``clock``: the time a live job's
    state and an orphan's end are judged at."""

    def __init__(self, root: str, cache_size: int, clock: Clock = SYSTEM_CLOCK) -> None:
        if cache_size <= 0:
            raise ValueError(f"cache_size: {cache_size!r} must be > 0")
        self.root = root
        self.cache_size = cache_size
        self.clock = clock
        # app id -> (request record, final state or None)
        self._cache: OrderedDict[str, tuple[dict[str, Any], dict[str, Any] | None]] = OrderedDict()
        self._lock = threading.Lock()

    def read(self, app_id: str, name: str) -> Any:
        """The job's file ``name``, read and checked (``read_entry``); never cached."""
        return read_entry(self.root, app_id, name)

    def request(self, app_id: str) -> dict[str, Any] | None:
        """The job's request record, or None if there is no such job (also one another
        process deleted since it was cached)."""
        if not store.is_valid_app_id(app_id):
            return None
        with self._lock:
            cached = self._cache.get(app_id)
            if cached is not None:
                if os.path.exists(os.path.join(self.root, app_id, store.REQUEST)):
                    self._cache.move_to_end(app_id)
                    return cached[0]
                del self._cache[app_id]
                return None
        rec = self.read(app_id, store.REQUEST)
        if rec is not None:
            self.remember(app_id, rec, None)
        return rec

    def state(self, app_id: str, rec: dict[str, Any]) -> dict[str, Any]:
        """The job's ``state.json``; for a job whose supervisor died (or never started) and
        whose end is not recorded, the end ``finalize`` would record, marked ``orphaned``
        (``orphan_end``). Read only: nothing is stopped or written here, so describing stays a
        few small file reads (an event loop may call it)."""
        with self._lock:
            cached = self._cache.get(app_id)
        if cached is not None and cached[1] is not None:
            return cached[1]
        st = self.read(app_id, store.STATE)
        if not is_ended(st):
            here = on_this_host(rec)
            sup = self.read(app_id, store.SUPERVISOR) if here else None
            live = live_state(
                rec, st, sup, here=here, alive=here and ledger.supervisor_alive(sup), now=self.clock.wall()
            )
            if live is not None:
                return live
            st = self.read(app_id, store.STATE)  # it may have ended just now
            if not is_ended(st):
                return {**self.orphan_end(app_id, st, sup), "orphaned": True}  # not cached: finalize records it
        self.remember(app_id, rec, st)
        return st

    def running_supervisor(self, app_id: str) -> tuple[int, int] | None:
        """``(pid, start)`` of the job's supervisor while one runs on this host, found without
        trusting the job's files (``running_supervisors``); None: none runs."""
        return self.running_supervisors([app_id]).get(app_id)

    def running_supervisors(self, app_ids: Iterable[str]) -> dict[str, tuple[int, int]]:
        """``{app_id: (pid, start)}`` of the jobs of ``app_ids`` whose supervisor runs on this
        host, found without trusting the jobs' files (jobs whose record is refused): the
        process ``supervisor.json`` names if it still is that job directory's supervisor (boot,
        start time and argv checked against ``/proc``), else the process of this host whose
        argv is that supervisor's (one ``/proc`` scan for all the jobs left)."""
        found: dict[str, tuple[int, int]] = {}
        left: dict[str, str] = {}  # job directory -> app id
        for app_id in app_ids:
            job_dir = os.path.join(self.root, app_id)
            try:
                sup = self.read(app_id, store.SUPERVISOR)
            except store.CorruptEntryError:
                sup = None
            if (
                sup is not None
                and sup.get("boot") == procfs.boot_id()
                and procfs.start_time(sup["pid"]) == sup["start"]
                and is_supervisor_of(procfs.cmdline(sup["pid"]), job_dir)
            ):
                found[app_id] = (sup["pid"], sup["start"])
            else:
                left[job_dir] = app_id
        if left:
            for p in procfs.scan():
                argv = procfs.cmdline(p.pid)
                job = left.get(argv[-1]) if argv else None
                if job is not None and is_supervisor_of(argv, os.path.join(self.root, job)):
                    found[job] = (p.pid, p.start)
        return found

    def orphan_end(
        self,
        app_id: str,
        st: Mapping[str, Any] | None,
        sup: Mapping[str, Any] | None,
        strays: list[procfs.ProcInfo] | None = None,
    ) -> dict[str, Any]:
        """``orphan_end`` of the job, now, with its cancel record; the supervisor's log is read
        only when the message quotes it (the supervisor died, no cancel was requested)."""
        cancel = self.read(app_id, store.CANCEL)
        words = last_words(self.root, app_id) if cancel is None and sup is not None else ""
        return orphan_end(st, sup, cancel, now=self.clock.wall(), last_words=words, strays=strays)

    def remember(self, app_id: str, rec: dict[str, Any], final: dict[str, Any] | None) -> None:
        """Cache the job's request record and its final state (None: not ended)."""
        with self._lock:
            self._cache[app_id] = (rec, final)
            self._cache.move_to_end(app_id)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)

    def forget(self, app_id: str) -> None:
        """Drop the job from the cache (it is being removed)."""
        with self._lock:
            self._cache.pop(app_id, None)
