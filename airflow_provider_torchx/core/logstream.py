"""Follow every replica's log of one app through resumable cursors, and watch a job to its end.

Used wherever a job is watched (``Runner.wait``, the CLI's ``run --wait --log`` and
``log --tail``, the Airflow worker wait, sensor and trigger): each read returns only lines not
returned before, and ``cursors`` can be saved and handed to a new follower (another process, a
resumed task) which then repeats and misses nothing (docs/architecture.md, "Cursors").

The watching rules live in one place, ``WatchRules.next_action``: a pure function from what a
watcher knows (``WatchState``) to what it does next (look at the status, read, log a batch,
save, note progress, pause, or stop). ``JobWatch`` drives it with blocking calls; the Airflow
trigger (``watch.py``) drives the same rules on an event loop. The rules
(docs/architecture.md, "The watching path"):

- A read takes at most ``batch_lines`` lines per replica (the rest waits in the file or
  stream) and moves nothing: the follower's cursors move past a batch only once the caller
  logged it, so a reader interrupted between the two never skips a line.
- A running job's backlog is read batch after batch, at the speed of whoever logs them, for up
  to a time budget; then the watcher looks at the status again at once.
- The drain rule: a terminal job is read until a read returns nothing (no time limit), so
  every line of a terminal job is logged exactly once.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import math
import os
import signal
import threading
from collections.abc import Callable, Collection, Hashable, Iterator, Mapping
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any, NamedTuple

from airflow_provider_torchx.core.clock import SYSTEM_CLOCK, Clock
from airflow_provider_torchx.core.errors import SignalException
from airflow_provider_torchx.core.guards import GuardrailTrippedError, Guards, Trip, has_started
from airflow_provider_torchx.core.specs import AppState, AppStatus

if TYPE_CHECKING:
    from airflow_provider_torchx.core.runner import Runner
    from airflow_provider_torchx.core.schedulers.api import Stream

log = logging.getLogger(__name__)

#: At most this many lines of one replica are read at a time (one poll; a backlog in batches).
BATCH_LINES = 1000
#: A job's progress note is due at the look that sees what it says change, else at the first
#: look this many seconds after the last note: at least once a minute while looks are more
#: frequent, each look when they are rarer (docs/behaviour.md, "Progress lines").
PROGRESS_EVERY = 60.0


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


def keep_reading(batch: LogBatch, status: AppStatus, started: float, budget: float | None, now: float) -> bool:
    """Whether to read again at once after ``batch``: a terminal job until a read returns
    nothing (the drain rule); a running one while a replica has a backlog and ``budget``
    seconds since ``started`` are not spent at ``now`` (both monotonic seconds)."""
    if status.is_terminal():
        return bool(batch.lines)
    return batch.more and (budget is None or now - started < budget)


def left_pending(status: AppStatus) -> bool:
    """Whether the job left PENDING: it started (``guards.has_started``, the start that
    ``start_timeout`` waits for) or it ended."""
    return status.is_terminal() or has_started(status)


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


def progress_key(status: AppStatus) -> Hashable:
    """What a progress note says of a job: its state, replica counts and the scheduler's
    message (a note is due when this changes)."""
    return (status.state, tuple(replica_counts(status).values()), status.msg)


#: Replica states in which nothing can have been logged yet (see ``replicas_to_read``).
_NOT_STARTED = frozenset({AppState.UNSUBMITTED, AppState.SUBMITTED, AppState.PENDING})


class LogFollower:
    """Reads new lines of the replicas of ``app_handle``.

    ``cursors`` (a JSON-able ``{"role/k": cursor}``) says where each replica's reading stands;
    pass the saved dict back in to resume. Replicas are learnt from the app's status, so ones
    that appear late (a Batch job still starting) are picked up by a later read. ``replicas``
    (``(role, k)`` pairs) narrows the reading to those; ``streams`` picks the output.
    """

    def __init__(
        self,
        runner: Runner,
        app_handle: str,
        cursors: Mapping[str, str] | None = None,
        max_lines_per_poll: int | None = BATCH_LINES,
        *,
        replicas: Collection[tuple[str, int]] | None = None,
        streams: Stream | None = None,
    ) -> None:
        self.runner = runner
        self.app_handle = app_handle
        self.cursors: dict[str, str] = dict(cursors or {})
        self.max_lines_per_poll = max_lines_per_poll
        self.replicas = None if replicas is None else frozenset(replicas)
        self.streams = streams
        self._eof: dict[str, bool] = {}
        #: How far the log read so far lags the job's log, as the last batch said (seconds).
        self.behind_s: float | None = None
        self._unread: LogBatch | None = None

    def replicas_to_read(self, status: AppStatus) -> list[tuple[str, int]]:
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
            if (terminal or rep.state not in _NOT_STARTED)
            and (self.replicas is None or (role.role, rep.id) in self.replicas)
        ]

    def read(self, status: AppStatus) -> LogBatch:
        """At most ``max_lines_per_poll`` new lines of each replica to read
        (``replicas_to_read``), in order per replica. Moves no cursor (see ``advance``);
        blocks on the backend's log reads. A read of no replica (a job still queued) answers
        the same batch until the position moves (see ``WatchState.looked_at``)."""
        to_read = self.replicas_to_read(status)
        if not to_read:
            unread = self._unread
            if unread is None or unread.cursors is not self.cursors or unread.behind_s != self.behind_s:
                unread = self._unread = LogBatch([], self.cursors, False, self.behind_s)
            return unread
        lines: list[LogLine] = []
        cursors = dict(self.cursors)
        more = False
        behind: list[float] = []
        for role_name, k in to_read:
            key = replica_key(role_name, k)
            chunk = self.runner.read_log(
                self.app_handle,
                role_name,
                k,
                cursor=cursors.get(key),
                streams=self.streams,
                max_lines=self.max_lines_per_poll,
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
        if batch.cursors is not self.cursors:
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


# ---------------------------------------------------------------------- the watching rules


@dataclass(frozen=True)
class Look:
    """Take the job's status: at once (``pause`` 0) or one poll on, the wait cut short when the
    scheduler says the job may have changed; ``limit``: seconds left to the deadline."""

    pause: float
    limit: float | None


@dataclass(frozen=True)
class Read:
    """Read the next batch of lines of the job in ``status`` (``LogFollower.read``)."""

    status: AppStatus


@dataclass(frozen=True)
class Log:
    """Log ``batch``'s lines (there may be none), then move past it (``JobWatch.mark_logged``)."""

    batch: LogBatch


@dataclass(frozen=True)
class Save:
    """Save the position reached (``JobWatch.save``)."""


@dataclass(frozen=True)
class Note:
    """Say how the job is doing (a progress line, a state change)."""

    status: AppStatus


@dataclass(frozen=True)
class Pause:
    """Wait ``seconds`` before going on (the last logged lines settle)."""

    seconds: float


@dataclass(frozen=True)
class Done:
    """The watch is over: the job ended (``status`` terminal; None: no such job), the
    deadline passed with the job still live, or it left PENDING (``WatchRules.until_started``)."""

    status: AppStatus | None

    @property
    def ended(self) -> bool:
        """Whether the job ended (else it is live: the deadline passed, or it started)."""
        return self.status is None or self.status.is_terminal()


@dataclass(frozen=True)
class Tripped:
    """A guard tripped (``core/guards.py``): the watcher cancels the job and stops."""

    trip: Trip


Action = Look | Read | Log | Save | Note | Pause | Done | Tripped


@dataclass(frozen=True)
class WatchState:
    """What a watcher knows: the last ``status`` (``looked``: there was a look; then None is
    "no such job") and whether that look ran out of time; when reading its lines began
    (``round_at``, monotonic); the batch read and not yet logged (``pending``) and the last
    one logged in this round (``last``); whether lines were logged since the last save and
    when that was; when the lines logged so far have settled; what the last progress note said
    and when. Every change makes a new state (the methods below); nothing here does I/O."""

    status: AppStatus | None = None
    looked: bool = False
    timed_out: bool = False
    round_at: float = 0.0
    pending: LogBatch | None = None
    last: LogBatch | None = None
    unsaved: bool = False
    saved_at: float = 0.0
    settled_at: float = -math.inf
    noted: Hashable | None = None
    noted_at: float = -math.inf

    @property
    def backlog(self) -> bool:
        """Whether the last batch of a live job said more lines are waiting."""
        return self.last is not None and self.last.more and self.status is not None and not self.status.is_terminal()

    def looked_at(self, status: AppStatus | None, now: float, timed_out: bool = False) -> WatchState:
        """After a look: ``status`` (``timed_out``: the look ran past the deadline and
        ``status`` is the previous one); a new round of reading begins at ``now``. A status
        equal to the last one is not kept, the last one is: a state lives until the next look,
        a poll on, and in a triggerer watching thousands of jobs the objects that outlive the
        collector's young generations bring on the full collections that hold its loop."""
        if status is not None and status == self.status:
            status = self.status
        return self._but(status=status, looked=True, timed_out=timed_out, round_at=now, pending=None, last=None)

    def read(self, batch: LogBatch) -> WatchState:
        """After a read: ``batch`` waits to be logged."""
        return self._but(pending=batch)

    def logged(self, now: float, settle: float) -> WatchState:
        """After the pending batch was logged at ``now``: its lines settle for ``settle`` s."""
        batch = self.pending
        assert batch is not None
        lines = bool(batch.lines)
        return self._but(
            pending=None,
            last=batch,
            unsaved=self.unsaved or lines,
            settled_at=now + settle if lines else self.settled_at,
        )

    def saved(self, now: float) -> WatchState:
        """After the position was saved at ``now``."""
        return self._but(unsaved=False, saved_at=now)

    def noted_now(self, status: AppStatus, now: float, settle: float) -> WatchState:
        """After a progress note on ``status`` at ``now`` (it settles as lines do)."""
        return self._but(noted=progress_key(status), noted_at=now, settled_at=now + settle)

    def _but(self, **changes: Any) -> WatchState:
        """A copy with ``changes``: ``dataclasses.replace`` without its field checks on every
        call, a cost a busy triggerer's loop feels (several changes a look; benchmarks/README.md,
        "Costs measured in passing"); this state has no ``__post_init__`` and no init-only
        field."""
        new = object.__new__(WatchState)
        new.__dict__.update(self.__dict__, **changes)
        return new


@dataclass(frozen=True)
class WatchRules:
    """How a watcher follows a job; ``next_action`` applies them.

    - ``poll``: seconds between two looks at a live job without a backlog (the first look,
      and a look after a round that left a backlog, are at once); ``deadline`` (epoch
      seconds): the watch ends then, the job still live.
    - ``budget``: seconds a round spends reading a live job's backlog (None: no limit); a
      terminal job is read until a read returns nothing (the drain rule).
    - ``reads``: whether lines are read at all.
    - ``log_the_end``: the round that finds the job ended (or the deadline passed) drains
      its log; when False it reads nothing, and the end waits until the last lines logged
      are ``settle`` seconds old (the trigger: whoever resumes logs the rest).
    - ``save_every``: the position is saved after a batch at most this often, and at the end
      of every round that logged lines (None: never).
    - ``note_every``: a progress note when what it says changes (``progress_key``), else this
      often, and at most every ``note_gap`` seconds (None: no notes).
    - ``guards``: checked once a round, on the status that round looked at, after its lines
      were logged (and have settled); a trip ends the watch (``Tripped``).
    - ``until_started``: the watch ends once the job left PENDING (``left_pending``), not at
      its end (a capacity ladder's task that does not wait for completion).
    """

    poll: float
    deadline: float | None = None
    budget: float | None = None
    reads: bool = True
    log_the_end: bool = True
    save_every: float | None = None
    note_every: float | None = None
    note_gap: float = 0.0
    settle: float = 0.0
    guards: Guards | None = None
    until_started: bool = False

    def ending(self, state: WatchState, wall: float) -> bool:
        """Whether the watch ends with this round: the job ended or vanished, or the deadline
        passed (``wall``: epoch seconds now); with ``until_started``, once the job left PENDING."""
        status = state.status
        return (
            status is None
            or status.is_terminal()
            or (self.until_started and left_pending(status))
            or state.timed_out
            or (self.deadline is not None and wall >= self.deadline)
        )

    def next_action(self, state: WatchState, now: float, wall: float) -> Action:
        """What to do next, from ``state`` at ``now`` (monotonic) and ``wall`` (epoch)."""
        if not state.looked:
            return Look(0.0, self._limit(wall))
        if state.pending is not None:
            return Log(state.pending)
        status = state.status
        if state.last is None:  # nothing read yet this round
            if self.ending(state, wall) and not self.log_the_end:
                return self._finish(state, now)
            if self.reads and status is not None:
                return Read(status)
        else:
            assert status is not None
            if self._save_due(state, now):
                return Save()
            if keep_reading(state.last, status, state.round_at, self.budget, now):
                return Read(status)
        if state.unsaved and self.save_every is not None:
            return Save()
        if self.ending(state, wall):
            return self._finish(state, now)
        assert status is not None
        trip = self.guards.check(status, wall) if self.guards is not None else None
        if trip is not None:
            return Pause(state.settled_at - now) if state.settled_at > now else Tripped(trip)
        if self._note_due(state, status, now):
            return Note(status)
        return Look(0.0 if state.backlog else self.poll, self._limit(wall))

    def _limit(self, wall: float) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - wall)

    def _finish(self, state: WatchState, now: float) -> Action:
        if state.settled_at > now:
            return Pause(state.settled_at - now)
        return Done(state.status)

    def _save_due(self, state: WatchState, now: float) -> bool:
        return state.unsaved and self.save_every is not None and now - state.saved_at >= self.save_every

    def _note_due(self, state: WatchState, status: AppStatus, now: float) -> bool:
        if self.note_every is None or now - state.noted_at < self.note_gap:
            return False
        return progress_key(status) != state.noted or now - state.noted_at >= self.note_every


# ---------------------------------------------------------------------- the blocking watcher


@contextlib.contextmanager
def cancelling_on_signal(runner: Runner, app_handle: str, enabled: bool | None) -> Iterator[None]:
    """While inside, SIGTERM and SIGINT cancel ``app_handle`` and raise ``SignalException``
    (``enabled`` None: when in the main thread; Python lets only it install handlers); the
    previous handlers are restored afterwards."""
    if enabled is False or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_signal(signum: int, frame: FrameType | None) -> None:
        sig = signal.Signals(signum)
        raise SignalException(f"got {sig.name} while waiting for {app_handle}", sig)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    except SignalException as e:
        log.warning("cancelling %s: the waiting process was interrupted", app_handle)
        runner.cancel(app_handle, reason=f"the waiting process (pid {os.getpid()}) got {e.sigval.name}")
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class JobWatch:
    """Follows one job with blocking calls (``Runner.wait``, the CLI, an Airflow worker or
    sensor), by the rules of ``WatchRules``: ``wait`` watches it to its end, ``stream``
    writes out one status's new lines.

    ``write`` gets each batch's lines before the follower moves past them (``mark_logged``);
    ``save`` (a no-op here) is called as the rules say. ``replicas``, ``streams``: see
    ``LogFollower``; ``clock``: where time comes from. ``finalize``: a job found ended is
    settled (``Runner.finalize``), as by whoever acts on its end; a mere reader (``log
    --tail``) leaves it as it is.
    """

    #: Seconds between two saves while a backlog is logged (None: this watcher saves nothing).
    save_every: float | None = None
    #: The guards ``wait`` holds the job to (``core/guards.py``; None: none).
    guards: Guards | None = None
    #: Whether ``wait`` ends once the job left PENDING (``WatchRules.until_started``).
    until_started: bool = False

    def __init__(
        self,
        runner: Runner,
        app_handle: str,
        write: Callable[[list[LogLine]], None] | None = None,
        *,
        stream_logs: bool = True,
        cursors: Mapping[str, str] | None = None,
        batch_lines: int = BATCH_LINES,
        replicas: Collection[tuple[str, int]] | None = None,
        streams: Stream | None = None,
        clock: Clock = SYSTEM_CLOCK,
        finalize: bool = True,
    ) -> None:
        self.runner = runner
        self.app_handle = app_handle
        self.write = write
        self.clock = clock
        self.finalize = finalize
        self.follower = (
            LogFollower(runner, app_handle, cursors, batch_lines, replicas=replicas, streams=streams)
            if stream_logs and write is not None
            else None
        )
        self.state = WatchState(saved_at=clock.monotonic())
        #: The attempts (role, replica, number) already said to leave ``max_cost`` unheld.
        self._unheld: set[tuple[str, int, int]] = set()

    @property
    def behind_s(self) -> float | None:
        """How far the log written out lags the job's log (seconds; None: not known)."""
        return self.follower.behind_s if self.follower is not None else None

    def mark_logged(self, batch: LogBatch) -> None:
        """Called once ``batch`` was written out: moves the follower past it."""
        assert self.follower is not None
        self.follower.advance(batch)

    def save(self) -> None:
        """Save the position reached (here: nowhere)."""

    def current_status(self) -> AppStatus | None:
        """The job's status now (None: no such job); one that ended without its scheduler
        recording it is settled first (``Runner.finalize``) unless this watcher only reads.
        Blocking."""
        status = self.runner.status(self.app_handle)
        if self.finalize and status is not None and status.is_terminal():
            return self.runner.finalize(self.app_handle) or status
        return status

    def looked_at(self, status: AppStatus | None, timed_out: bool = False) -> None:
        """Take in the status a look brought; say once per attempt that ``max_cost`` cannot
        be held for it (``Guards.unheld``: its scheduler could not price it)."""
        self.state = self.state.looked_at(status, self.clock.monotonic(), timed_out)
        guards = self.guards
        if guards is None:
            return
        for attempt in guards.unheld(status):
            key = (attempt.role, attempt.replica, attempt.number)
            if key not in self._unheld:
                self._unheld.add(key)
                self.warn(
                    f"max_cost={guards.max_cost:g} cannot be held for {attempt.role}[{attempt.replica}] "
                    f"attempt #{attempt.number} of TorchX job {self.app_handle}: its scheduler cannot price it "
                    f"({attempt.no_price}); the job's cost so far is unknown while it runs, and the guard does "
                    "not trip on it"
                )

    def warn(self, text: str) -> None:
        """Say ``text`` as a warning where this watcher's messages go."""
        log.warning("%s", text)

    def next_status(self, look: Look) -> AppStatus | None:
        """The status ``look`` asks for: at once, or after waiting up to its pause (and never
        past the deadline) for the scheduler to say the job may have changed."""
        pause = look.pause if look.limit is None else min(look.pause, look.limit)
        if pause > 0:
            self.runner.wait_for_change(self.app_handle, pause)
        return self.current_status()

    def rules(self, poll: float, deadline: float | None = None, notes: bool = False) -> WatchRules:
        """The rules of a blocking watch: a look every ``poll`` seconds, a backlog read for up
        to a poll, the ended job's log drained; progress notes (``notes``) at most once a poll."""
        return WatchRules(
            poll=poll,
            deadline=deadline,
            budget=poll,
            reads=self.follower is not None,
            save_every=self.save_every,
            note_every=PROGRESS_EVERY if notes else None,
            note_gap=poll,
            guards=self.guards,
            until_started=self.until_started,
        )

    def drive(
        self, rules: WatchRules, note: Callable[[AppStatus], None] | None = None, *, one_round: bool = False
    ) -> Action:
        """Carry out ``rules``' actions from ``self.state`` until ``Done`` or ``Tripped``
        (returned; with ``one_round``, also the next ``Look`` or ``Note``). What was logged is saved even when
        a call raises."""
        clock = self.clock
        try:
            while True:
                now = clock.monotonic()
                action = rules.next_action(self.state, now, clock.wall())
                if isinstance(action, Read):
                    assert self.follower is not None
                    self.state = self.state.read(self.follower.read(action.status))
                elif isinstance(action, Log):
                    if action.batch.lines:
                        assert self.write is not None
                        self.write(action.batch.lines)
                    self.mark_logged(action.batch)
                    self.state = self.state.logged(clock.monotonic(), rules.settle)
                elif isinstance(action, Save):
                    self.save()
                    self.state = self.state.saved(clock.monotonic())
                elif isinstance(action, Done | Tripped) or (one_round and isinstance(action, Look | Note)):
                    return action
                elif isinstance(action, Look):
                    self.looked_at(self.next_status(action))
                elif isinstance(action, Note):
                    if note is not None:
                        note(action.status)
                    self.state = self.state.noted_now(action.status, clock.monotonic(), rules.settle)
                else:
                    clock.sleep(action.seconds)
        finally:
            if self.state.unsaved and rules.save_every is not None:
                self.save()
                self.state = self.state.saved(clock.monotonic())

    def stream(self, status: AppStatus | None, budget: float | None = None) -> bool:
        """Write out the lines written since the last read: every remaining one of a terminal
        job; of a running one, batches while a backlog remains, for up to ``budget`` seconds.
        Returns whether a backlog remains (then look at the status again without pausing)."""
        rules = dataclasses.replace(self.rules(budget or 0.0), budget=budget, note_every=None)
        self.state = self.state.looked_at(status, self.clock.monotonic())
        self.drive(rules, one_round=True)
        return self.state.backlog

    def wait(
        self,
        poll_interval: float,
        deadline: float | None = None,
        on_poll: Callable[[AppStatus], None] | None = None,
        cancel_on_signal: bool | None = False,
    ) -> AppStatus | None:
        """Wait for the job to end, streaming its lines; return its final status (None: no
        such job), or its last, live status once ``deadline`` (epoch seconds) passed or, with
        ``until_started``, once it left PENDING.

        Looks every ``poll_interval`` unless a backlog remains (a local job's end cuts the
        pause short); ``on_poll`` is told a running status when what it says changes (at most
        once per ``poll_interval``), else every ``PROGRESS_EVERY`` seconds.
        ``cancel_on_signal``: SIGTERM/SIGINT cancel the job (see ``cancelling_on_signal``).
        A guard that trips (``guards``) raises ``GuardrailTrippedError``; the job is left as it is."""
        with cancelling_on_signal(self.runner, self.app_handle, cancel_on_signal):
            done = self.drive(self.rules(poll_interval, deadline, notes=on_poll is not None), on_poll)
        if isinstance(done, Tripped):
            raise GuardrailTrippedError(done.trip)
        assert isinstance(done, Done)
        return done.status


def last_lines(runner: Runner, app_handle: str, role: str, k: int, n: int = 20) -> list[str]:
    """The last ``n`` lines of replica ``k`` of ``role`` (for failure messages); empty when the
    log cannot be read."""
    try:
        return list(collections.deque(runner.log_lines(app_handle, role, k), maxlen=n))
    except (ValueError, NotImplementedError):
        return []
