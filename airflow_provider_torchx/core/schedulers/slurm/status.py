"""A Slurm job's description, as pure rules over what ``squeue --json`` says of it (while Slurm
knows the job) and its record under ``job_dir`` (``record.py``; all there is once Slurm forgot
it). No I/O here.

The job's state (``app_state``):

====================  ======================  ==========================================
Slurm knows the job   the record              the state
====================  ======================  ==========================================
yes, not ended        any                     Slurm's (PENDING: Slurm's reason in ``msg``)
yes, ended            any                     Slurm's (COMPLETED: SUCCEEDED, CANCELLED,
                                              else FAILED with Slurm's state and reason)
no                    the batch script ended  SUCCEEDED if every replica exited 0, else
                                              FAILED
no                    a cancel, no end        CANCELLED
no                    neither                 FAILED: it ended unrecorded (time limit,
                                              node failure, cancelled outside)
====================  ======================  ==========================================

A requeued job (Slurm's ``restart_cnt``) is described as of its current run: the ends an
earlier run wrote are that run's (``current``), not this one's.

What the job cost (``usage``): each replica's attempts, one per run, from the starts and ends
it wrote.

A replica (``replica_states``): its exit code decides once it wrote one (0: SUCCEEDED); the
first replica to fail is the FAILED one, and those ended after it by a signal (exit code 128
or more: ``srun --kill-on-bad-exit`` stopped them) or without an exit code are CANCELLED as
stopped after it. Without an exit code a replica has the job's state while it lives.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from airflow_provider_torchx.core.schedulers.api import DescribeAppResponse, ListAppResponse
from airflow_provider_torchx.core.schedulers.slurm.record import JobRecord
from airflow_provider_torchx.core.schedulers.slurm.render import parse_comment
from airflow_provider_torchx.core.specs import AppState, ReplicaStatus, Resource, Role, RoleStatus
from airflow_provider_torchx.core.usage import Attempt, Usage, compute_usage

#: Slurm's job states (``squeue``'s ``job_state``) as app states; any other is RUNNING.
SLURM_STATES: dict[str, AppState] = {
    "PENDING": AppState.PENDING,
    "REQUEUED": AppState.PENDING,
    "REQUEUE_HOLD": AppState.PENDING,
    "REQUEUE_FED": AppState.PENDING,
    "RESV_DEL_HOLD": AppState.PENDING,
    "CONFIGURING": AppState.PENDING,
    "SUSPENDED": AppState.PENDING,
    "STOPPED": AppState.PENDING,
    "RUNNING": AppState.RUNNING,
    "COMPLETING": AppState.RUNNING,
    "SIGNALING": AppState.RUNNING,
    "STAGE_OUT": AppState.RUNNING,
    "RESIZING": AppState.RUNNING,
    "COMPLETED": AppState.SUCCEEDED,
    "CANCELLED": AppState.CANCELLED,
    "FAILED": AppState.FAILED,
    "TIMEOUT": AppState.FAILED,
    "NODE_FAIL": AppState.FAILED,
    "BOOT_FAIL": AppState.FAILED,
    "DEADLINE": AppState.FAILED,
    "OUT_OF_MEMORY": AppState.FAILED,
    "PREEMPTED": AppState.FAILED,
    "SPECIAL_EXIT": AppState.FAILED,
}
#: An exit code at or above this one: the process was stopped by a signal (128 + signal).
SIGNALLED = 128


def slurm_state(entry: Mapping[str, Any]) -> str:
    """``job_state`` of an ``squeue --json`` entry (a string in 22.05, a list later)."""
    state = entry.get("job_state")
    if isinstance(state, list):
        state = state[0] if state else ""
    return str(state or "")


def _number(entry: Mapping[str, Any], key: str) -> float | None:
    """A time of an entry (epoch seconds; 22.05 prints numbers, later ones ``{"number": n}``);
    None for 0 (not yet) or none."""
    value = entry.get(key)
    if isinstance(value, dict):
        value = value.get("number") if value.get("set", True) else None
    return float(value) if isinstance(value, int | float) and value > 0 else None


def index_jobs(entries: Iterable[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """``squeue --json``'s ``jobs`` by app id: a heterogeneous job by its leader's entry (the
    component the batch script runs in, offset 0), a plain job by its own."""
    out: dict[str, Mapping[str, Any]] = {}
    for entry in entries:
        het = entry.get("het_job_id") or 0
        if het and entry.get("het_job_offset", 0) != 0:
            continue
        out[str(het or entry.get("job_id"))] = entry
    return out


def sacct_entry(job: Mapping[str, Any]) -> dict[str, Any]:
    """An ``sacct --json`` job (accounting's record of a job the controller may have forgotten)
    as the ``squeue --json`` entry these rules read: its state and reason, times, comment (kept
    with ``AccountingStoreFlags=job_comment``), working directory and heterogeneous job."""
    state, times, het = job.get("state") or {}, job.get("time") or {}, job.get("het") or {}
    return {
        "job_id": job.get("job_id"),
        "job_state": state.get("current"),
        "state_reason": state.get("reason"),
        "submit_time": times.get("submission"),
        "start_time": times.get("start"),
        "end_time": times.get("end"),
        "comment": (job.get("comment") or {}).get("job") or "",
        "current_working_directory": job.get("working_directory"),
        "nodes": "" if job.get("nodes") == "None assigned" else job.get("nodes"),  # accounting's "none"
        "het_job_id": het.get("job_id") or 0,
        "het_job_offset": het.get("job_offset") or 0,
    }


def app_state(rec: JobRecord | None, entry: Mapping[str, Any] | None) -> tuple[AppState, str]:
    """The job's state and why (the table above)."""
    if entry is not None:
        name = slurm_state(entry)
        state = SLURM_STATES.get(name, AppState.RUNNING)
        reason = str(entry.get("state_reason") or "")
        reason = "" if reason == "None" else reason  # Slurm's word for none (yet)
        if state == AppState.PENDING:
            return state, f"pending in Slurm ({name})" + (f": {reason}" if reason else "")
        if state == AppState.FAILED:
            return state, f"Slurm: {name}" + (f" ({reason})" if reason else "")
        return state, ""
    assert rec is not None
    if rec.ended is not None:
        ok = all(end.exit_code == 0 for end in rec.exits.values()) and len(rec.exits) == _replica_count(rec)
        return (AppState.SUCCEEDED, "") if ok else (AppState.FAILED, "")
    if rec.cancel is not None:
        return AppState.CANCELLED, ""
    return AppState.FAILED, (
        "the job ended without recording its end (a time limit, a node failure or a cancel outside "
        "airflow-torchx) and Slurm no longer knows it"
    )


def _replica_count(rec: JobRecord) -> int:
    return sum(int(r.get("num_replicas", 0)) for r in rec.roles)


def first_failure(rec: JobRecord) -> tuple[str, int] | None:
    """The replica that failed first (by its end, to the nanosecond the job recorded; ties: an
    exit of its own before one by a signal, as ``srun`` stops the others with when one fails,
    then role order, then index)."""
    order = {r["name"]: i for i, r in enumerate(rec.roles)}
    failed = [
        (end.at, end.exit_code > 128, order.get(role, 0), k, role)
        for (role, k), end in rec.exits.items()
        if end.exit_code != 0
    ]
    if not failed:
        return None
    *_, k, role = min(failed)
    return role, k


def replica_states(rec: JobRecord, state: AppState) -> list[RoleStatus]:
    """Each role's replicas' states (the rules above), with their hosts and exit codes."""
    first = first_failure(rec)
    first_end = rec.exits[first].at if first else None
    stopped = f"stopped after {first[0]}[{first[1]}] failed" if first else ""
    out = []
    for role in rec.roles:
        reps = []
        for k in range(int(role.get("num_replicas", 0))):
            key = (role["name"], k)
            end = rec.exits.get(key)
            rep = ReplicaStatus(id=k, state=state, role=role["name"], hostname=rec.hosts.get(key, ""))
            if end is not None:
                rep.exit_code = end.exit_code
                if end.exit_code == 0:
                    rep.state = AppState.SUCCEEDED
                elif key == first or first_end is None or end.exit_code < SIGNALLED or end.at < first_end:
                    rep.state = AppState.FAILED
                else:
                    rep.state, rep.msg = AppState.CANCELLED, stopped
            elif state.is_terminal():
                if first is not None:
                    rep.state, rep.msg = AppState.CANCELLED, stopped
                elif state == AppState.SUCCEEDED:
                    rep.state = AppState.FAILED
                    rep.msg = "ended without an exit code"
            reps.append(rep)
        out.append(RoleStatus(role=role["name"], replicas=reps))
    return out


def _roles(rec: JobRecord) -> list[Role]:
    roles = []
    for r in rec.roles:
        res = r.get("resource") or {}
        roles.append(
            Role(
                name=r["name"],
                entrypoint=str(r.get("entrypoint", "")),
                args=[str(a) for a in r.get("args") or []],
                env={str(k): str(v) for k, v in (r.get("env") or {}).items()},
                num_replicas=int(r.get("num_replicas", 0)),
                resource=Resource(
                    cpu=int(res.get("cpu", -1)), gpu=int(res.get("gpu", -1)), memMB=int(res.get("memMB", -1))
                ),
            )
        )
    return roles


def restarts(entry: Mapping[str, Any]) -> int:
    """How many times Slurm requeued the job (``restart_cnt``)."""
    value = entry.get("restart_cnt")
    return value if isinstance(value, int) and value > 0 else 0


def current(rec: JobRecord | None, entry: Mapping[str, Any] | None) -> JobRecord | None:
    """The record as of the run Slurm is on (``JobRecord.at_run``): a requeued job's previous
    run's ends are not this run's."""
    return rec.at_run(restarts(entry)) if rec is not None and entry is not None else rec


def usage(rec: JobRecord, roles: list[Role], ended: float | None) -> Usage:
    """What the job cost (``core/usage.py``): each replica's attempts, one per run of the job
    (a requeue starts another), each from its start to its exit; a run stopped before it wrote
    its exit code is counted to the next run's start (an earlier run) or to the job's end
    ``ended`` (the latest)."""
    attempts = []
    for role in roles:
        for k in range(role.num_replicas):
            key = (role.name, k)
            runs = [(r.started, r.end) for r in rec.earlier.get(key, [])]
            if key in rec.starts:
                runs.append((rec.starts[key], rec.exits.get(key)))
            for n, (started, end) in enumerate(runs):
                nxt = runs[n + 1][0] if n + 1 < len(runs) else None
                attempts.append(
                    Attempt(
                        role=role.name,
                        replica=k,
                        number=n + 1,
                        started=started,
                        ended=end.at if end else nxt,
                        exit_code=end.exit_code if end else None,
                    )
                )
    return compute_usage(rec.submitted, ended, roles, attempts)


def _slurm_start(entry: Mapping[str, Any] | None, state: AppState) -> float | None:
    """When Slurm says the job started: never while it is pending, nor for a job that ended
    without being given a node (Slurm sets a pending job's start to when it was cancelled)."""
    if entry is None or state == AppState.PENDING or not entry.get("nodes"):
        return None
    return _number(entry, "start_time")


def describe(app_id: str, rec: JobRecord | None, entry: Mapping[str, Any] | None) -> DescribeAppResponse | None:
    """The description of job ``app_id`` from its record and its ``squeue`` entry (either may
    be missing; None when both are: no such job)."""
    if rec is None and entry is None:
        return None
    rec = current(rec, entry)
    state, msg = app_state(rec, entry)
    created = (_number(entry, "submit_time") if entry else None) or (rec.submitted if rec else None)
    started = _slurm_start(entry, state) or (rec.started if rec else None)
    ended = (
        ((_number(entry, "end_time") if entry else None) or (rec.ended if rec else None))
        if state.is_terminal()
        else None
    )
    common: dict[str, Any] = {
        "app_id": app_id,
        "state": state,
        # Slurm's count while the controller knows the job; the record's runs after (sacct has none)
        "num_restarts": max(restarts(entry) if entry else 0, rec.run if rec else 0),
        "created": created,
        "started": started,
        "ended": ended,
    }
    if rec is None:
        assert entry is not None
        doc = parse_comment(str(entry.get("comment", ""))) or {}
        return DescribeAppResponse(msg=msg, labels=dict(doc.get("labels") or {}), **common)
    first = first_failure(rec)
    if state == AppState.FAILED and first is not None:
        host = rec.hosts.get(first)
        msg = f"{first[0]}[{first[1]}] exited with {rec.exits[first].exit_code}" + (f" on {host}" if host else "")
    elif state == AppState.CANCELLED:
        msg = _cancel_msg(rec)
    roles = _roles(rec)
    cost = usage(rec, roles, ended)
    return DescribeAppResponse(
        msg=msg,
        labels=rec.labels,
        roles=roles,
        usage=cost if state.is_terminal() else None,
        usage_so_far=None if state.is_terminal() else cost,
        roles_statuses=replica_states(rec, state),
        cancel_requested=rec.cancel is not None,
        cancel_reason=rec.cancel_reason,
        cancelled_by=rec.cancelled_by,
        **common,
    )


def _cancel_msg(rec: JobRecord) -> str:
    if rec.cancel is None:
        return "cancelled in Slurm (outside airflow-torchx)"
    by = rec.cancelled_by
    who = f" by {by.value}" if by else ""
    return f"cancelled{who}" + (f": {rec.cancel_reason}" if rec.cancel_reason else "")


def listed(desc: DescribeAppResponse, rec: JobRecord | None, entry: Mapping[str, Any] | None) -> ListAppResponse:
    """A description as a ``list`` entry, named as the app (its record, else its comment)."""
    name = (
        rec.name
        if rec is not None
        else str((parse_comment(str((entry or {}).get("comment", ""))) or {}).get("app", ""))
    )
    return ListAppResponse(
        app_id=desc.app_id,
        state=desc.state,
        name=name,
        labels=desc.labels,
        created=desc.created,
        started=desc.started,
        ended=desc.ended,
    )
