"""Which replicas a log follower reads: a live job's replicas that may have written something,
every replica of a terminal job (the drain rule), never skipping a cursor."""

from __future__ import annotations

from typing import Any

from airflow_provider_torchx.core.logstream import LogFollower
from airflow_provider_torchx.core.schedulers.api import LogChunk
from airflow_provider_torchx.core.specs import AppState, AppStatus, ReplicaStatus, RoleStatus


class CountingRunner:
    """``read_log`` that records which replica was read and returns one line each time."""

    def __init__(self) -> None:
        self.reads: list[tuple[str, int]] = []

    def read_log(
        self, app_handle: str, role: str, k: int, cursor: Any = None, streams: Any = None, max_lines: Any = None
    ) -> LogChunk:
        self.reads.append((role, k))
        n = int(cursor or 0)
        return LogChunk(lines=[f"{role}/{k} line {n}\n"], cursor=str(n + 1), eof=False)


def status(job: AppState, *replicas: AppState) -> AppStatus:
    reps = [ReplicaStatus(id=k, state=s, role="w", hostname="") for k, s in enumerate(replicas)]
    return AppStatus(state=job, roles=[RoleStatus("w", reps)])


def test_a_live_jobs_unstarted_replicas_are_not_read_and_lose_nothing() -> None:
    runner = CountingRunner()
    follower = LogFollower(runner, "aws_batch://s/q:app")  # type: ignore[arg-type]
    queued = status(AppState.PENDING, AppState.PENDING, AppState.SUBMITTED)
    assert follower.replicas_to_read(queued) == []
    follower.advance(follower.read(queued))
    assert runner.reads == []  # a queued job costs the backend no read

    half = status(AppState.RUNNING, AppState.RUNNING, AppState.PENDING)
    batch = follower.read(half)
    follower.advance(batch)
    assert runner.reads == [("w", 0)] and [line.line for line in batch.lines] == ["w/0 line 0\n"]

    ended = status(AppState.FAILED, AppState.FAILED, AppState.PENDING)  # replica 1 never ran
    batch = follower.read(ended)
    assert runner.reads[1:] == [("w", 0), ("w", 1)]  # the drain reads every replica, from its cursor
    assert [line.line for line in batch.lines] == ["w/0 line 1\n", "w/1 line 0\n"]


def test_a_read_of_no_replica_answers_the_same_batch_until_the_position_moves() -> None:
    """A queued job's every look reads nothing: the follower answers one batch for it (what a
    watcher keeps until its next look, a poll on, is not a new object per look), and that
    batch follows the position once lines were read."""
    runner = CountingRunner()
    follower = LogFollower(runner, "aws_batch://s/q:app", {"w/0": "3"})  # type: ignore[arg-type]
    queued = status(AppState.PENDING, AppState.PENDING)
    first = follower.read(queued)
    follower.advance(first)
    again = follower.read(queued)
    assert again is first and again.lines == [] and again.cursors == {"w/0": "3"} and not again.more

    follower.advance(follower.read(status(AppState.RUNNING, AppState.RUNNING)))
    after = follower.read(queued)  # a restarted replica, queued again
    assert after is not first and after.cursors == {"w/0": "4"} and runner.reads == [("w", 0)]
