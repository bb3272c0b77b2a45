"""Follow every replica's log of one app through resumable cursors, and watch a job to its end.

Used wherever logs are streamed while a job runs (the CLI's ``run --wait --log``, the Airflow
worker wait, sensor and trigger): each read returns only lines not returned before, and
``cursors`` can be saved and handed to a new follower (another process, a resumed task) which
then repeats and misses nothing (docs/architecture.md, "Cursors").

The one watching path (docs/architecture.md, "The watching path"):

- A read takes at most ``batch_lines`` lines per replica (the rest waits in the file or
  stream) and moves nothing: the follower's cursors move past a batch only once the caller
  logged it (``advance``), so a reader interrupted between the two never skips a line.
- A running job's backlog is read batch after batch, at the speed of whoever logs them, for up
  to a time budget; then the caller looks at the status again and goes on at once.
- The drain rule: a terminal job is read until a read returns nothing (no time limit), so
  every line of a terminal job is logged exactly once.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, NamedTuple

from airflow_provider_torchx.core.specs import AppState, AppStatus

if TYPE_CHECKING:
    from airflow_provider_torchx.core.runner import Runner

#: At most this many lines of one replica are read at a time (one poll; a backlog in batches).
BATCH_LINES = 1000


class LogLine(NamedTuple):
    """One line of one replica (``line`` ends in ``"\\n"``)."""

    role: str
    k: int
    line: str

    def format(self) -> str:
        """``[role/k] line`` without the trailing newline, as shown in task logs."""
        return f"[{self.role}/{self.k}] {self.line.rstrip(chr(10))}"


class LogBatch(NamedTuple):
    """Lines read in one go, where each replica's reading stands after them, whether some
    replica returned a full batch (more may be waiting) and how many seconds the furthest
    behind replica's log lags (``LogChunk.behind_s``; None: not known)."""

    lines: list[LogLine]
    cursors: dict[str, str]
    more: bool
    behind_s: float | None = None


def replica_key(role: str, k: int) -> str:
    """The key of a replica's cursor: ``"role/k"``."""
    return f"{role}/{k}"


def keep_reading(batch: LogBatch, status: AppStatus, started: float, budget: float | None) -> bool:
    """Whether to read again at once after ``batch``: a terminal job until a read returns
    nothing (the drain rule); a running one while a replica has a backlog and ``budget``
    seconds since ``started`` (``time.monotonic()``) are not spent."""
    if status.is_terminal():
        return bool(batch.lines)
    return batch.more and (budget is None or time.monotonic() - started < budget)


#: Replica states in which nothing can have been logged yet (see ``replicas_to_read``).
_NOT_STARTED = frozenset({AppState.UNSUBMITTED, AppState.SUBMITTED, AppState.PENDING})


class LogFollower:
    """Reads new lines of every replica of ``app_handle``.

    ``cursors`` (a JSON-able ``{"role/k": cursor}``) says where each replica's reading stands;
    pass the saved dict back in to resume. Replicas are learnt from the app's status, so ones
    that appear late (a Batch job still starting) are picked up by a later read.
    """

    def __init__(
        self,
        runner: Runner,
        app_handle: str,
        cursors: Mapping[str, str] | None = None,
        max_lines_per_poll: int | None = BATCH_LINES,
    ) -> None:
        self.runner = runner
        self.app_handle = app_handle
        self.cursors: dict[str, str] = dict(cursors or {})
        self.max_lines_per_poll = max_lines_per_poll
        self._eof: dict[str, bool] = {}
        #: How far the log read so far lags the job's log, as the last batch said (seconds).
        self.behind_s: float | None = None

    @staticmethod
    def replicas_to_read(status: AppStatus) -> list[tuple[str, int]]:
        """``(role, k)`` of the replicas a read looks at: every replica of a terminal job (the
        drain rule); of a live one, those that may have written something. A replica not
        started yet has written nothing, and reading it still costs the backend a call (a
        Batch read waits for the status poller's next round): its lines, once there, are
        read by a later poll or by the drain. No cursor is skipped, so nothing is lost."""
        terminal = status.is_terminal()
        return [
            (role.role, rep.id)
            for role in status.roles
            for rep in role.replicas
            if terminal or rep.state not in _NOT_STARTED
        ]

    def read(self, status: AppStatus) -> LogBatch:
        """At most ``max_lines_per_poll`` new lines of each replica to read
        (``replicas_to_read``), in order per replica. Moves no cursor (see ``advance``);
        blocks on the backend's log reads."""
        lines: list[LogLine] = []
        cursors = dict(self.cursors)
        more = False
        behind: list[float] = []
        for role_name, k in self.replicas_to_read(status):
            key = replica_key(role_name, k)
            chunk = self.runner.read_log(
                self.app_handle, role_name, k, cursor=cursors.get(key), max_lines=self.max_lines_per_poll
            )
            cursors[key] = chunk.cursor
            self._eof[key] = chunk.eof
            lines.extend(LogLine(role_name, k, line) for line in chunk.lines)
            more = more or (self.max_lines_per_poll is not None and len(chunk.lines) >= self.max_lines_per_poll)
            if chunk.behind_s is not None:
                behind.append(chunk.behind_s)
        return LogBatch(lines, cursors, more, max(behind) if behind else None)

    def advance(self, batch: LogBatch) -> None:
        """Move the cursors past ``batch`` (once its lines were written out)."""
        self.cursors = dict(batch.cursors)
        self.behind_s = batch.behind_s

    def poll(self, status: AppStatus | None = None) -> list[LogLine]:
        """Read and advance at once: the new lines (at most ``max_lines_per_poll`` per
        replica). ``status`` (if the caller just fetched it) saves a status call."""
        status = status or self.runner.status(self.app_handle)
        if status is None:
            return []
        batch = self.read(status)
        self.advance(batch)
        return batch.lines

    @property
    def drained(self) -> bool:
        """Whether every replica seen so far reported the end of its log."""
        return bool(self._eof) and all(self._eof.values())


class JobWatch:
    """Follows one job for a synchronous watcher (the CLI, an Airflow worker or sensor):
    ``stream`` writes a status's new lines out through ``write`` batch by batch (the drain rule
    for a terminal job), ``wait`` waits for the end, streaming as it goes.

    ``write`` gets each batch's lines before the follower moves past them; ``on_advance`` (if
    given) is told the cursors after each written batch (e.g. to save them).
    """

    def __init__(
        self,
        runner: Runner,
        app_handle: str,
        write: Callable[[list[LogLine]], None],
        *,
        stream_logs: bool = True,
        cursors: Mapping[str, str] | None = None,
        batch_lines: int = BATCH_LINES,
    ) -> None:
        self.runner = runner
        self.app_handle = app_handle
        self.write = write
        self.follower = LogFollower(runner, app_handle, cursors, batch_lines) if stream_logs else None

    @property
    def behind_s(self) -> float | None:
        """How far the log written out lags the job's log (seconds; None: not known)."""
        return self.follower.behind_s if self.follower is not None else None

    def written(self, batch: LogBatch) -> None:
        """Called once ``batch`` was written out: moves the follower past it."""
        assert self.follower is not None
        self.follower.advance(batch)

    def stream(self, status: AppStatus | None, budget: float | None = None) -> bool:
        """Write out the lines written since the last read: every remaining one of a terminal
        job; of a running one, batches while a backlog remains, for up to ``budget`` seconds.
        Returns whether a backlog remains (then look at the status again without pausing)."""
        if self.follower is None or status is None:
            return False
        started = time.monotonic()
        while True:
            batch = self.follower.read(status)
            if batch.lines:
                self.write(batch.lines)
            self.written(batch)
            if not keep_reading(batch, status, started, budget):
                return batch.more and not status.is_terminal()

    def current_status(self) -> AppStatus | None:
        """The job's status now (None: no such job); one that ended without its scheduler
        recording it is settled first (``Runner.finalize``). Blocking."""
        status = self.runner.status(self.app_handle)
        if status is not None and status.is_terminal():
            return self.runner.finalize(self.app_handle) or status
        return status

    def wait(
        self,
        poll_interval: float,
        deadline: float | None = None,
        on_poll: Callable[[AppStatus], None] | None = None,
        cancel_on_signal: bool = False,
    ) -> AppStatus | None:
        """Wait for the job to end, streaming its lines; return its final status (None: no
        such job), or its last, running status once ``deadline`` (epoch seconds) passed.

        Pauses ``poll_interval`` between polls unless a backlog remains (a local job's end cuts
        the pause short); ``on_poll`` sees a running status at most once per ``poll_interval``.
        ``cancel_on_signal``: see ``Runner.wait``."""
        backlog = False
        next_note = time.monotonic() + poll_interval
        while True:
            pause = 0.0 if backlog else poll_interval
            if deadline is not None:
                pause = max(0.0, min(pause, deadline - time.time()))
            if pause > 0:
                status = self.runner.wait(
                    self.app_handle, wait_interval=pause, timeout=pause, cancel_on_signal=cancel_on_signal
                )
            else:
                status = self.current_status()
            backlog = self.stream(status, budget=poll_interval)
            if status is None or status.is_terminal():
                return status
            if deadline is not None and time.time() >= deadline:
                return status
            if on_poll is not None and time.monotonic() >= next_note:
                on_poll(status)
                next_note = time.monotonic() + poll_interval


def last_lines(runner: Runner, app_handle: str, role: str, k: int, n: int = 20) -> list[str]:
    """The last ``n`` lines of replica ``k`` of ``role`` (for failure messages); empty when the
    log cannot be read."""
    try:
        return list(collections.deque(runner.log_lines(app_handle, role, k), maxlen=n))
    except (ValueError, NotImplementedError):
        return []
