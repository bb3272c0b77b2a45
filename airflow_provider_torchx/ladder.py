"""A capacity ladder: the rungs a task's job may run on, and when it moves down them.

``TorchXRunOperator(torchx_conn_id=[first, second, ...])`` names a ladder: each ``torchx``
connection is a rung (a scheduler and its run options), tried in order. The job is submitted to
the first rung; when it cannot start there, or the place keeps losing it, the task cancels it
and submits the same app to the next rung with the same identity labels, the same
``TORCHX_CHECKPOINT_DIR`` and its attempt number continued (docs/architecture.md, "Capacity
ladder"). A task that does not wait for completion (``wait_for_completion=False``) watches
its job only until it left PENDING on a rung it may still leave, then returns the handle of
the rung where it started (``handover_line``), for a sensor to watch: after that nothing moves
the job. This module is the rules alone (no I/O, no Airflow import): the rungs as given
(``conn_ids``), their shared checkpoint location (``check_checkpoints``), each rung's limits
(``Rung``), the move (``decide``) and the record of rungs tried (``Step``, XCom ``ladder``).
Every row of the table is a test in ``tests/airflow/test_ladder.py``.

The table (first matching row wins), for the job of rung ``i`` and how its watch ended:

=============================================  ==============================================
rung / outcome                                 verdict
=============================================  ==============================================
the last rung (or a single connection)         stay: its limits act as without a ladder
the job succeeded (or still runs: the task's   stay
own wait ran out)
the job left PENDING and its task does not     stay: the task returns its handle; once
wait for completion (outcome ``started``)      started the job moves no more (its
                                               ``max_infra_failures`` needs a task that waits)
its ``start_timeout`` tripped (the rung's      move, why ``start_timeout``: it could not start
connection extra, else the task's)             there
another guard tripped (``max_gpu_hours``,      stay: the budget is the task's, whatever the
``max_cost``)                                  rung
failed, kind ``app`` or ``config``             stay: the next rung would fail the same way
cancelled from outside the task                stay: someone meant it to stop
failed, kind ``infra`` or ``capacity``, the    stay: the rung keeps the job (the task's
rung sets no ``max_infra_failures``            retries decide, as without a ladder)
failed, kind ``infra`` or ``capacity``, fewer  stay
than ``max_infra_failures`` on the rung
failed, kind ``infra`` or ``capacity``,        move, why ``max_infra_failures``
``max_infra_failures`` reached on the rung
=============================================  ==============================================

A failure counts once per attempt that ended so (``infra_failures``: an AWS Batch job whose
attempts each lost their host counts each), and at least once for the job itself.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_provider_torchx.core.checkpoints import check_mounted_location
from airflow_provider_torchx.core.errors import InvalidRunConfigError
from airflow_provider_torchx.core.failures import CAPACITY_REASONS, INFRA_REASONS, FailureKind
from airflow_provider_torchx.core.guards import START_TIMEOUT
from airflow_provider_torchx.core.specs import AppDef

if TYPE_CHECKING:
    from airflow_provider_torchx import outcome

#: The connection extra: how many ``infra``/``capacity`` failures a rung takes before the job moves on.
MAX_INFRA_FAILURES = "max_infra_failures"
#: The XCom key of the record of rungs tried (a list of ``Step.to_dict()``).
XCOM_KEY = "ladder"
#: The label naming the rung (its connection id) a job of a ladder was submitted to.
RUNG_LABEL = "torchx.rung"
#: The failure kinds that count towards ``max_infra_failures``: the place's, not the job's.
PLACE_KINDS = frozenset({FailureKind.INFRA, FailureKind.CAPACITY})


class Why(str, enum.Enum):
    """Why a job left its rung (the ``why`` tag of ``torchx.job.moved``)."""

    START_TIMEOUT = START_TIMEOUT
    INFRA_FAILURES = MAX_INFRA_FAILURES

    def __str__(self) -> str:
        return self.value


def conn_ids(value: object) -> tuple[str, ...]:
    """The rungs ``torchx_conn_id`` names: one connection id (a ladder of one rung), or a list
    of them in order. ``ValueError`` naming the field and the bad value for an empty list, an
    id that is not a non-empty string, or an id given twice (a rung tried twice is a loop)."""
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list | tuple):
        raise ValueError(
            f"torchx_conn_id: {value!r} is not allowed: give a torchx connection id, or a list of them (a ladder)"
        )
    if not value:
        raise ValueError("torchx_conn_id: an empty list is not allowed: give one or more torchx connection ids")
    seen: set[str] = set()
    for i, conn_id in enumerate(value):
        if not isinstance(conn_id, str) or not conn_id:
            raise ValueError(
                f"torchx_conn_id[{i}]: {conn_id!r} is not allowed: each rung is a torchx connection id (a string)"
            )
        if conn_id in seen:
            raise ValueError(
                f"torchx_conn_id[{i}]: {conn_id!r} is given twice; each rung of a ladder is a different "
                f"torchx connection (got {list(value)!r})"
            )
        seen.add(conn_id)
    return tuple(value)


def max_infra_failures(value: object, conn_id: str) -> int | None:
    """The connection extra ``max_infra_failures`` of rung ``conn_id``: a whole number >= 1, or
    None (not set: failures never move the job). ``InvalidRunConfigError`` naming the rung."""
    if value is None or value == "":
        return None
    try:
        number = int(value) if isinstance(value, int | str) and not isinstance(value, bool) else None
    except ValueError:
        number = None
    if number is None or number < 1:
        raise InvalidRunConfigError(
            f"connection {conn_id!r} extra {MAX_INFRA_FAILURES}: {value!r} is not allowed: expected a whole "
            "number >= 1 (failures of kind infra or capacity on this rung before the job moves to the next)"
        )
    return number


@dataclass(frozen=True)
class Rung:
    """One rung as its connection says: ``conn_id``, its ``scheduler``, whether its jobs see this
    host's paths (``host_paths``: ``SchedulerCapabilities.host_paths``), its checkpoint root (by
    the usual precedence; None: none), its ``start_timeout`` in seconds (the connection's extra,
    else the task's; None: none) and ``max_infra_failures`` (None: never moves for failures)."""

    conn_id: str
    scheduler: str
    host_paths: bool = True
    checkpoint_root: str | None = None
    start_timeout: float | None = None
    max_infra_failures: int | None = None

    def name(self) -> str:
        """``conn_id (scheduler)``, as messages name a rung."""
        return f"{self.conn_id!r} ({self.scheduler})"


def rung_start_timeout(connection: float | None, task: float | None) -> float | None:
    """A rung's ``start_timeout``: its connection's extra, else the task's."""
    return connection if connection is not None else task


def check_checkpoints(rungs: Sequence[Rung], location: str | None, app: AppDef) -> None:
    """A ladder's rungs share one checkpoint location, ``location`` (the first rung's): every
    rung must resolve the same root, and a rung whose jobs run on other hosts must reach it (a
    URI such as ``s3://``, or a path every role mounts: ``check_mounted_location``). Else
    ``InvalidRunConfigError`` naming the rung, before anything is submitted."""
    if len(rungs) < 2:
        return
    first = rungs[0]
    for i, rung in enumerate(rungs[1:], start=1):
        if rung.checkpoint_root != first.checkpoint_root:
            raise InvalidRunConfigError(
                f"torchx_conn_id[{i}]: rung {rung.name()} checkpoints under {rung.checkpoint_root!r}, rung "
                f"{first.name()} under {first.checkpoint_root!r}: the rungs of a ladder share one checkpoint "
                "root, so that the job resumes where it moves; set checkpoint_root= on the task (a path every "
                "rung shares, or s3:// for AWS Batch), or the same checkpoint_root extra on every rung"
            )
    if location is None:
        return
    for i, rung in enumerate(rungs):
        if rung.host_paths:
            continue
        try:
            check_mounted_location(location, app)
        except InvalidRunConfigError as e:
            raise InvalidRunConfigError(f"torchx_conn_id[{i}]: rung {rung.name()} cannot reach it: {e}") from None


@dataclass(frozen=True)
class Outcome:
    """How the watch of a rung's job ended, as the table reads it: the event's ``status``
    (``success``, ``failed``, ``guardrail``, ``timeout``, ``error``), the ``guard`` that
    tripped, the failure's ``kind`` and ``failures``: the rung's ``infra``/``capacity``
    failures so far, this job's included (``infra_failures``)."""

    status: str
    guard: str | None = None
    kind: FailureKind | None = None
    failures: int = 0

    @classmethod
    def of_watch(cls, watched: outcome.Outcome, kind: FailureKind | None, failures: int = 0) -> Outcome:
        """The outcome of a watch (``outcome.py``) whose failure is of ``kind``."""
        return cls(watched.end.value, watched.guard, kind, failures)


@dataclass(frozen=True)
class Move:
    """Leave rung ``source`` for rung ``target`` (indices into the ladder), ``why``; ``detail``
    says it in words (the task log line, the cancel's reason)."""

    source: int
    target: int
    why: Why
    detail: str


def decide(rungs: Sequence[Rung], index: int, outcome: Outcome) -> Move | None:
    """The table of the module docstring for the job of rung ``index``: the move, or None (stay:
    the task reports the outcome as without a ladder)."""
    if index >= len(rungs) - 1 or outcome.status in ("success", "timeout", "started"):
        return None
    rung = rungs[index]
    if outcome.status == "guardrail" and outcome.guard == START_TIMEOUT:
        return start_timeout_move(rungs, index)
    if outcome.status != "failed" or outcome.kind not in PLACE_KINDS:
        return None
    limit = rung.max_infra_failures
    if limit is None or outcome.failures < limit:
        return None
    return Move(
        index,
        index + 1,
        Why.INFRA_FAILURES,
        f"{outcome.failures} {'/'.join(sorted(k.value for k in PLACE_KINDS))} failures there "
        f"(max_infra_failures={limit})",
    )


def start_timeout_move(rungs: Sequence[Rung], index: int) -> Move | None:
    """The move of rung ``index``'s job when its ``start_timeout`` trips (None: the last rung,
    where the guard acts as without a ladder)."""
    if index >= len(rungs) - 1:
        return None
    limit = rungs[index].start_timeout
    within = f"{limit:g}s" if limit is not None else "its limit"
    return Move(index, index + 1, Why.START_TIMEOUT, f"it did not start within start_timeout={within}")


def infra_failures(kind: FailureKind | None, attempt_reasons: Iterable[str]) -> int:
    """How many ``infra``/``capacity`` failures one ended job counts: none unless its failure
    is of those kinds; then each attempt whose reason is the platform's (``INFRA_REASONS``,
    ``CAPACITY_REASONS``: a host reclaimed, no capacity), and at least one."""
    if kind not in PLACE_KINDS:
        return 0
    counted = sum(1 for r in attempt_reasons if r and (INFRA_REASONS.search(r) or CAPACITY_REASONS.search(r)))
    return max(counted, 1)


def cancel_reason(target: Rung, move: Move) -> str:
    """The reason the task gives its cancel of the job it moves: ``moved to RUNG: why``."""
    return f"moved to {target.conn_id}: {move.detail}"


def retry_rung(rungs: Sequence[Rung], index: int, reason: str | None) -> int:
    """The rung a retry goes on from when its task instance's newest job is on rung ``index``:
    the next one when the task cancelled that job to move it there (``reason``: the job's
    cancel reason from its task, ``cancel_reason``) and no job was submitted there (its worker
    died in between), else ``index``."""
    if index + 1 < len(rungs) and reason is not None and reason.startswith(f"moved to {rungs[index + 1].conn_id}: "):
        return index + 1
    return index


def move_line(rungs: Sequence[Rung], move: Move, handle: str) -> str:
    """The task log's one line for a move: the rung left, why, the rung taken."""
    source, target = rungs[move.source], rungs[move.target]
    return (
        f"Ladder: leaving rung {move.source + 1} {source.name()}, job {handle}: {move.detail}; "
        f"moving to rung {move.target + 1} {target.name()}"
    )


def handover_line(rungs: Sequence[Rung], index: int, handle: str, state: str | None) -> str:
    """The task log's line when a task that does not wait for completion returns the handle of
    its job on rung ``index``: the job left PENDING there (``state``), or it is on the last rung
    (``state`` None: returned once submitted, as without a ladder)."""
    where = f"rung {index + 1} {rungs[index].name()}"
    if state is None:
        return (
            f"Ladder: job {handle} is on the last {where}; returning its handle at once "
            "(wait_for_completion=False): its limits act as without a ladder"
        )
    return (
        f"Ladder: job {handle} left PENDING ({state}) on {where}; returning its handle "
        "(wait_for_completion=False): the ladder no longer moves it (max_infra_failures needs a task "
        "that waits for completion)"
    )


@dataclass(frozen=True)
class Step:
    """One rung tried, as XCom ``ladder`` lists it: the connection, the job's handle, its
    ``outcome`` (``running``, ``moved``, ``succeeded``, ``failed``, ...) and ``reason`` (why it
    moved or failed; None), with when it was submitted and left (epoch seconds) and what it
    cost (US dollars) where known."""

    conn_id: str
    app_handle: str
    outcome: str = "running"
    reason: str | None = None
    submitted_at: float | None = None
    ended_at: float | None = None
    cost_usd: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The XCom form (what is not known is left out)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None or k == "reason"}

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> Step:
        """A step from its XCom form."""
        known: dict[str, Any] = {k: value[k] for k in cls.__dataclass_fields__ if k in value}
        return cls(**known)


#: The figures of a usage summary (``Usage.to_dict``) a ladder sums over its rungs' jobs.
SUMMED = ("node_seconds", "vcpu_hours", "gpu_hours", "memory_gb_hours", "attempts_count", "cost_usd")


def summed(usages: Sequence[Mapping[str, Any] | None]) -> dict[str, Any]:
    """The totals of the jobs of every rung tried (their ``Usage.to_dict()``; None: the job's
    usage could not be read): each figure of ``SUMMED`` summed over the jobs that know it (None
    when none does); ``jobs``: how many jobs, ``known``: how many had a usage to read."""
    known = [u for u in usages if u is not None]
    totals: dict[str, Any] = {"jobs": len(usages), "known": len(known)}
    for key in SUMMED:
        values = [u[key] for u in known if u.get(key) is not None]
        totals[key] = sum(values) if values else None
    return totals


def ladder_line(totals: Mapping[str, Any]) -> str:
    """The usage summary's line of a ladder's totals: ``Ladder (2 jobs): 0.5000 GPU-h, $1.25``."""
    unread = totals["jobs"] - totals["known"]
    gpu = totals.get("gpu_hours")
    cost = totals.get("cost_usd")
    parts = [f"{gpu:.4f} GPU-h" if gpu is not None else "GPU-h n/a"]
    if cost is not None:
        parts.append(f"${cost:.2f}")
    if unread:
        parts.append(f"{unread} job(s) unread")
    return f"Ladder ({totals['jobs']} jobs, every rung tried): {', '.join(parts)}"


#: The outcome a step records for a watcher's final event status.
OUTCOMES = {
    "success": "succeeded",
    "failed": "failed",
    "guardrail": "guardrail",
    "timeout": "timeout",
    "error": "error",
}


def ended(steps: Sequence[Step], status: str, reason: str | None) -> list[Step]:
    """``steps`` with the last one ended by a watcher's final event ``status``."""
    if not steps:
        return []
    return [*steps[:-1], dataclasses.replace(steps[-1], outcome=OUTCOMES.get(status, status), reason=reason)]
