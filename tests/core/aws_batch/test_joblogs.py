"""The rules of a Batch job's log reading (``joblogs.py``) on entries shaped like real AWS
(``fakes``), one test per rule; and ``JobLogs`` applying them with given lookups and a fake
clock. The scheduler's log paths end to end are in ``test_status.py`` and ``test_eks_moto.py``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from typing import Any

import pytest

from airflow_provider_torchx.core.clock import Clock
from airflow_provider_torchx.core.errors import UnknownAppError
from airflow_provider_torchx.core.schedulers.api import Stream
from airflow_provider_torchx.core.schedulers.aws_batch import render
from airflow_provider_torchx.core.schedulers.aws_batch.clients import AWSClients
from airflow_provider_torchx.core.schedulers.aws_batch.joblogs import (
    LOG_STREAMS_MAX_AGE,
    TAIL_MAX_PAUSE,
    TAIL_PAUSE,
    JobLogs,
    attempt_streams,
    check_stream,
    container_target,
    in_window,
    next_pause,
    replica_node,
)
from airflow_provider_torchx.core.schedulers.aws_batch.logs import as_line
from airflow_provider_torchx.core.schedulers.aws_batch.poller import NOT_VISIBLE
from tests.core.aws_batch.fakes import FakeBatch, FakeLogs, attempt, child_job, container_job, mnp_job


def test_a_multi_node_replica_runs_on_its_roles_first_node_plus_k() -> None:
    job = mnp_job(roles=(("trainer", 2), ("ps", 1)))
    assert [replica_node("q1:app-1", job, "trainer", k) for k in (0, 1)] == [0, 1]
    assert replica_node("q1:app-1", job, "ps", 0) == 2


def test_a_single_node_jobs_only_replica_is_node_0() -> None:
    assert replica_node("q1:app-1", container_job(role="eval"), "eval", 0) == 0


def test_a_replica_past_its_roles_count_is_an_error_naming_the_range() -> None:
    with pytest.raises(ValueError, match=r"role 'trainer' of q1:app-1 has replicas 0\.\.1, not 2"):
        replica_node("q1:app-1", mnp_job(), "trainer", 2)
    with pytest.raises(ValueError, match="not -1"):
        replica_node("q1:app-1", mnp_job(), "trainer", -1)


def test_an_unknown_role_is_an_error_naming_the_jobs_roles() -> None:
    with pytest.raises(ValueError, match="'worker' is not a role of q1:app-1; roles: trainer, ps"):
        replica_node("q1:app-1", mnp_job(), "worker", 0)


def test_streams_of_ended_attempts_oldest_first_then_the_running_attempts() -> None:
    job = container_job(
        attempts=[
            attempt("spot", stream="app-1/default/c1-att1", n=1),
            attempt("spot", stream="app-1/default/c1-att2", n=2),
        ]
    )
    job["container"]["logStreamName"] = "app-1/default/c1-att3"
    assert attempt_streams(job) == ["app-1/default/c1-att1", "app-1/default/c1-att2", "app-1/default/c1-att3"]


def test_each_stream_once_and_an_attempt_without_a_stream_passed_over() -> None:
    """An ended job's ``container`` names its last attempt's stream again; an attempt that
    never started a container has no stream name."""
    job = container_job(status="FAILED", attempts=[attempt("no image", n=1), attempt("exit", 1, "s/att2", n=2)])
    job["container"]["logStreamName"] = "s/att2"
    assert attempt_streams(job) == ["s/att2"]


def test_a_node_reads_its_child_jobs_streams() -> None:
    assert attempt_streams(child_job("j1", 1, "RUNNING")) == ["jd/default/j1-1"]


def test_a_job_not_started_has_no_streams() -> None:
    job = container_job(status="RUNNABLE")
    del job["container"]["logStreamName"]
    assert attempt_streams(job) == []


def test_an_ecs_nodes_log_is_in_batchs_log_group_as_plain_lines() -> None:
    target = container_target(container_job(), terminal=True)
    assert target == (render.LOG_GROUP, ["app-1/default/c1-att1"], True, as_line)


@pytest.mark.parametrize("streams", [None, Stream.COMBINED])
def test_the_combined_stream_is_the_only_one(streams: Stream | None) -> None:
    check_stream(streams)


def test_stderr_apart_is_an_error() -> None:
    with pytest.raises(ValueError, match="hold stdout and stderr together"):
        check_stream(Stream.STDERR)


def _events(*stamps: int) -> list[dict[str, Any]]:
    return [{"timestamp": s, "message": f"at {s}"} for s in stamps]


def test_a_window_keeps_events_from_since_on_inclusive() -> None:
    assert in_window(_events(1000, 2000, 3000), 2000, None, as_line) == (["at 2000\n", "at 3000\n"], False)


def test_a_window_ends_at_the_first_event_after_until() -> None:
    assert in_window(_events(1000, 2000, 3000), None, 2000, as_line) == (["at 1000\n", "at 2000\n"], True)


def test_an_unbounded_window_keeps_every_event_and_never_ends() -> None:
    assert in_window(_events(1000, 2000), None, None, as_line) == (["at 1000\n", "at 2000\n"], False)


def test_a_tail_pauses_briefly_after_events() -> None:
    assert next_pause(4.0, read_any=True) == TAIL_PAUSE


def test_a_tail_backs_off_doubling_up_to_its_longest_pause() -> None:
    pauses = [TAIL_PAUSE]
    for _ in range(5):
        pauses.append(next_pause(pauses[-1], read_any=False))
    assert pauses == [0.5, 1.0, 2.0, 4.0, TAIL_MAX_PAUSE, TAIL_MAX_PAUSE]


class Lookups:
    """The scheduler's lookups as ``JobLogs`` calls them: the job's entries in turn (the last
    one repeated), its child jobs, no queue."""

    def __init__(self, *entries: dict[str, Any] | None, children: Mapping[int, dict[str, Any]] | None = None) -> None:
        self.entries = list(entries)
        self.children = dict(children or {})
        self.ages: list[float] = []

    def job(self, app_id: str, max_age: float) -> dict[str, Any] | None:
        self.ages.append(max_age)
        return self.entries.pop(0) if len(self.entries) > 1 else self.entries[0]

    def nodes(self, job: Mapping[str, Any], indexes: Iterable[int]) -> dict[int, dict[str, Any]]:
        return {n: self.children[n] for n in indexes if n in self.children}

    def queue_view(self, queue: str) -> Any:
        raise AssertionError(f"an ECS job's log needs no look at queue {queue}")


def job_logs(lookups: Lookups, logs: FakeLogs, clock: Clock) -> JobLogs:
    """``JobLogs`` over ``logs``: a fake of its own endpoint, so a CloudWatch budget of its own,
    whose burst covers these tests' few reads."""
    aws = AWSClients(client=FakeBatch(), log_client=logs)
    return JobLogs(aws, "aws_batch", lookups.job, lookups.nodes, lookups.queue_view, clock)


def test_a_tail_follows_with_the_clocks_pauses_until_the_job_ended_and_its_log_drained() -> None:
    """Each look at the job may be no older than the tail's pause, so the end is seen within it."""
    running = container_job(status="RUNNING")
    del running["container"]["logStreamName"]
    ended = container_job(status="SUCCEEDED")
    logs = FakeLogs()
    logs.add("app-1/default/c1-att1", "epoch 1", "epoch 2", "epoch 3")
    lookups = Lookups(running, running, running, ended)
    slept: list[float] = []
    reader = job_logs(lookups, logs, Clock(sleep=slept.append))
    lines = list(reader.lines("q1:app-1", "main", 0, None, None, None, True, None))
    assert lines == ["epoch 1\n", "epoch 2\n", "epoch 3\n"]
    assert slept == [1.0, 2.0]
    assert lookups.ages == [LOG_STREAMS_MAX_AGE, 0.5, 1.0, 2.0]  # first: the replica checked before iterating


def test_a_window_of_a_node_reads_its_child_jobs_stream_and_stops_past_until() -> None:
    logs = FakeLogs()
    logs.add("jd/default/j1-2", "warm up", "step 1", "step 2")
    lookups = Lookups(mnp_job(status="RUNNING"), children={2: child_job("j1", 2, "RUNNING")})
    reader = job_logs(lookups, logs, Clock(sleep=lambda _: pytest.fail("a window that ended does not pause")))
    since = datetime.fromtimestamp(1700000001, timezone.utc)
    until = datetime.fromtimestamp(1700000001.5, timezone.utc)
    assert list(reader.lines("q1:app-1", "ps", 0, None, since, until, True, None)) == ["step 1\n"]


def test_an_unknown_app_raises_before_iterating_and_a_job_not_visible_reads_nothing_yet() -> None:
    logs = FakeLogs()
    with pytest.raises(UnknownAppError, match="no app 'q1:app-9' on aws_batch"):
        job_logs(Lookups(None), logs, Clock()).lines("q1:app-9", "main", 0, None, None, None, False, None)
    chunk = job_logs(Lookups(NOT_VISIBLE), logs, Clock()).read("q1:app-1", "main", 0, None, None, None)
    assert (chunk.lines, chunk.eof, chunk.behind_s) == ([], False, None)
