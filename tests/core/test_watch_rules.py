"""The watching rules (``core/logstream.py``: ``WatchRules.next_action``) without I/O: given
what a watcher knows, the next action. Every watcher (``Runner.wait``, the CLI, the worker,
the sensor, the trigger) drives these rules, so each rule is tested here once."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest

from airflow_provider_torchx.core.guards import Guards
from airflow_provider_torchx.core.logstream import (
    PROGRESS_EVERY,
    Done,
    JobWatch,
    Log,
    LogBatch,
    LogLine,
    Look,
    Note,
    Pause,
    Read,
    Save,
    Tripped,
    WatchRules,
    WatchState,
    left_pending,
)
from airflow_provider_torchx.core.schedulers.api import LogChunk
from airflow_provider_torchx.core.specs import AppState, AppStatus, ReplicaStatus, RoleStatus
from tests.fixtures.clock import FakeClock

POLL = 10.0


def status(state: AppState, msg: str = "") -> AppStatus:
    return AppStatus(state, msg=msg, roles=[RoleStatus("w", [ReplicaStatus(0, state, "w", "")])])


RUNNING = status(AppState.RUNNING)
ENDED = status(AppState.SUCCEEDED)


def batch(n: int, more: bool = False, start: int = 0) -> LogBatch:
    lines = [LogLine("w", 0, f"{i}\n") for i in range(start, start + n)]
    return LogBatch(lines, {"w/0": str(start + n)}, more)


def blocking(**changes: Any) -> WatchRules:
    """The rules of a blocking watcher (``JobWatch.rules``), with ``changes``."""
    return dataclasses.replace(WatchRules(poll=POLL, budget=POLL, note_gap=POLL), **changes)


def trigger(**changes: Any) -> WatchRules:
    """The trigger's rules (``TaskWatcher.trigger_rules``), with ``changes``."""
    rules = WatchRules(poll=POLL, budget=POLL, log_the_end=False, note_every=60.0, settle=2.0)
    return dataclasses.replace(rules, **changes)


def logged(state: WatchState, b: LogBatch, now: float, settle: float = 0.0) -> WatchState:
    return state.read(b).logged(now, settle)


def test_the_first_look_is_at_once_then_one_poll_apart_unless_a_backlog_remains() -> None:
    rules = blocking()
    start = WatchState()
    assert rules.next_action(start, 0.0, 0.0) == Look(0.0, None)
    state = start.looked_at(RUNNING, 0.0)
    assert rules.next_action(state, 0.0, 0.0) == Read(RUNNING)
    state = logged(state, batch(3), 0.1)
    assert rules.next_action(state, 0.1, 0.1) == Look(POLL, None)  # no backlog: a poll on
    state = logged(state.looked_at(RUNNING, 10.0), batch(1000, more=True), 30.0)  # the budget is spent
    assert rules.next_action(state, 30.0, 30.0) == Look(0.0, None)  # a backlog: at once


def test_a_backlog_is_read_batch_after_batch_for_up_to_the_budget() -> None:
    rules = blocking()
    state = logged(WatchState().looked_at(RUNNING, 0.0), batch(1000, more=True), 1.0)
    assert rules.next_action(state, 1.0, 1.0) == Read(RUNNING)
    assert rules.next_action(state, 9.9, 9.9) == Read(RUNNING)
    assert rules.next_action(state, 10.0, 10.0) == Look(0.0, None)
    unlimited = blocking(budget=None)  # the sensor's flush: no time limit
    assert unlimited.next_action(state, 1e6, 1e6) == Read(RUNNING)


def test_an_ended_job_is_drained_whatever_the_clock_says() -> None:
    """The drain rule: a terminal job is read until a read returns nothing, with no time limit
    (the clock races 10 s ahead at every step), then the watch is done."""
    rules = blocking()
    clock = itertools.count(0, 10)
    state = WatchState().looked_at(ENDED, next(clock))
    reads = 0
    while isinstance(action := rules.next_action(state, now := float(next(clock)), now), Read):
        reads += 1
        state = logged(state, batch(1000 if reads < 50 else 0, more=reads < 50), now)
    assert reads == 50
    assert action == Done(ENDED) and action.ended


def test_the_ending_round_drains_for_a_blocking_watcher_and_reads_nothing_for_the_trigger() -> None:
    assert blocking().next_action(WatchState().looked_at(ENDED, 0.0), 0.0, 0.0) == Read(ENDED)
    assert trigger().next_action(WatchState().looked_at(ENDED, 0.0), 0.0, 0.0) == Done(ENDED)
    gone = WatchState().looked_at(None, 0.0)  # no such job
    assert blocking().next_action(gone, 0.0, 0.0) == Done(None)


def test_the_trigger_reports_the_end_once_its_last_lines_settled() -> None:
    """Lines logged at t=5 (and a progress note at t=6) settle for 2 s: the round at t=7 that
    finds the job ended logs nothing and pauses until t=8, then is done."""
    rules = trigger()
    state = logged(WatchState().looked_at(RUNNING, 4.0), batch(3), 5.0, settle=rules.settle)
    assert rules.next_action(state, 6.0, 6.0) == Note(RUNNING)
    state = state.noted_now(RUNNING, 6.0, rules.settle)
    assert rules.next_action(state, 6.0, 6.0) == Look(POLL, None)
    state = state.looked_at(ENDED, 7.0)
    assert rules.next_action(state, 7.0, 7.0) == Pause(1.0)
    assert rules.next_action(state, 8.0, 8.0) == Done(ENDED)


def test_the_position_is_saved_at_most_every_save_every_and_at_the_end_of_a_round() -> None:
    rules = blocking(save_every=1.0)
    state = WatchState(saved_at=0.0).looked_at(RUNNING, 0.0)
    state = logged(state, batch(1000, more=True), 0.5)
    assert rules.next_action(state, 0.5, 0.5) == Read(RUNNING)  # saved 0.5 s ago: not yet
    assert rules.next_action(state, 1.0, 1.0) == Save()  # a second since the last save
    state = logged(state.saved(1.0), batch(5), 1.2)
    assert rules.next_action(state, 1.2, 1.2) == Save()  # the round's end saves what it logged
    state = state.saved(1.2)
    assert rules.next_action(state, 1.2, 1.2) == Look(POLL, None)
    empty = logged(WatchState().looked_at(RUNNING, 2.0), batch(0), 2.0)
    assert rules.next_action(empty, 2.0, 2.0) == Look(POLL, None)  # nothing logged: nothing to save
    unsaved = logged(WatchState().looked_at(RUNNING, 0.0), batch(5), 9.0)
    assert blocking().next_action(unsaved, 9.0, 9.0) == Look(POLL, None)  # a watcher that keeps no position


def test_a_deadline_ends_the_watch_and_bounds_each_look() -> None:
    rules = blocking(deadline=100.0)
    state = logged(WatchState().looked_at(RUNNING, 0.0), batch(1), 0.0)
    assert rules.next_action(state, 0.0, 95.0) == Look(POLL, 5.0)
    assert rules.next_action(state, 0.0, 100.0) == Done(RUNNING)
    assert not Done(RUNNING).ended
    timed_out = WatchState().looked_at(RUNNING, 0.0, timed_out=True)  # the look ran past it
    assert trigger(deadline=100.0).next_action(timed_out, 0.0, 99.0) == Done(RUNNING)
    # the trigger's round past the deadline reads nothing; a blocking watcher's drains first
    late = WatchState().looked_at(RUNNING, 0.0)
    assert trigger(deadline=100.0).next_action(late, 0.0, 100.0) == Done(RUNNING)
    assert rules.next_action(late, 0.0, 100.0) == Read(RUNNING)


def test_a_watch_until_started_ends_once_the_job_left_pending_and_trips_while_it_has_not() -> None:
    """``until_started`` (a capacity ladder's task that does not wait for completion): a
    PENDING job is watched on (and its ``start_timeout`` trips); the round that finds it
    RUNNING, or ended, is the last (the trigger's reads nothing, a blocking watcher's drains
    what is there); without ``until_started`` a RUNNING job is watched on."""
    pending = status(AppState.PENDING)
    guards = Guards(start_timeout=5.0, since=0.0)
    waiting = logged(WatchState().looked_at(pending, 0.0), batch(0), 0.0)
    assert blocking(until_started=True).next_action(waiting, 0.0, 1.0) == Look(POLL, None)
    tripped = blocking(until_started=True, guards=guards).next_action(waiting, 0.0, 6.0)
    assert isinstance(tripped, Tripped) and tripped.trip.guard == "start_timeout"
    for started in (RUNNING, ENDED):
        state = WatchState().looked_at(started, 0.0)
        assert trigger(until_started=True).next_action(state, 0.0, 0.0) == Done(started)
        assert blocking(until_started=True).next_action(state, 0.0, 0.0) == Read(started)
        drained = logged(state, batch(0), 0.0)  # read to its end
        assert blocking(until_started=True, guards=guards).next_action(drained, 0.0, 60.0) == Done(started)
    running = logged(WatchState().looked_at(RUNNING, 0.0), batch(2), 0.0)
    assert blocking().next_action(running, 0.0, 0.0) == Look(POLL, None)
    assert left_pending(RUNNING) and left_pending(ENDED) and not left_pending(pending)
    assert not left_pending(status(AppState.SUBMITTED))


def test_progress_notes_when_the_job_changes_and_once_a_minute_otherwise() -> None:
    rules = trigger()
    said = []
    state = WatchState()
    for t, s in [
        (0, status(AppState.PENDING)),  # the first status: noted
        (10, status(AppState.PENDING)),
        (20, status(AppState.PENDING, "waiting for 4 GPUs")),  # the scheduler's message changed
        (30, status(AppState.PENDING, "waiting for 4 GPUs")),
        (40, status(AppState.RUNNING)),  # state and replica counts changed
        (90, status(AppState.RUNNING)),
        (100, status(AppState.RUNNING)),  # a minute since the last note
        (110, status(AppState.RUNNING)),
    ]:
        state = logged(state.looked_at(s, t), batch(0), t)
        if isinstance(rules.next_action(state, t, t), Note):
            said.append(t)
            state = state.noted_now(s, t, rules.settle)
    assert said == [0, 20, 40, 100]


def notes_over(rules: WatchRules, job: Any) -> list[float]:
    """When a watcher following ``rules`` on a fake clock notes progress, for a job whose
    status at time ``t`` is ``job(t)``, until the watch ends (every action but a look or a
    pause takes no time)."""
    now, state, said = 0.0, WatchState(), []
    while True:
        action = rules.next_action(state, now, now)
        if isinstance(action, Look):
            now += action.pause
            state = state.looked_at(job(now), now)
        elif isinstance(action, Read):
            state = state.read(batch(0))
        elif isinstance(action, Log):
            state = state.logged(now, rules.settle)
        elif isinstance(action, Save):
            state = state.saved(now)
        elif isinstance(action, Note):
            said.append(now)
            state = state.noted_now(action.status, now, rules.settle)
        elif isinstance(action, Pause):
            now += action.seconds
        else:
            assert isinstance(action, Done)
            return said


@pytest.mark.parametrize("rules_of", [blocking, trigger], ids=["blocking", "trigger"])
def test_progress_lines_come_on_a_change_else_once_a_minute_whatever_the_poll(rules_of: Any) -> None:
    """The rule docs/behaviour.md states ("Progress lines"), for the worker and the trigger:
    with a 5 s poll, a job running unchanged for 176 s gets three lines (0, 60, 120 s), not
    one per poll; a change is noted at the look that sees it, and the minute counts from
    there; with polls further apart than a minute, every look notes."""
    every = PROGRESS_EVERY  # the blocking rules take it with ``notes=True`` (``JobWatch.rules``)
    unchanged = notes_over(rules_of(poll=5.0, note_every=every), lambda t: RUNNING if t < 176 else ENDED)
    assert unchanged == [0.0, 60.0, 120.0]

    def starts_at_32(t: float) -> AppStatus:
        return status(AppState.PENDING) if t < 32 else RUNNING if t < 176 else ENDED

    assert notes_over(rules_of(poll=5.0, note_every=every), starts_at_32) == [0.0, 35.0, 95.0, 155.0]
    slow = notes_over(rules_of(poll=300.0, note_every=every), lambda t: RUNNING if t < 1000 else ENDED)
    assert slow == [0.0, 300.0, 600.0, 900.0]


def test_a_blocking_watcher_notes_at_most_once_a_poll() -> None:
    rules = blocking(note_every=60.0)
    state = logged(WatchState().looked_at(RUNNING, 0.0), batch(0), 0.0).noted_now(status(AppState.PENDING), 0.0, 0.0)
    assert rules.next_action(state, 5.0, 5.0) == Look(POLL, None)  # changed, but noted 5 s ago
    assert rules.next_action(state, 10.0, 10.0) == Note(RUNNING)


def test_a_watcher_that_reads_no_logs_only_looks() -> None:
    rules = blocking(reads=False)
    state = WatchState().looked_at(RUNNING, 0.0)
    assert rules.next_action(state, 0.0, 0.0) == Look(POLL, None)
    assert rules.next_action(state.looked_at(ENDED, 1.0), 1.0, 1.0) == Done(ENDED)


def test_a_watch_logs_every_line_once_in_order() -> None:
    """The rules against a simulated job writing 10 lines per second for 100 s while the
    watcher's clock advances 0.5 s per action: every line once, in order, and the end drained."""
    rules = blocking(poll=2.0, budget=2.0, save_every=1.0)
    logged_lines: list[str] = []
    now = 0.0
    cursor = 0
    state = WatchState()
    while True:
        written = int(min(now, 100.0) * 10)
        job = ENDED if now >= 100.0 else RUNNING
        action = rules.next_action(state, now, now)
        if isinstance(action, Look):
            now += action.pause
            state = state.looked_at(ENDED if now >= 100.0 else RUNNING, now)
        elif isinstance(action, Read):
            n = min(7, written - cursor)  # batches of at most 7 lines
            state = state.read(batch(n, more=n == 7, start=cursor))
        elif isinstance(action, Log):
            logged_lines += [line.line for line in action.batch.lines]
            cursor = int(action.batch.cursors.get("w/0", cursor))
            state = state.logged(now, rules.settle)
        elif isinstance(action, Save):
            state = state.saved(now)
        elif isinstance(action, Done):
            assert action.status is not None and action.status.state == AppState.SUCCEEDED
            break
        else:
            raise AssertionError(f"unexpected {action} ({job})")
        now += 0.5
    assert logged_lines == [f"{i}\n" for i in range(1000)]


# ---------------------------------------------------------------------- the blocking loop


class ScriptedRunner:
    """A runner whose job goes through ``states`` (one per status call, the last repeated) and
    writes ``per_look`` lines per status call; waiting advances ``clock`` (nothing sleeps)."""

    def __init__(self, clock: FakeClock, states: list[AppState], per_look: int = 0) -> None:
        self.clock, self.states, self.per_look = clock, states, per_look
        self.written = 0
        self.waits: list[float] = []

    def status(self, app_handle: str) -> AppStatus:
        state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        self.written += self.per_look
        return status(state)

    def finalize(self, app_handle: str) -> None:
        return None

    def wait_for_change(self, app_handle: str, timeout: float) -> None:
        self.waits.append(timeout)
        self.clock.advance(timeout)

    def read_log(self, app_handle: str, role: str, k: int, cursor: Any = None, **_: Any) -> LogChunk:
        start = int(cursor or 0)
        end = min(self.written, start + 3)  # reads of at most 3 lines
        return LogChunk([f"{i}\n" for i in range(start, end)], str(end), eof=False)


def test_a_blocking_wait_on_an_injected_clock_looks_a_poll_apart_until_the_deadline() -> None:
    clock = FakeClock(0.0)
    runner = ScriptedRunner(clock, [AppState.RUNNING])
    notes: list[float] = []
    watch = JobWatch(runner, "fake://s/job", stream_logs=False, clock=clock.clock)  # type: ignore[arg-type]
    last = watch.wait(10.0, deadline=25.0, on_poll=lambda s: notes.append(clock.now))
    assert last is not None and last.state == AppState.RUNNING  # still running at the deadline
    assert runner.waits == [10.0, 10.0, 5.0] and clock.now == 25.0 and clock.slept == []
    assert notes == [0.0]  # nothing changed: one note (the next one is due after a minute)


def test_a_blocking_wait_at_a_5s_poll_writes_a_progress_line_a_minute_not_a_poll() -> None:
    """``JobWatch.wait`` (the worker's wait) on an injected clock: a job running unchanged for
    three minutes at ``poll_interval=5`` is told to ``on_poll`` at 0, 60 and 120 s."""
    clock = FakeClock(0.0)
    runner = ScriptedRunner(clock, [AppState.RUNNING] * 36 + [AppState.SUCCEEDED])  # ends at 180 s
    notes: list[float] = []
    watch = JobWatch(runner, "fake://s/job", stream_logs=False, clock=clock.clock)  # type: ignore[arg-type]
    final = watch.wait(5.0, on_poll=lambda s: notes.append(clock.now))
    assert final is not None and final.state == AppState.SUCCEEDED and clock.now == 180.0 and clock.slept == []
    assert notes == [0.0, 60.0, 120.0]


def test_a_blocking_wait_streams_every_line_once_and_drains_the_end() -> None:
    clock = FakeClock(0.0)
    runner = ScriptedRunner(clock, [AppState.RUNNING] * 4 + [AppState.SUCCEEDED], per_look=5)
    lines: list[str] = []
    watch = JobWatch(
        runner,  # type: ignore[arg-type]
        "fake://s/job",
        lambda batch: lines.extend(line.line for line in batch),
        batch_lines=3,
        clock=clock.clock,
    )
    final = watch.wait(1.0)
    assert final is not None and final.state == AppState.SUCCEEDED and clock.slept == []
    assert lines == [f"{i}\n" for i in range(runner.written)] and runner.written == 25


def test_a_look_that_finds_the_same_status_keeps_the_one_it_had() -> None:
    """A state lives until the next look, a poll on: a status equal to the last one is not
    kept (the last one is), a changed one is."""
    first = status(AppState.RUNNING)
    state = WatchState().looked_at(first, 0.0)
    same = state.looked_at(status(AppState.RUNNING), POLL)
    assert same.status is first and same.round_at == POLL
    changed = same.looked_at(status(AppState.RUNNING, msg="2 of 2 nodes up"), 2 * POLL)
    assert changed.status is not first and changed.status is not None and changed.status.msg == "2 of 2 nodes up"
