"""Which jobs to cancel automatically: the decision table, as one pure function.

A job the operator submitted carries its task instance's identity as labels (``airflow.dag_id``,
``airflow.task_id``, ``airflow.run_id``, ``airflow.map_index``; never the try number). Once that
task instance is in a state from which no try will adopt the job, the job is an orphan and is
cancelled; a job that a try will (or may) adopt is kept; when the task instance's state cannot be
read, the question is asked again later. The same table answers when the task's own kill or
cancel hook fires (``Killed``: the trigger's ``on_kill`` on Airflow >= 3.3, a trigger cancelled
on 3.1/3.2, the operator's ``on_kill`` in worker mode), so one function decides every automatic
cancel: the reaper (``reaper/``), the trigger's start check and its kill paths, and the
operator's ``on_kill`` feed ``decide`` what they know and apply its answer. Nothing here
imports Airflow, so every row is a unit test (``tests/airflow/test_orphans.py``).

The table (first matching row wins; "killed": ``decide(killed=...)`` was given):

================================================  ===========================================
job / task instance                               verdict
================================================  ===========================================
record refused, no identity labels readable       cancel ``record_refused`` (nothing can read
                                                  or watch it, whoever submitted it)
no ``airflow.*`` identity labels                  keep (not Airflow's: CLI, other tools)
job already ended                                 keep (nothing to cancel)
killed, ``cancel_on_kill=False``                  keep (never cancelled with its task)
state unreadable (API/DB down)                    later; killed in the trigger: later too (the
                                                  reaper looks again)
killed in the worker (the operator's              cancel ``killed`` at once (the kill is the
``on_kill``: no state at hand)                    user's intent; ``cancel_on_kill`` says so)
DAG unknown, or run found without this task       later (a label that names no task)
its try disowned it (``wait_for_completion=       keep (the job is meant to outlive its task,
False`` or ``cancel_on_kill=False``)              or never to be cancelled with it)
DAG run deleted                                   cancel ``dag_run_deleted``
task failed, success, skipped, removed,           cancel ``task_<state>`` (Airflow puts a task
upstream_failed                                   with retries left in up_for_retry, and never
                                                  retries one marked failed)
DAG run failed / success (task in any other       cancel ``dag_run_failed`` / ``dag_run_success``
state)
task running/deferred/queued/scheduled/... and    cancel ``superseded`` (cleared; the new try
a newer live job of the same task instance was    submitted another job instead of adopting
created during the current try                    this one)
up_for_retry, up_for_reschedule, scheduled,       keep (a try adopts it; killed and
queued, running, deferred, restarting, none       ``deferred``: a triggerer restart or
                                                  reassignment; killed and none or
                                                  ``restarting``: cleared, the next try adopts
                                                  the job or supersedes it)
any other state                                   later (unknown to this table)
================================================  ===========================================

A job whose record the scheduler refuses (``JobView.refused``: a file swapped for a symbolic
link, say) is still a job: with its labels still readable it goes through the rows as any
other (the task's own components stop it when they find its record refused, and a retry
stops it before it submits another); with none readable, nothing can read or watch it, and
its row cancels it whoever submitted it.

A "cancel" row waits ``grace`` seconds from the task's (or run's) end before it cancels (a
task marked failed and cleared again at once keeps its job), and is "keep" while
``cancel_orphaned_jobs`` is off; in both cases the job is still reported as an orphan (the UI
shows it so). Killed, a "cancel" row cancels at once whatever the setting says: the kill is the
user's intent, and ``cancel_on_kill`` governs it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from airflow_provider_torchx.core.identity import TaskIdentity
from airflow_provider_torchx.core.specs import AppState

#: The XCom key a try pushes when its job is not to end with the task: it returns while the
#: job runs on (``wait_for_completion=False``) or it never cancels (``cancel_on_kill=False``).
DISOWNED_XCOM = "torchx_disowned"
#: Task instance states from which a try adopts (or may adopt) a live job; ``None`` is
#: Airflow's "no state" (just cleared: its next try reattaches to the job).
ADOPTING_STATES = frozenset(
    {"up_for_retry", "up_for_reschedule", "scheduled", "queued", "running", "deferred", "restarting", None}
)
#: Task instance states in which a running try exists: only then can a newer job of the
#: same task instance be that try's own (and an older one no try's).
_ACTIVE_STATES = frozenset({"queued", "running", "deferred", "up_for_reschedule", "restarting"})
#: Task instance states after which no try will run again (until someone clears it).
ENDED_STATES = frozenset({"failed", "success", "skipped", "removed", "upstream_failed"})
#: DAG run states after which none of its tasks will run again.
ENDED_RUN_STATES = frozenset({"failed", "success"})


class Verdict(enum.Enum):
    """What to do with a job: leave it, cancel it, or look again next round."""

    KEEP = "keep"
    CANCEL = "cancel"
    LATER = "later"


@dataclass(frozen=True)
class TaskView:
    """What Airflow says of a job's task instance, read in one go.

    ``dag_known``: the DAG exists; ``run_state``: its DAG run's state (None: no such run);
    ``found``: the task instance exists in that run; ``state``: its state (None: no state);
    ``try_number``: its current try; ``try_started_at``: when that try started (epoch
    seconds; None: not yet); ``ended_at``: when the task instance, or else its run, ended;
    ``marked``: a user set the state (the REST API or the UI), as far as the caller knows;
    ``disowned``: the task's try said its job is not to end with it (``DISOWNED_XCOM``)."""

    dag_known: bool
    run_state: str | None
    found: bool
    state: str | None = None
    try_number: int = 0
    try_started_at: float | None = None
    ended_at: float | None = None
    marked: bool = False
    disowned: bool = False

    @classmethod
    def of_state(cls, state: str | None, *, marked: bool = False) -> TaskView:
        """What a trigger knows of its task instance: its ``state`` alone (the DAG, its run and
        the task instance exist: the task deferred to the trigger)."""
        return cls(dag_known=True, run_state="running", found=True, state=state, marked=marked)


@dataclass(frozen=True)
class JobView:
    """A live job as the scheduler listed it: ``identity``, the task instance its labels name
    (None: they name none). ``newest_sibling_created``: when the newest other live job
    carrying the same identity was submitted (None: there is none). ``refused``: why the
    scheduler refuses its record (``ListAppResponse.refused``; None: it was read)."""

    state: AppState
    identity: TaskIdentity | None
    created: float | None = None
    newest_sibling_created: float | None = None
    refused: str | None = None


@dataclass(frozen=True)
class Killed:
    """The task's own kill or cancel hook fired for the job. ``in_worker``: the operator's
    ``on_kill`` in worker mode, which has no task instance state at hand (``decide`` is given
    none, and cancels); else a trigger's (Airflow >= 3.3 ``on_kill``, or the trigger cancelled
    on 3.1/3.2), which reads the state and leaves the job to the reaper when it cannot.
    ``cancel_on_kill``: the task's setting (False: the job is never cancelled with its task)."""

    in_worker: bool = False
    cancel_on_kill: bool = True


@dataclass(frozen=True)
class Decision:
    """``verdict`` and, for an orphan (whatever the verdict), ``reason``: the metric tag
    (``task_failed``, ``dag_run_deleted``, ``superseded``, ...) and ``detail``: the sentence
    for the job's status message and the logs. ``why``: why it is kept or asked later."""

    verdict: Verdict
    reason: str | None = None
    detail: str = ""
    why: str = ""

    @property
    def orphaned(self) -> bool:
        """Whether the job outlived its task instance (cancelled now or soon, or not at all
        because cancelling is off)."""
        return self.reason is not None


def task_name(ident: TaskIdentity | None) -> str:
    """``task DAG.TASK of run RUN_ID`` (``TASK[i]`` when mapped), for messages; ``an
    unlabelled job`` for a job whose labels name no task instance."""
    if ident is None:
        return "an unlabelled job"
    mapped = f"[{ident.map_index}]" if ident.map_index >= 0 else ""
    return f"task {ident.dag_id}.{ident.task_id}{mapped} of run {ident.run_id}"


def _orphan(task: TaskView, job: JobView) -> tuple[str, str] | None:
    """``(reason, detail)`` when no try will adopt the job, else None."""
    who = task_name(job.identity)
    if task.run_state is None:
        return "dag_run_deleted", f"{who}: the DAG run was deleted"
    if task.state in ENDED_STATES:
        return f"task_{task.state}", f"{who} {'was marked' if task.marked else 'ended'} {task.state}"
    if task.run_state in ENDED_RUN_STATES:
        verb = "was marked" if task.marked else "ended"
        return f"dag_run_{task.run_state}", f"{who}: its DAG run {verb} {task.run_state}"
    newer = job.newest_sibling_created
    if (
        task.state in _ACTIVE_STATES
        and newer is not None
        and (job.created is None or newer > job.created)
        and task.try_started_at is not None
        and newer >= task.try_started_at
    ):
        return "superseded", f"{who}: its try {task.try_number} submitted another job instead of adopting this one"
    return None


def decide(
    task: TaskView | None,
    job: JobView,
    *,
    enabled: bool,
    grace: float,
    now: float,
    first_seen: float | None = None,
    killed: Killed | None = None,
) -> Decision:
    """The decision table of the module docstring for one live ``job``.

    ``task``: what Airflow says of its task instance, None when that could not be read (or
    the job names none); ``enabled``: ``[torchx] cancel_orphaned_jobs``; ``grace``:
    ``[torchx] orphan_grace`` seconds, counted from ``task.ended_at``, else from
    ``first_seen`` (when the caller first saw the job orphaned), else from ``now``;
    ``killed``: the task's own kill or cancel hook fired (None: the reaper or a trigger's
    start check asks)."""
    if job.identity is None:
        if job.refused is None:
            return Decision(Verdict.KEEP, why="no Airflow task instance labels")
        detail = f"its record is refused and names no task instance, so nothing can watch it ({job.refused})"
        return _after_grace("record_refused", detail, enabled=enabled, grace=grace, now=now, since=first_seen)
    if job.state.is_terminal():
        return Decision(Verdict.KEEP, why=f"already {job.state.name}")
    if killed is not None and not killed.cancel_on_kill:
        return Decision(Verdict.KEEP, why="killed, but its task has cancel_on_kill=False")
    if task is None:
        if killed is not None and killed.in_worker:
            return Decision(Verdict.CANCEL, "killed", f"{task_name(job.identity)} was killed")
        return Decision(Verdict.LATER, why="the task instance's state could not be read")
    if not task.dag_known:
        return Decision(Verdict.LATER, why="its labels name no known DAG")
    if task.run_state is not None and not task.found:
        return Decision(Verdict.LATER, why="its labels name no task of that DAG run")
    if task.disowned:
        return Decision(Verdict.KEEP, why="its task disowned it (wait_for_completion=False or cancel_on_kill=False)")
    orphan = _orphan(task, job)
    if orphan is None:
        if killed is not None and task.state == "deferred":
            return Decision(Verdict.KEEP, why="task instance still deferred: a triggerer restart or reassignment")
        if task.state in ADOPTING_STATES:
            return Decision(Verdict.KEEP, why=f"task instance {task.state or 'has no state'}: a try adopts the job")
        return Decision(Verdict.LATER, why=f"task instance state {task.state!r} is not in the table")
    reason, detail = orphan
    if killed is not None:
        return Decision(Verdict.CANCEL, reason, detail)
    since = task.ended_at if task.ended_at is not None else first_seen
    return _after_grace(reason, detail, enabled=enabled, grace=grace, now=now, since=since)


def _after_grace(reason: str, detail: str, *, enabled: bool, grace: float, now: float, since: float | None) -> Decision:
    """A "cancel" row's verdict: cancel once ``grace`` seconds passed ``since`` (None: now),
    keep while cancelling is off (``enabled`` False); either way the job is an orphan."""
    if not enabled:
        return Decision(Verdict.KEEP, reason, detail, why="[torchx] cancel_orphaned_jobs is off")
    if now - (since if since is not None else now) < grace:
        return Decision(Verdict.LATER, reason, detail, why=f"within the {grace:g}s grace period")
    return Decision(Verdict.CANCEL, reason, detail)
