"""The reconciling loop: beside the scheduler, in a process of its own (``main``), a round every
``RECONCILE_EVERY`` seconds lists the live jobs with Airflow labels (one ``list_live`` per
host-bound scheduler and per ``torchx`` connection of another scheduler: no per-job call), reads
their task instances' and DAG runs' states in four batched queries of Airflow's database, and
cancels what the table says once ``[torchx] orphan_grace`` has passed, and the jobs past a
``start_timeout`` their scheduler cannot hold (``reaper/guards.py``). It catches what Airflow
does not announce: a task process's own failure report (an OOM-killed task's) goes through the
execution API, which calls no listener. Local jobs are seen from the job store of the host the
loop runs on."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping

from airflow_provider_torchx.core.clock import SYSTEM_CLOCK, Clock
from airflow_provider_torchx.core.identity import TaskIdentity
from airflow_provider_torchx.orphans import TaskView, Verdict
from airflow_provider_torchx.reaper.decisions import apply
from airflow_provider_torchx.reaper.guards import hold_start_timeouts, next_due
from airflow_provider_torchx.reaper.listing import LiveJob, live_jobs
from airflow_provider_torchx.reaper.settings import reaper_settings
from airflow_provider_torchx.reaper.views import read_task_views, view_of

log = logging.getLogger(__name__)

#: Seconds between two rounds of the reconciling loop (a round also runs when an orphan's
#: grace period ends, and when a listener wakes it).
RECONCILE_EVERY = 10.0


class Reconciler:
    """The reconciling loop: a round every ``RECONCILE_EVERY`` seconds (sooner when an
    orphan's grace ends or a listener wakes it). Runs in the foreground of a process of its
    own (``main``), never as a thread of the scheduler: the scheduler forks task workers, and a
    fork while a thread of ours held an import or runner lock would leave the child stuck.
    ``clock``: where its rounds and grace periods take the time from."""

    def __init__(self, every: float = RECONCILE_EVERY, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.every = every
        self.clock = clock
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
        now = self.clock.wall()
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
        hold_start_timeouts(jobs, now, "reconciling loop")
        due = [
            self._grace_end(job, views, settings.grace, now) - now
            for job, d in decisions
            if d.verdict == Verdict.LATER and d.orphaned
        ]
        start_due = next_due(jobs, now)
        return max(0.5, min([self.every, *due, *([] if start_due is None else [start_due])]))

    def _grace_end(
        self, job: LiveJob, views: Mapping[TaskIdentity, TaskView] | None, grace: float, now: float
    ) -> float:
        """When the orphan ``job``'s grace period ends (from its task's end, else first seen;
        ``now`` if neither is known)."""
        view = view_of(views, job)
        start = (
            view.ended_at if view is not None and view.ended_at is not None else self._first_seen.get(job.handle, now)
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
            due = self.clock.monotonic() + wait
            self._woken = False
            while self.clock.monotonic() < due and not (self._woken or self._stopped) and alive():
                self.clock.sleep(0.5)


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


def start_loop() -> None:
    """Start the loop's process for this scheduler (once); it logs to the scheduler's output."""
    global _loop
    with _loop_lock:
        if _loop is None:
            code = f"from airflow_provider_torchx.reaper.loop import main; main({os.getpid()})"
            _loop = LoopProcess([sys.executable, "-c", code])


def wake_loop() -> bool:
    """In the scheduler: ask the loop's process for a round now (True); elsewhere False."""
    loop = _loop
    if loop is None or loop.poll() is not None:
        return False
    loop.signal(signal.SIGUSR1)
    return True


def stop_loop() -> None:
    """Ask the loop's process, if this process started one, to end (SIGTERM)."""
    if _loop is not None:
        _loop.signal(signal.SIGTERM)
