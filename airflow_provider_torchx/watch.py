"""The one watching path of the Airflow layer: how a task follows its job to the end.

The worker-mode wait (``TorchXRunOperator``), the sensor's ``poke``, the trigger's ``run()``
and a resumed task's final flush all use ``JobWatcher``; the CLI uses the same core primitive
(``core/logstream.py``: ``JobWatch``). They share one set of rules (docs/architecture.md, "The
watching path"):

- Each replica's new lines are logged as ``[role/k] line``, exactly once and in order, in
  batches of a bounded number of lines; the position (per-replica cursors) moves past a batch
  only once it was logged, and is saved to the task instance's cursor file
  (``core/cursors.py``) so that a restarted triggerer or a retried task goes on from there.
- A watcher that falls behind reads batch after batch at the speed of the logger; the drain
  rule: a terminal job's log is read until nothing is left, with no time limit.
- The outcome is one JSON-able event payload: ``success``, ``failed`` (with the reason and the
  failed replica's last lines), ``timeout`` or ``error``.

In the triggerer (``JobWatcher.watch``) nothing waits on a thread: a status comes from the
scheduler's own thread through a future (``Scheduler.describe_future``, the Batch poller) or is
read at once when cheap (local jobs); the blocking calls left (log reads, CloudWatch, cursor
files, failure tails) run on the provider's own bounded thread pool (``watch_threads``), never
on the loop's default executor, which every trigger of the triggerer shares. Lines are logged
on the loop a few hundred at a time, yielding in between.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from airflow_provider_torchx._compat import conf
from airflow_provider_torchx.core.cursors import CursorFile, LogPosition, newest
from airflow_provider_torchx.core.errorfile import SUMMARY_LINES, failed_replica_note, find_root_cause
from airflow_provider_torchx.core.identity import TaskIdentity
from airflow_provider_torchx.core.logstream import BATCH_LINES, JobWatch, LogBatch, LogLine, keep_reading, last_lines
from airflow_provider_torchx.core.specs import AppState, AppStatus, parse_app_handle
from airflow_provider_torchx.masking import MaskedLog, job_secrets, register_secrets

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
#: A job's progress line is logged when what it says changes, else at most this often (seconds).
PROGRESS_EVERY = 60.0
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


def replica_counts(status: AppStatus) -> dict[str, int]:
    """How many replicas of the job are running, done and pending."""
    counts = {"running": 0, "done": 0, "pending": 0}
    for role in status.roles:
        for rep in role.replicas:
            if rep.state.is_terminal():
                counts["done"] += 1
            elif rep.state == AppState.RUNNING:
                counts["running"] += 1
            else:
                counts["pending"] += 1
    return counts


def progress_line(app_handle: str, status: AppStatus, elapsed: float, behind_s: float | None = None) -> str:
    """``<handle> RUNNING: 2 replicas running, 1 done, 0 pending; elapsed 12s``, then what the
    scheduler says of a job not ended yet (``; waiting for 4 GPUs, ...``) and ``; log 40s
    behind`` when the log read lags by a second or more (a shared CloudWatch budget with many
    jobs watched)."""
    parts = ", ".join(f"{n} {what}" for what, n in replica_counts(status).items())
    why = f"; {status.msg}" if status.msg and not status.is_terminal() else ""
    lag = f"; log {behind_s:.0f}s behind" if behind_s is not None and behind_s >= 1.0 else ""
    return f"{app_handle} {status.state.name}: replicas {parts}; elapsed {elapsed:.0f}s{why}{lag}"


class ProgressNotes:
    """When a watcher logs a job's progress line: when what the line says of the job changes
    (its state, replica counts, the scheduler's message), else at most every ``every``
    seconds. With thousands of jobs watched, a line per job per poll was most of a
    triggerer's work for a trigger; ``clock`` (monotonic seconds) is injectable for tests."""

    def __init__(self, every: float = PROGRESS_EVERY, clock: Callable[[], float] = time.monotonic) -> None:
        self.every = every
        self.clock = clock
        self._said: tuple[Any, ...] | None = None
        self._at = 0.0

    def due(self, status: AppStatus) -> bool:
        """Whether to log ``status``'s progress line now (then it counts as logged)."""
        said = (status.state, tuple(replica_counts(status).values()), status.msg)
        now = self.clock()
        if said == self._said and now - self._at < self.every:
            return False
        self._said, self._at = said, now
        return True


def identity_labels(context: Context) -> dict[str, str]:
    """The task instance's identity (never the try number) as job labels (``core/identity.py``)."""
    ti = context["ti"]
    return TaskIdentity(ti.dag_id, ti.task_id, ti.run_id, -1 if ti.map_index is None else ti.map_index).labels()


def cursor_file_for(runner: Runner, app_handle: str, identity: Mapping[str, str]) -> CursorFile:
    """The cursor file of watcher ``identity`` (a task instance's labels) for ``app_handle``:
    beside the job when its scheduler keeps a sidecar dir, else under this host's state dir."""
    return CursorFile.locate(app_handle, identity, runner.sidecar_dir(app_handle))


def deadline_from(timeout_seconds: float | None) -> float | None:
    """An absolute deadline (epoch seconds) ``timeout_seconds`` from now."""
    return None if timeout_seconds is None else time.time() + timeout_seconds


def event_position(event: Mapping[str, Any]) -> LogPosition:
    """The log position an event carries (empty when it carries none)."""
    return LogPosition(seq=int(event.get("cursor_seq") or 0), cursors=dict(event.get("log_cursors") or {}))


def failure_message(event: Mapping[str, Any]) -> str:
    """The task's error text for a non-success event: the root cause (when torchrun reported
    one, ``core/errorfile.py``), the reason, then the log tail."""
    message = str(event.get("message") or f"TorchX job {event.get('app_handle')} did not succeed: {event}")
    if event.get("root_cause"):
        message = f"{event['root_cause']}\n{message}"
    tail = event.get("tail") or []
    if tail:
        message += f"\nLast {len(tail)} log lines:\n" + "\n".join(tail)
    return message


# ---------------------------------------------------------------------- the watcher


class JobWatcher(JobWatch):
    """Follows one job for a task: logs its replicas' new lines into ``log`` (``[role/k]
    line``, once, in order per replica), keeps its reading ``position`` (saved to
    ``cursor_file`` when given) and turns its final status into an outcome payload.

    Synchronous callers (worker, sensor, flush) use ``stream``, ``wait_outcome`` and
    ``outcome``; the trigger uses ``watch`` (see the module docstring). A read cut short by a
    cancellation is neither logged nor saved; a batch whose logging began is logged whole.
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
    ) -> None:
        self.log = log
        self.position = position or LogPosition()
        super().__init__(
            runner,
            app_handle,
            self._log_lines,
            stream_logs=stream_logs,
            cursors=self.position.cursors,
            batch_lines=batch_lines,
        )
        self.cursor_file = cursor_file if stream_logs else None
        self._waited = False
        self._saved_seq = self.position.seq
        self._saved_at = time.monotonic()

    @property
    def cursors(self) -> dict[str, str] | None:
        """Where each replica's logged lines end (``None`` when not streaming)."""
        return dict(self.position.cursors) if self.follower else None

    def _log_lines(self, lines: list[LogLine]) -> None:
        info = self.log.info
        for line in lines:
            info("%s", line.format())

    def _advance(self, batch: LogBatch) -> None:
        """Move the follower and, if lines were logged, the position past ``batch``."""
        super().written(batch)
        if batch.lines:
            self.position = self.position.advanced(batch.cursors)

    def _save_due(self) -> bool:
        return self.position.seq > self._saved_seq and time.monotonic() - self._saved_at >= SAVE_EVERY

    def written(self, batch: LogBatch) -> None:
        """After a batch was logged (synchronous path): advance; save now and then."""
        self._advance(batch)
        if self._save_due():
            self.save()

    def save(self) -> None:
        """Write the position to the cursor file if it moved since the last save."""
        self._saved_at = time.monotonic()
        if (
            self.cursor_file is not None
            and self.position.seq > self._saved_seq
            and self.cursor_file.save(self.position)
        ):
            self._saved_seq = self.position.seq

    def stream(self, status: AppStatus | None, budget: float | None = None) -> bool:
        """Log (and save) the lines written since the last read: all remaining ones of a
        terminal job (the drain rule); returns whether a backlog remains (see ``JobWatch``)."""
        try:
            return super().stream(status, budget)
        finally:
            self.save()

    def wait_outcome(self, poll_interval: float, deadline: float | None, started_at: float) -> dict[str, Any]:
        """Wait in this thread for the job's end (or ``deadline``), streaming and logging a
        progress line every ``poll_interval``; return the outcome event."""

        notes = ProgressNotes()

        def progress(status: AppStatus) -> None:
            if notes.due(status):
                self.log.info(progress_line(self.app_handle, status, time.time() - started_at, self.behind_s))

        status = self.wait(poll_interval, deadline, on_poll=progress)
        if status is None or status.is_terminal():
            return self.outcome(status)
        return self.timeout_event(status)

    # ------------------------------------------------------------------ the event loop

    async def status_async(self) -> AppStatus | None:
        """The job's status without holding a thread: from the scheduler's own thread
        (``Runner.status_future``), read at once when cheap (a side-effect-free read), else on
        the watch pool. A job that ended unrecorded is settled on the pool (``finalize``)."""
        future = self.runner.status_future(self.app_handle)
        if future is not None:
            status = await asyncio.wrap_future(future)
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
        scheduled look (``Runner.status_future`` with a period): the scheduler sets the rhythm,
        so the job is looked at every ``poll_interval`` whatever this watcher's own latency,
        and the first look that sees the end answers at once. Else after sleeping a poll.
        Else after a poll, cut short when the scheduler's change descriptor
        (``Runner.change_fd``; local jobs: the supervisor's pidfd) becomes readable, so that
        a local job's end is seen at once; without a descriptor (a local job's supervisor
        already gone) the status is read at once too, and after the poll if still live. The
        first such wait lasts a random half to whole poll, so that watchers started together
        (a triggerer's start) do not all wake in the same instant ever after. Raises
        ``TimeoutError`` once ``limit`` seconds passed without an answer (the future path; the
        other one returns a status then)."""
        future = self.runner.status_future(self.app_handle, poll_interval)
        if future is not None:
            return await self._settled(await asyncio.wait_for(asyncio.wrap_future(future), limit))
        pause = max(0.0, poll_interval if limit is None else min(poll_interval, limit))
        if not self._waited:  # triggers started together (a triggerer's start) spread out
            self._waited = True
            pause *= random.uniform(0.5, 1.0)
        fd = self.runner.change_fd(self.app_handle)
        if fd is None:
            # No descriptor: the job may have ended since the last status (its supervisor
            # exited while this watcher was logging): read it now rather than a poll later.
            status = await self.status_async()
            if status is None or status.is_terminal():
                return status
            await asyncio.sleep(pause)
            return await self.status_async()
        try:
            changed = await wait_readable(fd, pause)
        finally:
            os.close(fd)
        status = await self.status_async()
        for delay in SETTLE_DELAYS if changed else ():
            if status is None or status.is_terminal():
                break
            await asyncio.sleep(delay)  # the end's record may be written just after the change
            status = await self.status_async()
        return status

    async def stream_async(self, status: AppStatus | None, budget: float | None = None) -> bool:
        """``stream`` for the event loop: reads on the watch pool, logs on the loop
        ``EMIT_CHUNK`` lines at a time, saves on the pool. Cancelled while logging a batch,
        it logs the rest of that batch and saves before giving in, so the position stays
        exact."""
        if self.follower is None or status is None or not self.follower.replicas_to_read(status):
            return False  # nothing to read: no hop to the pool (a job still queued, say)
        follower = self.follower
        started = time.monotonic()
        while True:
            batch = await run_blocking(follower.read, status)
            done = 0
            try:
                while done < len(batch.lines):
                    self._log_lines(batch.lines[done : done + EMIT_CHUNK])
                    done += EMIT_CHUNK
                    await asyncio.sleep(0)
            except asyncio.CancelledError:
                self._log_lines(batch.lines[done:])
                self._advance(batch)
                self.save()
                raise
            self._advance(batch)
            if self._save_due():
                await run_blocking(self.save)
            if not keep_reading(batch, status, started, budget):
                break
        if self.cursor_file is not None and self.position.seq > self._saved_seq:
            await run_blocking(self.save)
        return batch.more and not status.is_terminal()

    async def watch(self, poll_interval: float, deadline: float | None, started_at: float | None) -> dict[str, Any]:
        """Follow the job on the running loop until it ends or ``deadline`` passes; return
        the outcome event. Looks every ``poll_interval`` (``next_status_async``), at once
        while a log backlog remains; logs progress lines as ``ProgressNotes`` says.

        The round that finds the job terminal (or the deadline passed) logs nothing: the
        triggerer closes the task's trigger log as soon as the event is yielded, and a line
        logged just before would land in the triggerer's own log. The event carries the
        position reached, and the resumed task's ``flush_logs`` logs the rest into the task
        log; the last lines logged here had ``LOG_SETTLE`` seconds to arrive before the event."""
        notes = ProgressNotes()
        settle = min(poll_interval, LOG_SETTLE)
        settled_at = 0.0  # when every line logged so far has had ``settle`` seconds to arrive
        timed_out = False
        status = await self.status_async()
        while True:
            now = time.time()
            if status is None or status.is_terminal() or timed_out or (deadline is not None and now >= deadline):
                await asyncio.sleep(max(settled_at - time.monotonic(), 0.0))
                if status is not None and not status.is_terminal():
                    return self.timeout_event(status)
                return await run_blocking(self.outcome, status)
            seq = self.position.seq
            backlog = await self.stream_async(status, budget=poll_interval)
            if self.position.seq != seq:
                settled_at = time.monotonic() + settle
            if notes.due(status):
                self.log.info(progress_line(self.app_handle, status, now - (started_at or now), self.behind_s))
                settled_at = time.monotonic() + settle
            if backlog:
                status = await self.status_async()
                continue
            try:
                status = await self.next_status_async(poll_interval, None if deadline is None else deadline - now)
            except TimeoutError:
                timed_out = True

    # ------------------------------------------------------------------ outcome

    def outcome(self, status: AppStatus | None) -> dict[str, Any]:
        """The final event payload of a terminal (or vanished) job: ``status`` is ``success``,
        ``failed`` (with the reason and the failed replica's last lines) or ``error``.
        Blocks (reads the failed replica's log tail)."""
        if status is None:
            return self.event("error", message=f"no such job {self.app_handle}: the scheduler does not know it")
        if status.state == AppState.SUCCEEDED:
            return self.event("success", state=status.state.name, ui_url=status.ui_url)
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
        return self.event(
            "failed",
            state=status.state.name,
            message=message,
            tail=tail,
            ui_url=status.ui_url,
            root_cause=root.format() if root else None,
        )

    def timeout_event(self, status: AppStatus) -> dict[str, Any]:
        """The event of a job still running at its deadline."""
        message = f"TorchX job {self.app_handle} still {status.state.name} at its deadline"
        return self.event("timeout", state=status.state.name, message=message)

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        """An event payload of ``kind`` carrying the handle and the log position."""
        payload: dict[str, Any] = {
            "status": kind,
            "app_handle": self.app_handle,
            "log_cursors": self.cursors,
            "cursor_seq": self.position.seq,
        }
        payload.update(fields)
        return payload


def flush_logs(
    runner: Runner, event: Mapping[str, Any], log: logging.Logger | Any, cursor_file: CursorFile | None = None
) -> LogPosition:
    """Log what neither the event's position nor the cursor file's (the newer wins) covers yet
    (a resumed task's last lines: every line the trigger left to it, since it logs none in the
    round that finds the job ended); save and return the position reached. The job's secrets
    are registered first (this process did not build its app). An event without cursors (not
    streaming) logs nothing."""
    position = newest(event_position(event), cursor_file.load() if cursor_file else None)
    if event.get("log_cursors") is None:
        return position
    app_handle = str(event["app_handle"])
    register_secrets(job_secrets(runner.describe, app_handle))
    watcher = JobWatcher(
        runner, app_handle, MaskedLog(log), stream_logs=True, position=position, cursor_file=cursor_file
    )
    watcher.stream(watcher.current_status())
    return watcher.position
