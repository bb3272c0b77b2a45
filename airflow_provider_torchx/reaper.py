"""The reaper: cancels the jobs that outlived their task instance (``orphans.decide`` says which).

Two ways in, one rule (see "Orphaned jobs" in docs/architecture.md):

- **What Airflow announces.** The plugin registers this module as a listener. When a task
  instance is set failed or success (the api-server, for a state set through the REST API or
  the UI; the scheduler, for a task it failed on heartbeat timeout) or a DAG run ends, the
  listener in the api-server hands the task instance or run to a thread of its own, which
  lists the live jobs carrying that identity and cancels those the table says to, at once (no
  grace: a user set the state); in the scheduler it wakes the loop below. It never blocks the
  component that called it.
- **What it does not** (a task process's own failure report, such as an OOM-killed task's, goes
  through the execution API, which calls no listener). Beside the scheduler, in a process of
  its own that the scheduler starts (``main``), a reconciling loop lists,
  every ``RECONCILE_EVERY`` seconds, the live jobs with Airflow labels (one ``list_live`` per
  host-bound scheduler and per ``torchx`` connection of another scheduler: no per-job call),
  reads their task instances' and DAG runs' states in four batched queries of Airflow's
  database, and cancels what the table says once ``[torchx] orphan_grace`` has passed.

Local jobs are seen from the job store of the host the reaper runs on. ``[torchx]
cancel_orphaned_jobs = False`` turns both off (the UI still shows orphans as such).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from airflow.listeners import hookimpl

from airflow_provider_torchx._compat import conf
from airflow_provider_torchx.core.identity import TaskIdentity
from airflow_provider_torchx.core.specs import AppState
from airflow_provider_torchx.orphans import (
    DISOWNED_XCOM,
    Decision,
    JobView,
    TaskView,
    Verdict,
    decide,
)

log = logging.getLogger(__name__)

#: Seconds between two rounds of the reconciling loop (a round also runs when an orphan's
#: grace period ends, and when a listener wakes it).
RECONCILE_EVERY = 10.0
#: ``[torchx] orphan_grace``'s and ``cancel_orphaned_jobs``'s defaults (provider_info declares them).
DEFAULT_GRACE = 30.0
DEFAULT_ENABLED = True


@dataclass(frozen=True)
class ReaperSettings:
    """``[torchx] cancel_orphaned_jobs`` and ``[torchx] orphan_grace`` (seconds)."""

    enabled: bool
    grace: float


def reaper_settings() -> ReaperSettings:
    """The two settings, checked: a bad value raises ``ValueError`` naming the option."""
    enabled = conf.getboolean("torchx", "cancel_orphaned_jobs", fallback=DEFAULT_ENABLED)
    raw = conf.get("torchx", "orphan_grace", fallback=str(DEFAULT_GRACE))
    try:
        grace = float(raw)
    except ValueError:
        raise ValueError(f"[torchx] orphan_grace: {raw!r} is not a number of seconds (>= 0)") from None
    if grace < 0 or grace != grace:
        raise ValueError(f"[torchx] orphan_grace: {raw!r} must be a number of seconds >= 0")
    return ReaperSettings(bool(enabled), grace)


@dataclass(frozen=True)
class LiveJob:
    """A live job with Airflow labels, and where it was listed (``conn_id`` None: the job store
    of a host-bound scheduler)."""

    handle: str
    scheduler: str
    conn_id: str | None
    state: AppState
    labels: Mapping[str, str]
    created: float | None

    @property
    def identity(self) -> TaskIdentity:
        ident = TaskIdentity.from_labels(self.labels)
        assert ident is not None
        return ident


class ProblemLog:
    """Says each lasting problem once: a warning when a source's failure is new or its text
    changes, a debug line while it repeats, an info line when the source works again. The
    reconciling loop lists every source each round; a connection it cannot read would
    otherwise be warned of every ``RECONCILE_EVERY`` seconds."""

    def __init__(self) -> None:
        self._current: dict[str, str] = {}
        self._lock = threading.Lock()

    def failed(self, what: str, err: BaseException) -> None:
        """``what`` (``listing torchx_batch``) failed with ``err``."""
        text = f"{type(err).__name__}: {err}"
        with self._lock:
            repeated = self._current.get(what) == text
            self._current[what] = text
        if repeated:
            log.debug("orphaned jobs: %s still fails (%s)", what, text)
        else:
            log.warning("orphaned jobs: %s failed (%s); said again only if that changes", what, text)

    def worked(self, what: str) -> None:
        """``what`` succeeded (an info line if it had failed)."""
        with self._lock:
            had = self._current.pop(what, None)
        if had is not None:
            log.info("orphaned jobs: %s works again", what)


#: The problems of this process's listings (``live_jobs``).
problems = ProblemLog()


def live_jobs(wanted: Callable[[TaskIdentity], bool] | None = None) -> list[LiveJob]:
    """Every live job with Airflow labels (and, given ``wanted``, whose identity it accepts),
    from one ``list_live`` per source: each host-bound scheduler's job store and each ``torchx``
    connection of another scheduler. A source that fails is skipped, and said once
    (``problems``)."""
    from airflow_provider_torchx.sources import source_listings, torchx_connection_ids

    connections: list[str] = []
    try:
        connections = torchx_connection_ids()
    except Exception as e:
        problems.failed("listing the torchx connections", e)
    else:
        problems.worked("listing the torchx connections")
    found: dict[str, LiveJob] = {}
    for conn_id, scheduler, apps in source_listings(connections, live=True):
        what = f"listing {conn_id or 'the local job store'}"
        if isinstance(apps, Exception):
            problems.failed(what, apps)
            continue
        problems.worked(what)
        for app in apps:
            ident = TaskIdentity.from_labels(app.labels)
            if app.state.is_terminal() or ident is None or (wanted is not None and not wanted(ident)):
                continue
            found.setdefault(
                app.app_handle, LiveJob(app.app_handle, scheduler, conn_id, app.state, dict(app.labels), app.created)
            )
    return list(found.values())


def _epoch(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def read_task_views(identities: Iterable[TaskIdentity]) -> dict[TaskIdentity, TaskView]:
    """What Airflow's database says of each task instance (its DAG, run, state, and whether
    its try disowned the job), in four queries whatever the number of jobs. Raises when the
    database cannot be read."""
    from airflow.models.dag import DagModel
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    wanted = set(identities)
    if not wanted:
        return {}
    dag_ids = {i[0] for i in wanted}
    task_ids = {i[1] for i in wanted}
    run_ids = {i[2] for i in wanted}
    with create_session() as session:
        dags = set(session.scalars(select(DagModel.dag_id).where(DagModel.dag_id.in_(dag_ids))))
        runs = {
            (row.dag_id, row.run_id): (str(row.state) if row.state is not None else None, _epoch(row.end_date))
            for row in session.execute(
                select(DagRun.dag_id, DagRun.run_id, DagRun.state, DagRun.end_date).where(
                    DagRun.dag_id.in_(dag_ids), DagRun.run_id.in_(run_ids)
                )
            )
        }
        tis = {
            (row.dag_id, row.task_id, row.run_id, row.map_index): row
            for row in session.execute(
                select(
                    TaskInstance.dag_id,
                    TaskInstance.task_id,
                    TaskInstance.run_id,
                    TaskInstance.map_index,
                    TaskInstance.state,
                    TaskInstance.try_number,
                    TaskInstance.start_date,
                    TaskInstance.end_date,
                ).where(
                    TaskInstance.dag_id.in_(dag_ids),
                    TaskInstance.run_id.in_(run_ids),
                    TaskInstance.task_id.in_(task_ids),
                )
            )
        }
        disowned = {
            (row.dag_id, row.task_id, row.run_id, row.map_index)
            for row in session.execute(
                select(XComModel.dag_id, XComModel.task_id, XComModel.run_id, XComModel.map_index).where(
                    XComModel.key == DISOWNED_XCOM,
                    XComModel.dag_id.in_(dag_ids),
                    XComModel.run_id.in_(run_ids),
                    XComModel.task_id.in_(task_ids),
                )
            )
        }
    views = {}
    for ident in wanted:
        run = runs.get((ident[0], ident[2]))
        ti = tis.get(ident)
        if run is None or ti is None:
            views[ident] = TaskView(dag_known=ident[0] in dags, run_state=run[0] if run else None, found=False)
            continue
        views[ident] = TaskView(
            dag_known=True,
            run_state=run[0],
            found=True,
            state=None if ti.state is None else str(getattr(ti.state, "value", ti.state)),
            try_number=int(ti.try_number or 0),
            try_started_at=_epoch(ti.start_date),
            ended_at=_epoch(ti.end_date) or (run[1] if run[0] in ("failed", "success") else None),
            disowned=ident in disowned,
        )
    return views


def job_views(jobs: list[LiveJob]) -> list[tuple[LiveJob, JobView]]:
    """Each job with what the table needs of it, including its newest live sibling (another
    job of the same task instance)."""
    by_identity: dict[TaskIdentity, list[LiveJob]] = {}
    for job in jobs:
        by_identity.setdefault(job.identity, []).append(job)
    out = []
    for job in jobs:
        others = [o.created for o in by_identity[job.identity] if o is not job and o.created is not None]
        out.append((job, JobView(job.state, job.labels, job.created, max(others) if others else None)))
    return out


def cancel_orphan(job: LiveJob, decision: Decision, where: str) -> None:
    """Cancel ``job`` with the decision's reason in its status message; log it and count it
    (``torchx.job.orphan_cancelled``). Failures are logged: the next round tries again."""
    from airflow_provider_torchx.metrics import emit_orphan_cancelled
    from airflow_provider_torchx.sources import runner_for

    message = f"cancelled: {decision.detail}"
    try:
        runner_for(job.handle, job.conn_id).cancel(job.handle, reason=decision.detail)
    except Exception as e:
        log.warning("orphaned job %s: cancel failed (%s: %s); trying again later", job.handle, type(e).__name__, e)
        return
    log.warning("Cancelled orphaned job %s (%s): %s", job.handle, where, message)
    dag_id, task_id, _, _ = job.identity
    emit_orphan_cancelled(scheduler=job.scheduler, dag_id=dag_id, task_id=task_id, reason=str(decision.reason))


def apply(
    jobs: list[LiveJob],
    views: Mapping[TaskIdentity, TaskView] | None,
    *,
    settings: ReaperSettings,
    now: float,
    where: str,
    first_seen: dict[str, float] | None = None,
) -> list[tuple[LiveJob, Decision]]:
    """Decide for each job (``views`` None: the states could not be read) and cancel the
    orphans whose grace passed. ``first_seen`` (handle -> epoch seconds) is kept up to date
    for orphans without an end date. Returns every decision."""
    seen = first_seen if first_seen is not None else {}
    out = []
    for job, view in job_views(jobs):
        task = None if views is None else views.get(job.identity)
        decision = decide(
            task, view, enabled=settings.enabled, grace=settings.grace, now=now, first_seen=seen.get(job.handle)
        )
        if decision.orphaned:
            seen.setdefault(job.handle, now)
        if decision.verdict == Verdict.CANCEL:
            cancel_orphan(job, decision, where)
            seen.pop(job.handle, None)
        elif decision.verdict == Verdict.LATER and not decision.orphaned:
            log.debug("orphaned jobs: %s: asking again later (%s)", job.handle, decision.why)
        out.append((job, decision))
    for handle in set(seen) - {job.handle for job in jobs}:
        del seen[handle]
    return out


# ---------------------------------------------------------------------- the reconciling loop


class Reconciler:
    """The reconciling loop: a round every ``RECONCILE_EVERY`` seconds (sooner when an
    orphan's grace ends or a listener wakes it). Runs in the foreground of a process of its
    own (``main``), never as a thread of the scheduler: the scheduler forks task workers, and a
    fork while a thread of ours held an import or runner lock would leave the child stuck."""

    def __init__(self, every: float = RECONCILE_EVERY) -> None:
        self.every = every
        self._woken = False
        self._stopped = False
        self._first_seen: dict[str, float] = {}

    def wake(self) -> None:
        self._woken = True

    def stop(self) -> None:
        self._stopped = True

    def round(self) -> float:
        """One round; returns the seconds until the next one is due."""
        settings = reaper_settings()
        now = time.time()
        if not settings.enabled:
            return self.every
        jobs = live_jobs()
        try:
            views: Mapping[TaskIdentity, TaskView] | None = read_task_views({job.identity for job in jobs})
        except Exception as e:
            log.warning("orphaned jobs: could not read task instance states (%s: %s)", type(e).__name__, e)
            views = None
        decisions = apply(
            jobs, views, settings=settings, now=now, where="reconciling loop", first_seen=self._first_seen
        )
        due = [
            self._grace_end(job, views, settings.grace) - now
            for job, d in decisions
            if d.verdict == Verdict.LATER and d.orphaned
        ]
        return max(0.5, min([self.every, *due]))

    def _grace_end(self, job: LiveJob, views: Mapping[TaskIdentity, TaskView] | None, grace: float) -> float:
        """When the orphan ``job``'s grace period ends (from its task's end, else first seen)."""
        view = views.get(job.identity) if views else None
        start = (
            view.ended_at
            if view is not None and view.ended_at is not None
            else self._first_seen.get(job.handle, time.time())
        )
        return start + grace + 0.1

    def run(self, alive: Callable[[], bool]) -> None:
        """Rounds until ``stop`` or until ``alive()`` is false (checked every half second)."""
        log.info("orphaned jobs: reconciling loop started (every %.0fs)", self.every)
        while not self._stopped and alive():
            try:
                wait = self.round()
            except Exception:
                log.exception("orphaned jobs: a reconciling round failed")
                wait = self.every
            due = time.monotonic() + wait
            self._woken = False
            while time.monotonic() < due and not (self._woken or self._stopped) and alive():
                time.sleep(0.5)


def main(parent: int) -> None:
    """The loop's process: rounds until the scheduler ``parent`` is gone or SIGTERM; SIGUSR1
    (a listener in the scheduler) starts a round at once."""
    reconciler = Reconciler()
    signal.signal(signal.SIGUSR1, lambda *_: reconciler.wake())
    signal.signal(signal.SIGTERM, lambda *_: reconciler.stop())
    reconciler.run(alive=lambda: os.getppid() == parent)


class LoopProcess:
    """The reconciling loop's process, started with ``os.posix_spawn``: the scheduler is not
    forked and no pipe reports the exec. (``subprocess.Popen`` forks and then reads a pipe
    until the child execs; a process that another scheduler thread forks meanwhile, such as a
    LocalExecutor worker, keeps that pipe's write end, and the read then waits as long as the
    worker lives: docs/architecture.md, "The reconciling loop's start".)"""

    def __init__(self, argv: list[str]) -> None:
        stdin = [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)]
        self.pid = os.posix_spawn(argv[0], argv, os.environ, file_actions=stdin)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """The exit code once the process ended (reaped here), else None."""
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped by someone else: it ended
                self.returncode = -1
            else:
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` while the process runs (not reaped yet: the pid is still its own)."""
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)


_loop: LoopProcess | None = None
_loop_lock = threading.Lock()
#: The component this process is, where it acts on what Airflow announces
#: (``serve_announcements``): ``"scheduler"`` or ``"api-server"``; None elsewhere.
_component: str | None = None
_announced: ThreadPoolExecutor | None = None
_announced_lock = threading.Lock()


def start_loop() -> None:
    """Start the loop's process for this scheduler (once); it logs to the scheduler's output."""
    global _loop
    with _loop_lock:
        if _loop is None:
            code = f"from airflow_provider_torchx.reaper import main; main({os.getpid()})"
            _loop = LoopProcess([sys.executable, "-c", code])


def _when_scheduler(job: Any, timeout: float = 60.0) -> None:
    """``on_starting`` sees a ``Job`` before its runner names its type: wait for the type, and
    start the loop only for a scheduler. (Only sleeps and starts a process: nothing here
    imports or takes a lock the scheduler's forked workers could need.)"""
    deadline = time.monotonic() + timeout
    while getattr(job, "job_type", None) in (None, "undefined") and time.monotonic() < deadline:
        time.sleep(0.2)
    if getattr(job, "job_type", None) == "SchedulerJob":
        serve_announcements("scheduler")
        start_loop()


def _wake_loop() -> bool:
    """In the scheduler: ask the loop's process for a round now (True); elsewhere False."""
    loop = _loop
    if loop is None or loop.poll() is not None:
        return False
    loop.signal(signal.SIGUSR1)
    return True


# ---------------------------------------------------------------------- what Airflow announces


def serve_announcements(component: str) -> None:
    """Act on what Airflow announces in this process, ``component``: the scheduler (its job
    says so at start) or the api-server (the plugin's ``fastapi_apps``, which only it builds).
    Every other process that announces ends (``airflow dags test``, ``tasks test``, ...) needs
    no reaper: the component that runs its tasks cancels their jobs, and the scheduler's loop
    covers what is left."""
    global _component
    _component = component


def _has_task_sdk_channel() -> bool:
    """Whether this process talks to a Task SDK supervisor (a task process, a triggerer,
    ``dag.test()``): not the api-server or the scheduler, whose announcements the reaper acts on.
    A thread of ours must never use that channel (it is not thread-safe), and the reaping
    thread's reads (connections, masking) would."""
    task_runner = sys.modules.get("airflow.sdk.execution_time.task_runner")
    return getattr(task_runner, "SUPERVISOR_COMMS", None) is not None


def _submit(fn: Callable[..., object], *args: Any) -> None:
    """Run ``fn`` on the reaper's own thread (never the announcing component's); nothing in a
    process that is neither the api-server nor a scheduler (``serve_announcements``), nor in
    one with a Task SDK channel (the reconciling loop covers what is left there)."""
    global _announced
    if _component is None:
        log.debug("orphaned jobs: not reaping in this process (neither the api-server nor a scheduler)")
        return
    if _has_task_sdk_channel():
        log.debug("orphaned jobs: not reaping from a process with a Task SDK channel")
        return
    with _announced_lock:
        if _announced is None:
            _announced = ThreadPoolExecutor(max_workers=1, thread_name_prefix="torchx-reaper-announced")
        _announced.submit(_guarded, fn, *args)


def _guarded(fn: Callable[..., object], *args: Any) -> None:
    try:
        fn(*args)
    except Exception:
        log.exception("orphaned jobs: handling what Airflow announced failed")


def reap_announced(
    wanted: Callable[[TaskIdentity], bool], view: TaskView, where: str
) -> list[tuple[LiveJob, Decision]]:
    """Apply the table at once (no grace) to the live jobs ``wanted`` selects, with ``view``:
    the state Airflow just announced (whether a try disowned its job is read from the
    database; when it cannot be, nothing is decided here: the loop asks again)."""
    settings = reaper_settings()
    if not settings.enabled:
        return []
    jobs = live_jobs(wanted)
    if not jobs:
        return []
    try:
        stored = read_task_views({job.identity for job in jobs})
    except Exception as e:
        log.warning("orphaned jobs: could not read task instance states (%s: %s)", type(e).__name__, e)
        return []
    views = {job.identity: dataclasses.replace(view, disowned=stored[job.identity].disowned) for job in jobs}
    return apply(jobs, views, settings=ReaperSettings(True, 0.0), now=time.time(), where=where)


def orphans_among(jobs: list[LiveJob]) -> dict[str, str]:
    """``{handle: why}`` for the live ``jobs`` whose task instance ended (the UI marks them
    "orphaned" until they are cancelled), whatever the setting or the grace period say.
    Empty when the states cannot be read."""
    settings = reaper_settings()
    try:
        views = read_task_views({job.identity for job in jobs})
    except Exception as e:
        log.warning("orphaned jobs: could not read task instance states (%s: %s)", type(e).__name__, e)
        return {}
    now = time.time()
    out = {}
    for job, view in job_views(jobs):
        decision = decide(views.get(job.identity), view, enabled=settings.enabled, grace=settings.grace, now=now)
        if decision.orphaned:
            out[job.handle] = decision.detail
    return out


def start_decision(labels: Mapping[str, str], state: str | None) -> Decision:
    """The table's answer for a job whose task instance a trigger found in ``state`` when it
    started (no grace: the trigger cancels an orphan at once)."""
    settings = reaper_settings()
    view = TaskView(dag_known=True, run_state="running", found=True, state=state, ended_at=time.time())
    job = JobView(AppState.RUNNING, labels)
    return decide(view, job, enabled=settings.enabled, grace=0.0, now=time.time())


def _orm_task_instance(task_instance: Any) -> bool:
    """Whether a listener got the database's task instance (api-server, scheduler), not a task
    process's own (``RuntimeTaskInstance``: that process has no database, and its job is its own)."""
    return type(task_instance).__module__.startswith("airflow.models")


def _announce_task(task_instance: Any) -> None:
    """In the scheduler (heartbeat timeout, a run's end): wake the loop. Elsewhere (the
    api-server) a state Airflow announces was set through the REST API, by a user: apply the
    table at once on the reaper's thread."""
    if not _orm_task_instance(task_instance):
        return
    ident = (task_instance.dag_id, task_instance.task_id, task_instance.run_id, int(task_instance.map_index))
    state = task_instance.state
    view = TaskView(
        dag_known=True,
        run_state="running",  # the listener knows the task's own state only: the run does not decide here
        found=True,
        state=None if state is None else str(getattr(state, "value", state)),
        try_number=int(task_instance.try_number or 0),
        ended_at=time.time(),
        marked=True,
    )
    if not _wake_loop():
        _submit(reap_announced, lambda i: i == ident, view, f"announced by Airflow: task {view.state}")


def _announce_run(dag_run: Any) -> None:
    if not type(dag_run).__module__.startswith("airflow.models"):
        return
    dag_id, run_id, state = dag_run.dag_id, dag_run.run_id, str(getattr(dag_run.state, "value", dag_run.state))
    view = TaskView(dag_known=True, run_state=state, found=True, ended_at=time.time(), marked=True)
    if not _wake_loop():
        _submit(
            reap_announced, lambda i: i[0] == dag_id and i[2] == run_id, view, f"announced by Airflow: DAG run {state}"
        )


# ---------------------------------------------------------------------- listener hooks (plugins/torchx.py)


@hookimpl
def on_starting(component: Any) -> None:
    """A component starts: in a scheduler, start the reconciling loop (on a thread: the
    component's type is known only once its runner took it)."""
    if type(component).__name__ == "Job":
        threading.Thread(target=_when_scheduler, args=(component,), name="torchx-reaper-start", daemon=True).start()


@hookimpl
def before_stopping(component: Any) -> None:
    """The component stops: so does its loop."""
    if _loop is not None:
        _loop.signal(signal.SIGTERM)


@hookimpl
def on_task_instance_failed(previous_state: Any, task_instance: Any, error: Any) -> None:
    """A task instance failed (or went up for retry): apply the table to its jobs."""
    _announce_task(task_instance)


@hookimpl
def on_task_instance_success(previous_state: Any, task_instance: Any) -> None:
    """A task instance was set success (by a user: a job of its own ended with its task)."""
    _announce_task(task_instance)


@hookimpl
def on_dag_run_failed(dag_run: Any, msg: str) -> None:
    """A DAG run failed: apply the table to the jobs of its tasks."""
    _announce_run(dag_run)


@hookimpl
def on_dag_run_success(dag_run: Any, msg: str) -> None:
    """A DAG run succeeded (or was marked so): apply the table to the jobs of its tasks."""
    _announce_run(dag_run)
