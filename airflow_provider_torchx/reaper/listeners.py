"""What Airflow announces: the listener hooks the UI plugin registers (``plugins/torchx.py``).

When a task instance is set failed or success (the api-server, for a state set through the
REST API or the UI; the scheduler, for a task it failed on heartbeat timeout) or a DAG run
ends, the listener in the api-server hands the task instance or run to a thread of its own,
which lists the live jobs carrying that identity and cancels those the table says to, at once
(no grace: a user set the state); in the scheduler it wakes the reconciling loop
(``loop.py``), which a scheduler's start starts. It never blocks the component that called it.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from airflow.listeners import hookimpl

from airflow_provider_torchx.core.clock import SYSTEM_CLOCK, Clock
from airflow_provider_torchx.core.identity import TaskIdentity
from airflow_provider_torchx.orphans import TaskView
from airflow_provider_torchx.reaper.decisions import Judged, apply
from airflow_provider_torchx.reaper.listing import live_jobs
from airflow_provider_torchx.reaper.loop import start_loop, stop_loop, wake_loop
from airflow_provider_torchx.reaper.settings import ReaperSettings, reaper_settings
from airflow_provider_torchx.reaper.views import read_task_views

log = logging.getLogger(__name__)

#: The component this process is, where it acts on what Airflow announces
#: (``serve_announcements``): ``"scheduler"`` or ``"api-server"``; None elsewhere.
_component: str | None = None
_announced: ThreadPoolExecutor | None = None
_announced_lock = threading.Lock()


def _when_scheduler(job: Any, timeout: float = 60.0, clock: Clock = SYSTEM_CLOCK) -> None:
    """``on_starting`` sees a ``Job`` before its runner names its type: wait for the type, and
    start the loop only for a scheduler. (Only sleeps and starts a process: nothing here
    imports or takes a lock the scheduler's forked workers could need.)"""
    deadline = clock.monotonic() + timeout
    while getattr(job, "job_type", None) in (None, "undefined") and clock.monotonic() < deadline:
        clock.sleep(0.2)
    if getattr(job, "job_type", None) == "SchedulerJob":
        serve_announcements("scheduler")
        start_loop()


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
    wanted: Callable[[TaskIdentity], bool], view: TaskView, where: str, clock: Clock = SYSTEM_CLOCK
) -> list[Judged]:
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
    views = {
        ident: dataclasses.replace(view, disowned=stored[ident].disowned)
        for job in jobs
        if (ident := job.identity) is not None  # ``wanted`` lists none without one
    }
    return apply(jobs, views, settings=ReaperSettings(True, 0.0), now=clock.wall(), where=where)


def _orm_task_instance(task_instance: Any) -> bool:
    """Whether a listener got the database's task instance (api-server, scheduler), not a task
    process's own (``RuntimeTaskInstance``: that process has no database, and its job is its own)."""
    return type(task_instance).__module__.startswith("airflow.models")


def _announce_task(task_instance: Any, clock: Clock = SYSTEM_CLOCK) -> None:
    """In the scheduler (heartbeat timeout, a run's end): wake the loop. Elsewhere (the
    api-server) a state Airflow announces was set through the REST API, by a user: apply the
    table at once on the reaper's thread (the state ended when it was announced)."""
    if not _orm_task_instance(task_instance):
        return
    ident = TaskIdentity(
        task_instance.dag_id, task_instance.task_id, task_instance.run_id, int(task_instance.map_index)
    )
    state = task_instance.state
    view = TaskView(
        dag_known=True,
        run_state="running",  # the listener knows the task's own state only: the run does not decide here
        found=True,
        state=None if state is None else str(getattr(state, "value", state)),
        try_number=int(task_instance.try_number or 0),
        ended_at=clock.wall(),
        marked=True,
    )
    if not wake_loop():
        _submit(reap_announced, lambda i: i == ident, view, f"announced by Airflow: task {view.state}")


def _announce_run(dag_run: Any, clock: Clock = SYSTEM_CLOCK) -> None:
    """``_announce_task`` for a DAG run that ended."""
    if not type(dag_run).__module__.startswith("airflow.models"):
        return
    dag_id, run_id, state = dag_run.dag_id, dag_run.run_id, str(getattr(dag_run.state, "value", dag_run.state))
    view = TaskView(dag_known=True, run_state=state, found=True, ended_at=clock.wall(), marked=True)
    if not wake_loop():
        _submit(
            reap_announced,
            lambda i: i.dag_id == dag_id and i.run_id == run_id,
            view,
            f"announced by Airflow: DAG run {state}",
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
    stop_loop()


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
