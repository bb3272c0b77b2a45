"""The one watching path of the Airflow layer: how a task follows its job to the end.

The worker-mode wait (``TorchXRunOperator``), the sensor's ``poke``, the trigger's ``run()``
and a resumed task's final flush all use ``TaskWatcher``, a ``JobWatch`` (``core/logstream.py``)
that logs into the task log. Every watcher, the CLI's too, follows the rules of
``WatchRules.next_action`` there (docs/architecture.md, "The watching path"):

- Each replica's new lines are logged as ``[role/k] line``, exactly once and in order, in
  batches of a bounded number of lines; the position (per-replica cursors) moves past a batch
  only once it was logged, and is saved to the task instance's cursor file
  (``core/cursors.py``) so that a restarted triggerer or a retried task goes on from there.
- A watcher that falls behind reads batch after batch at the speed of the logger; the drain
  rule: a terminal job's log is read until nothing is left, with no time limit.
- The outcome is one ``Outcome`` (``outcome.py``; a trigger's event carries its JSON form):
  ``success``, ``failed`` (with the reason and the failed replica's last lines), ``timeout``,
  ``guardrail`` or ``error``; a watch ``until_started`` ends ``started`` once the job left
  PENDING (a capacity ladder's task that does not wait for completion).

In the triggerer (``TaskWatcher.await_outcome``) nothing waits on a thread: a status comes
from the scheduler's own thread through a future (``Scheduler.describe_future``, the Batch
poller) or is read at once when cheap (local jobs); the blocking calls left (log reads,
CloudWatch, cursor files, failure tails) run on the provider's own bounded thread pool
(``watch_threads``), never on the loop's default executor, which every trigger of the
triggerer shares. Lines are logged
on the loop a few hundred at a time, yielding in between.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
import random
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeGuard, TypeVar

from airflow_provider_torchx._compat import conf
from airflow_provider_torchx.core.clock import SYSTEM_CLOCK, Clock
from airflow_provider_torchx.core.cursors import CursorFile, LogPosition, newest
from airflow_provider_torchx.core.errorfile import (
    EXTENSION_MODULES,
    SUMMARY_LINES,
    RootCause,
    failed_replica_note,
    find_root_cause,
)
from airflow_provider_torchx.core.errors import RecordRefusedError
from airflow_provider_torchx.core.failures import Failure, classify
from airflow_provider_torchx.core.guards import START_TIMEOUT, GuardrailTrippedError, Guards, Trip
from airflow_provider_torchx.core.identity import TaskIdentity
from airflow_provider_torchx.core.jobviews import used_so_far
from airflow_provider_torchx.core.logstream import (
    BATCH_LINES,
    PROGRESS_EVERY,
    Done,
    JobWatch,
    Log,
    LogBatch,
    LogLine,
    Look,
    Note,
    Read,
    Save,
    Tripped,
    WatchRules,
    last_lines,
    left_pending,
    replica_counts,
)
from airflow_provider_torchx.core.schedulers.api import CancelledBy, DescribeAppResponse
from airflow_provider_torchx.core.specs import AppState, AppStatus, ReplicaStatus, parse_app_handle
from airflow_provider_torchx.masking import MaskedLog, job_secrets, register_secrets
from airflow_provider_torchx.outcome import End, Failing, Outcome

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_torchx.core.runner import Runner

R = TypeVar("R")

#: How many lines of the failed replica's log a failure message carries.
FAILURE_TAIL_LINES = 20
#: Lines logged on the event loop between two yields to it.
EMIT_CHUNK = 200
#: The cursor file is saved at least this often (seconds) while a backlog is being logged.
SAVE_EVERY = 1.0
#: Pauses before reading a status again when the change descriptor fired but the status read
#: just after still shows the job live (a cancel records the end after the supervisor died).
SETTLE_DELAYS = (0.05, 0.1, 0.2, 0.4, 0.8)
#: Seconds the trigger's last logged lines get to reach the task log before its event (at most
#: the poll interval): the triggerer closes that log when the event is yielded.
LOG_SETTLE = 2.0
#: Default size of the provider's thread pool for blocking watch calls
#: (``[torchx] watch_threads``, env ``AIRFLOW__TORCHX__WATCH_THREADS``).
DEFAULT_WATCH_THREADS = 8

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def watch_threads() -> int:
    """The size of the watch thread pool: ``[torchx] watch_threads`` (at least 1)."""
    value = conf.getint("torchx", "watch_threads", fallback=DEFAULT_WATCH_THREADS)
    if value < 1:
        raise ValueError(f"[torchx] watch_threads: {value!r} must be >= 1")
    return int(value)


def watch_pool() -> ThreadPoolExecutor:
    """The process-wide pool that runs the watchers' blocking calls (created on first use)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=watch_threads(), thread_name_prefix="torchx-watch")
        return _pool


def close_watch_pool() -> None:
    """Shut the pool down (waiting for running calls); the next use makes a new one."""
    global _pool
    with _pool_lock:
        pool, _pool = _pool, None
    if pool is not None:
        pool.shutdown(wait=True)


async def run_blocking(fn: Callable[..., R], *args: Any) -> R:
    """``fn(*args)`` on the watch pool, awaited from the running loop."""
    return await asyncio.get_running_loop().run_in_executor(watch_pool(), functools.partial(fn, *args))


# ---------------------------------------------------------------------- small helpers


async def wait_readable(fd: int, timeout: float) -> bool:
    """Wait on the running loop until ``fd`` is readable or ``timeout`` seconds passed; whether
    it became readable (a loop that cannot watch descriptors just sleeps: False)."""
    loop = asyncio.get_running_loop()
    ready = asyncio.Event()
    try:
        loop.add_reader(fd, ready.set)
    except (NotImplementedError, OSError, ValueError):
        await asyncio.sleep(timeout)
        return False
    try:
        await asyncio.wait_for(ready.wait(), timeout)
        return True
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(fd)


def progress_line(
    app_handle: str,
    status: AppStatus,
    elapsed: float,
    behind_s: float | None = None,
    *,
    now: float | None = None,
) -> str:
    """``<handle> RUNNING: 2 replicas running, 1 done, 0 pending; elapsed 12s``, then what the
    job used so far at ``now`` (epoch seconds; ``; 0.0123 GPU-h, $0.03 so far``, the dollars
    where the job is priced), what the scheduler says of a job not ended yet (``; waiting for
    4 GPUs, ...``) and ``; log 40s behind`` when the log read lags by a second or more (a
    shared CloudWatch budget with many jobs watched)."""
    parts = ", ".join(f"{n} {what}" for what, n in replica_counts(status).items())
    why = f"; {status.msg}" if status.msg and not status.is_terminal() else ""
    lag = f"; log {behind_s:.0f}s behind" if behind_s is not None and behind_s >= 1.0 else ""
    used = _so_far(status, now)
    return f"{app_handle} {status.state.name}: replicas {parts}; elapsed {elapsed:.0f}s{used}{why}{lag}"


def _so_far(status: AppStatus, now: float | None) -> str:
    """``; 0.0123 GPU-h, $0.03 so far`` for a live job whose usage so far is known
    (``jobviews.used_so_far``); nothing otherwise."""
    usage = status.usage_so_far
    if usage is None or now is None or status.is_terminal():
        return ""
    used = used_so_far(usage, now)
    return f"; {used} so far" if used else ""


def task_identity(context: Context) -> TaskIdentity:
    """The task instance's identity (never the try number; ``core/identity.py``)."""
    ti = context["ti"]
    return TaskIdentity(ti.dag_id, ti.task_id, ti.run_id, -1 if ti.map_index is None else ti.map_index)


def cursor_file_for(runner: Runner, app_handle: str, identity: TaskIdentity) -> CursorFile:
    """The cursor file of task instance ``identity`` for ``app_handle``: beside the job when
    its scheduler keeps a sidecar dir, else under this host's state dir."""
    return CursorFile.locate(app_handle, identity, runner.sidecar_dir(app_handle))


def failing_of(root: RootCause | None, rep: ReplicaStatus | None) -> Failing | None:
    """Who failed, for the failure outcome's ``failing`` (``failures.failure_block``): the
    failing rank (torchrun's root cause: its replica, rank, exit code and error), else the
    failed replica and its exit code; None when neither is known."""
    if root is not None:
        return Failing(root.replica, root.rank, root.exit_code, root.error)
    if rep is not None:
        return Failing(f"{rep.role}/{rep.id}", None, rep.exit_code, None)
    return None


# ---------------------------------------------------------------------- the watcher


class TaskWatcher(JobWatch):
    """Follows one job for a task: logs its replicas' new lines into ``log`` (``[role/k]
    line``, once, in order per replica), keeps its reading ``position`` (saved to
    ``cursor_file`` when given) and turns its final status into an ``Outcome``.

    Synchronous callers (worker, sensor, flush) use ``stream``, ``wait_for_outcome`` and
    ``outcome``; the trigger uses ``await_outcome``. Both drive the same rules
    (``core/logstream.py``, ``WatchRules``). A read cut short by a cancellation is neither logged nor saved; a batch
    whose logging began is logged whole.
    """

    def __init__(
        self,
        runner: Runner,
        app_handle: str,
        log: logging.Logger | Any,
        *,
        stream_logs: bool,
        position: LogPosition | None = None,
        cursor_file: CursorFile | None = None,
        batch_lines: int = BATCH_LINES,
        clock: Clock = SYSTEM_CLOCK,
        guards: Guards | None = None,
        start_timeout_reason: str | None = None,
        until_started: bool = False,
    ) -> None:
        self.log = log
        #: Whether the watch ends once the job left PENDING (outcome ``started``).
        self.until_started = until_started
        self.guards = guards if guards is not None and guards.armed else None
        #: The reason a ``start_timeout`` trip's cancel gives, over the guard's own (a capacity
        #: ladder's move, naming the next rung: ``ladder.cancel_reason``).
        self.start_timeout_reason = start_timeout_reason
        self.position = position or LogPosition()
        super().__init__(
            runner,
            app_handle,
            self._log_lines,
            stream_logs=stream_logs,
            cursors=self.position.cursors,
            batch_lines=batch_lines,
            clock=clock,
        )
        self.cursor_file = cursor_file if stream_logs else None
        self.save_every = SAVE_EVERY if self.cursor_file is not None else None
        self._waited = False
        self._saved_seq = self.position.seq
        #: Set once the first round is over (its look, and its lines logged and saved) and the
        #: job goes on: what waits for it (the trigger's start check) then holds no line back.
        self.first_round = asyncio.Event()

    @property
    def cursors(self) -> dict[str, str] | None:
        """Where each replica's logged lines end (``None`` when not streaming)."""
        return dict(self.position.cursors) if self.follower else None

    def warn(self, text: str) -> None:
        """Say ``text`` as a warning in the task log."""
        self.log.warning("%s", text)

    def _log_lines(self, lines: list[LogLine]) -> None:
        info = self.log.info
        for line in lines:
            info("%s", line.format())

    def mark_logged(self, batch: LogBatch) -> None:
        """Move the follower and, if lines were logged, the position past ``batch``."""
        super().mark_logged(batch)
        if batch.lines:
            self.position = self.position.advanced(batch.cursors)

    def save(self) -> None:
        """Write the position to the cursor file if it moved since the last save."""
        if (
            self.cursor_file is not None
            and self.position.seq > self._saved_seq
            and self.cursor_file.save(self.position)
        ):
            self._saved_seq = self.position.seq

    def _progress(self, status: AppStatus, started_at: float | None) -> None:
        now = self.clock.wall()
        self.log.info(progress_line(self.app_handle, status, now - (started_at or now), self.behind_s, now=now))

    def wait_for_outcome(self, poll_interval: float, deadline: float | None, started_at: float) -> Outcome:
        """Wait in this thread for the job's end (or ``deadline``), streaming and logging
        progress lines; return the outcome."""
        try:
            status = self.wait(
                poll_interval, deadline, on_poll=functools.partial(self._progress, started_at=started_at)
            )
        except GuardrailTrippedError as e:
            return self.guardrail_outcome(e.trip)
        except RecordRefusedError as e:
            return self.refused_outcome(e)
        if self.started(status):
            return self.started_outcome(status)
        if status is None or status.is_terminal():
            return self.outcome(status)
        return self.timeout_outcome(status)

    # ------------------------------------------------------------------ the event loop

    async def current_status_async(self) -> AppStatus | None:
        """The job's status without holding a thread: from the scheduler's own thread
        (``Runner.status_on_loop``), read at once when cheap (a side-effect-free read), else on
        the watch pool. A job that ended unrecorded is settled on the pool (``finalize``)."""
        future = self.runner.status_on_loop(self.app_handle)
        if future is not None:
            status = await future
        elif self.runner.capabilities(parse_app_handle(self.app_handle).scheduler_backend).cheap_status:
            status = self.runner.status(self.app_handle)
        else:
            return await run_blocking(self.current_status)
        return await self._settled(status)

    async def _settled(self, status: AppStatus | None) -> AppStatus | None:
        """``status``, or for an ended job what settling it on the pool says (``finalize``)."""
        if status is not None and status.is_terminal():
            return await run_blocking(self.runner.finalize, self.app_handle) or status
        return status

    async def next_status_async(self, poll_interval: float, limit: float | None) -> AppStatus | None:
        """The job's status one poll on. Where the scheduler answers futures, its next
        scheduled look (``Runner.status_on_loop`` with a period): the scheduler sets the rhythm,
        so the job is looked at every ``poll_interval`` whatever this watcher's own latency,
        and the first look that sees the end answers at once; it raises ``TimeoutError`` once
        ``limit`` seconds passed without an answer. Otherwise the status is read after a wait
        of a poll (at most ``limit``): with the scheduler's change descriptor
        (``Runner.change_fd``; local jobs: the supervisor's pidfd) the wait is cut short when
        it becomes readable, and a job not ended then is read again after each of
        ``SETTLE_DELAYS`` until it has (its end's record may follow the change); without one (a local job's
        supervisor already gone) the status is read first, returned if the job ended, and read
        again after the wait. The first wait lasts a random half to whole poll, so that
        watchers started together (a triggerer's start) do not all wake in the same instant
        ever after."""
        future = self.runner.status_on_loop(self.app_handle, poll_interval)
        if future is not None:
            return await self._settled(await (future if limit is None else asyncio.wait_for(future, limit)))
        pause = max(0.0, poll_interval if limit is None else min(poll_interval, limit))
        if not self._waited:  # triggers started together (a triggerer's start) spread out
            self._waited = True
            pause *= random.uniform(0.5, 1.0)
        fd = self.runner.change_fd(self.app_handle)
        if fd is None:
            # No descriptor: the job may have ended since the last status (its supervisor
            # exited while this watcher was logging): read it now rather than a poll later.
            status = await self.current_status_async()
            if status is None or status.is_terminal():
                return status
            await asyncio.sleep(pause)
            return await self.current_status_async()
        try:
            changed = await wait_readable(fd, pause)
        finally:
            os.close(fd)
        status = await self.current_status_async()
        for delay in SETTLE_DELAYS if changed else ():
            if status is None or status.is_terminal():
                break
            await asyncio.sleep(delay)  # the end's record may be written just after the change
            status = await self.current_status_async()
        return status

    async def _read_async(self, status: AppStatus) -> LogBatch:
        """The next batch, read on the watch pool (without a hop when no replica is readable
        yet: a job still queued, say)."""
        assert self.follower is not None
        if not self.follower.replicas_to_read(status):
            return self.follower.read(status)  # reads nothing: no I/O
        return await run_blocking(self.follower.read, status)

    async def _log_async(self, batch: LogBatch) -> None:
        """Log ``batch`` on the loop ``EMIT_CHUNK`` lines at a time, yielding in between, and
        move past it. Cancelled meanwhile, it logs the rest of the batch before giving in, so
        the position stays exact (``await_outcome`` saves it)."""
        done = 0
        try:
            while done < len(batch.lines):
                self._log_lines(batch.lines[done : done + EMIT_CHUNK])
                done += EMIT_CHUNK
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            self._log_lines(batch.lines[done:])
            self.mark_logged(batch)
            raise
        self.mark_logged(batch)

    def trigger_rules(self, poll_interval: float, deadline: float | None) -> WatchRules:
        """The trigger's rules: those of a blocking watch, except that the round that finds
        the job ended (or the deadline passed) logs nothing, and the event waits until the
        last lines logged are ``min(poll, LOG_SETTLE)`` old. The triggerer closes the task's
        trigger log as soon as the event is yielded, and a line logged just before would land
        in the triggerer's own log; the event carries the position reached, and the resumed
        task's ``flush_logs`` logs the rest into the task log. A progress note whenever what it
        says changes, else every ``PROGRESS_EVERY`` seconds."""
        return WatchRules(
            poll=poll_interval,
            deadline=deadline,
            budget=poll_interval,
            reads=self.follower is not None,
            log_the_end=False,
            save_every=self.save_every,
            note_every=PROGRESS_EVERY,
            settle=min(poll_interval, LOG_SETTLE),
            guards=self.guards,
            until_started=self.until_started,
        )

    async def await_outcome(self, poll_interval: float, deadline: float | None, started_at: float | None) -> Outcome:
        """Follow the job on the running loop until it ends or ``deadline`` passes, by
        ``trigger_rules``; return the outcome. Looks every ``poll_interval``
        (``next_status_async``), at once while a log backlog remains; nothing holds a thread
        while waiting (module docstring)."""
        rules = self.trigger_rules(poll_interval, deadline)
        try:
            return await self._follow(rules, started_at)
        except asyncio.CancelledError:
            # Cancelled between a batch logged and its save (during a look or a read, say, when
            # the triggerer stops): save now, so that the next trigger goes on after the last
            # line logged, never before it (a line logged twice).
            self.save()
            raise

    async def _follow(self, rules: WatchRules, started_at: float | None) -> Outcome:
        clock = self.clock
        while True:
            action = rules.next_action(self.state, clock.monotonic(), clock.wall())
            if self.state.looked and isinstance(action, Look | Note):
                self.first_round.set()
            if isinstance(action, Look):
                status, timed_out, pause, limit = self.state.status, False, action.pause, action.limit
                del action  # not held while waiting: a look lasts a poll (``WatchState.looked_at``)
                if pause == 0:
                    status = await self.current_status_async()
                else:
                    try:
                        status = await self.next_status_async(pause, limit)
                    except TimeoutError:
                        timed_out = True
                self.looked_at(status, timed_out)
            elif isinstance(action, Read):
                self.state = self.state.read(await self._read_async(action.status))
            elif isinstance(action, Log):
                await self._log_async(action.batch)
                self.state = self.state.logged(clock.monotonic(), rules.settle)
            elif isinstance(action, Save):
                await run_blocking(self.save)
                self.state = self.state.saved(clock.monotonic())
            elif isinstance(action, Note):
                self._progress(action.status, started_at)
                self.state = self.state.noted_now(action.status, clock.monotonic(), rules.settle)
            elif isinstance(action, Tripped):
                return await run_blocking(self.guardrail_outcome, action.trip)
            elif isinstance(action, Done):
                if self.started(action.status):
                    return self.started_outcome(action.status)
                if action.status is not None and not action.ended:
                    return self.timeout_outcome(action.status)
                return await run_blocking(self.outcome, action.status)
            else:
                await asyncio.sleep(action.seconds)

    # ------------------------------------------------------------------ outcome

    def outcome(self, status: AppStatus | None) -> Outcome:
        """The outcome of a terminal (or vanished) job: ``success``, ``failed`` (with the
        reason and the failed replica's last lines), ``guardrail`` (the scheduler stopped the
        job for a guard it held itself: the outcome a watcher's trip gives) or ``error``.
        Blocks (reads the failed replica's log tail)."""
        if status is None:
            return self.ended(End.ERROR, message=f"no such job {self.app_handle}: the scheduler does not know it")
        if status.state == AppState.SUCCEEDED:
            return self.ended(End.SUCCESS, state=status.state, ui_url=status.ui_url)
        if status.guard_trip is not None:
            return self.tripped(status.guard_trip, status.guard_trip.message(self.app_handle))
        rep = status.failed_replica()
        tail: list[str] = []
        where = ""
        root = None
        if rep is not None:
            # read once: the message's tail, and where torchrun's summary is looked for
            lines = [
                line.rstrip("\n") for line in last_lines(self.runner, self.app_handle, rep.role, rep.id, SUMMARY_LINES)
            ]
            tail = lines[-FAILURE_TAIL_LINES:]
            root = find_root_cause(self.runner, self.app_handle, status, {(rep.role, rep.id): lines})
            where = failed_replica_note(rep, root)
        message = f"TorchX job {self.app_handle} ended {status.state.name}: {status.msg or 'no reason given'}{where}"
        failure = self.failure(status, root)
        shown, tail_of = root, None
        own = self.rank_tail(root)
        if root is not None and own:
            # One story: the failing rank, its code, then its own last lines (once, below),
            # not the replica's, whose last lines are its sibling ranks' collateral errors.
            shown, tail, tail_of = dataclasses.replace(root, stderr=()), own, f"rank {root.rank}'s stderr"
        return self.ended(
            End.FAILED,
            state=status.state,
            message=message,
            tail=tuple(tail),
            tail_of=tail_of,
            ui_url=status.ui_url,
            root_cause=shown.format() if shown else None,
            failing=failing_of(root, rep),
            failure=failure,
        )

    def rank_tail(self, root: RootCause | None) -> list[str]:
        """The failing rank's own last ``FAILURE_TAIL_LINES`` stderr lines, where the
        scheduler keeps them (``root.own_stderr``: ``Scheduler.rank_stderr``), faulthandler's
        list of modules left out; empty otherwise. Blocks."""
        if root is None or not root.own_stderr or root.local_rank is None:
            return []
        role, _, k = root.replica.rpartition("/")
        try:
            lines = self.runner.rank_stderr(self.app_handle, role, int(k), root.local_rank, FAILURE_TAIL_LINES + 1)
        except (ValueError, NotImplementedError, OSError):
            return []
        kept = [line.rstrip("\r\n") for line in lines or [] if line.strip()]
        return [line for line in kept if not line.startswith(EXTENSION_MODULES)][-FAILURE_TAIL_LINES:]

    def failure(self, status: AppStatus, root: RootCause | None) -> Failure | None:
        """The kind of the ended job's failure (``core/failures.py``), from its description (who
        cancelled it, its replicas' reasons and exit codes: what ``status`` has, where the
        scheduler no longer describes it) and its root cause. Blocks."""
        desc = self.runner.describe_app(self.app_handle)
        if desc is None:
            desc = DescribeAppResponse(state=status.state, msg=status.msg, roles_statuses=status.roles)
        return classify(desc, root)

    def guardrail_outcome(self, trip: Trip) -> Outcome:
        """Cancel the job for the guard that tripped and return the ``guardrail`` outcome, whose
        message says why (for ``start_timeout``, with the scheduler's account of what holds
        the job, asked for here, once: ``Runner.wait_reason``). Blocks."""
        why = ""
        if trip.guard == START_TIMEOUT:
            try:
                why = self.runner.wait_reason(self.app_handle)
            except Exception as e:  # the account is a courtesy: the guard acts regardless
                why = f"(could not ask the scheduler why: {type(e).__name__}: {e})"
        message = trip.message(self.app_handle, why)
        reason = f"guardrail {trip.guard}={trip.limit:g} tripped"
        if trip.guard == START_TIMEOUT and self.start_timeout_reason:
            reason = self.start_timeout_reason
        self.runner.cancel(self.app_handle, reason=reason, by=CancelledBy.TASK)
        return self.tripped(trip, message)

    def refused_outcome(self, refused: RecordRefusedError) -> Outcome:
        """The ``error`` outcome (``refused`` True) of a job whose record the scheduler refuses:
        it cannot be watched, yet it is still a job, so it is stopped first
        (``Runner.stop_refused``): the task never fails while its job may run. The task fails
        without retry (``refused_message``). Blocks."""
        reason = f"{self.app_handle} cannot be watched: its record is refused"
        stopped = self.runner.stop_refused(self.app_handle, reason=reason, by=CancelledBy.TASK)
        if self.cursor_file is not None:  # where a retry finds the job once its directory names no task
            CursorFile.locate(self.app_handle, self.cursor_file.identity, None).save(self.position)
        message = refused_message(self.app_handle, "watched", refused, stopped)
        return self.ended(End.ERROR, message=message, refused=True)

    def started(self, status: AppStatus | None) -> TypeGuard[AppStatus]:
        """Whether a watch ``until_started`` is over for the job in ``status``: it left PENDING."""
        return self.until_started and status is not None and left_pending(status)

    def started_outcome(self, status: AppStatus) -> Outcome:
        """The ``started`` outcome of a job that left PENDING (it runs, or it ended already)."""
        said = f": {status.msg}" if status.msg else ""
        message = f"TorchX job {self.app_handle} left PENDING: {status.state.name}{said}"
        return self.ended(End.STARTED, state=status.state, message=message)

    def timeout_outcome(self, status: AppStatus) -> Outcome:
        """The outcome of a job still running at its deadline."""
        message = f"TorchX job {self.app_handle} still {status.state.name} at its deadline"
        return self.ended(End.TIMEOUT, state=status.state, message=message)

    def tripped(self, trip: Trip, message: str) -> Outcome:
        """The ``guardrail`` outcome of ``trip`` (the job's state: the trip's)."""
        return self.ended(End.GUARDRAIL, state=trip.state, message=message, trip=trip)

    def ended(self, end: End, **fields: Any) -> Outcome:
        """An outcome ``end`` carrying the handle and the log position reached."""
        return Outcome(end, self.app_handle, self.position.seq, self.cursors, **fields)


def refused_message(app_handle: str, doing: str, refused: RecordRefusedError | str, stopped: bool) -> str:
    """Why a task fails, without retry, on its job whose record the scheduler refuses (or
    refused when a cancel stopped it: ``DescribeAppResponse.stopped_while_refused``, the
    refusal's words), once it was stopped (``Runner.stop_refused``: ``stopped`` says whether it
    ended in time). Not retried: a retry would find the same refused store, and the stopped
    job's usage cannot be read to carry its budget; whoever watches it (the trigger, the
    worker, a retry looking for a job to adopt: ``doing``) says the same."""
    what = "cancelled it" if stopped else "cancelled it, but it still ran when the wait for its end gave up"
    return (
        f"TorchX job {app_handle} cannot be {doing}: {refused}; {what}. Not retried: delete the job "
        f"(airflow-torchx delete {app_handle}) and clear the task to run it again"
    )


def flush_logs(
    runner: Runner, outcome: Outcome, log: logging.Logger | Any, cursor_file: CursorFile | None = None
) -> LogPosition:
    """Log what neither the outcome's position nor the cursor file's (the newer wins) covers
    yet (a resumed task's last lines: every line the trigger left to it, since it logs none in
    the round that finds the job ended); save and return the position reached. The job's
    secrets are registered first (this process did not build its app). An outcome without
    cursors (not streaming) logs nothing, nor one of a job whose record is refused
    (``refused_outcome``)."""
    position = newest(outcome.position, cursor_file.load() if cursor_file else None)
    if outcome.log_cursors is None or outcome.refused:  # nothing to read of a refused job
        return position
    app_handle = outcome.app_handle
    register_secrets(job_secrets(runner.describe, app_handle))
    watcher = TaskWatcher(
        runner, app_handle, MaskedLog(log), stream_logs=True, position=position, cursor_file=cursor_file
    )
    watcher.stream(watcher.current_status())
    return watcher.position
