"""The guard the reaper holds (``reaper/guards.py``): a job's ``start_timeout`` that its
scheduler cannot hold itself (AWS Batch: tagged on the job, listed back), with nobody watching.
One test per row of ``start_overdue`` and ``next_due``; then a reconciling round on a moto
server whose Batch jobs never run: the job waiting past its limit is cancelled, saying which
guard, counted, and the next round is asked for when the next limit runs out."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_torchx.core.guards import START_TIMEOUT, Trip
from airflow_provider_torchx.core.runner import get_runner
from airflow_provider_torchx.core.schedulers.api import CancelledBy
from airflow_provider_torchx.core.specs import AppDef, AppState, Resource, Role
from airflow_provider_torchx.reaper.guards import next_due, start_overdue
from airflow_provider_torchx.reaper.listing import LiveJob
from tests.fixtures.aws import MotoServer, create_job_queue, moto_settings
from tests.fixtures.clock import FakeClock

NOW = 10_000.0
LABELS = {"airflow.dag_id": "acc", "airflow.task_id": "job", "airflow.run_id": "r1", "airflow.map_index": "-1"}


def job(state: AppState = AppState.PENDING, handle: str = "aws_batch://s/q:j", **kw: Any) -> LiveJob:
    values: dict[str, Any] = {"created": NOW - 100, "started": None, "start_timeout": 60.0} | kw
    return LiveJob(handle, "aws_batch", "torchx_batch", state, LABELS, **values)


# ---------------------------------------------------------------------- the rule, row by row


def test_a_job_waiting_past_its_start_timeout_trips_with_the_watchers_rule() -> None:
    assert start_overdue(job(), NOW) == Trip(START_TIMEOUT, 60.0, AppState.PENDING, 100.0)


def test_a_job_within_its_start_timeout_does_not() -> None:
    assert start_overdue(job(created=NOW - 60), NOW) is None  # the limit itself is not over


def test_a_job_that_started_does_not() -> None:
    assert start_overdue(job(started=NOW - 50), NOW) is None


def test_a_running_job_without_a_start_time_does_not() -> None:
    assert start_overdue(job(AppState.RUNNING), NOW) is None


def test_a_job_without_a_start_timeout_does_not() -> None:
    assert start_overdue(job(start_timeout=None), NOW) is None


def test_an_undated_job_does_not() -> None:
    assert start_overdue(job(created=None), NOW) is None


def test_the_next_round_comes_when_the_earliest_waiting_limit_runs_out() -> None:
    jobs = [job(created=NOW - 50), job(created=NOW - 30), job(created=NOW - 100), job(started=NOW)]
    assert next_due(jobs, NOW) == pytest.approx(10.1)  # over already or started: not waited for
    assert next_due([job(start_timeout=None)], NOW) is None


# ---------------------------------------------------------------------- the listing, the round


def test_a_batch_jobs_start_timeout_is_tagged_and_listed_back(moto_without_docker: MotoServer) -> None:
    """On a moto server: the run option rides on the job as a tag, and the listing (the
    reaper's ``list_live``, here ``list``: moto's jobs end at once) gives it back."""
    with moto_settings(moto_without_docker):
        queue = create_job_queue("reaper-guards")
        runner = get_runner()
        app = AppDef("wait", roles=[Role("main", image="busybox", entrypoint="true", resource=Resource(1, 0, 512))])
        cfg = {"queue": queue, "check_queue": False}
        guarded = runner.run(app, "aws_batch", {**cfg, START_TIMEOUT: 30}, labels=LABELS)
        plain = runner.run(app, "aws_batch", cfg, labels={**LABELS, "airflow.task_id": "other"})
        listed = {a.app_handle: a.start_timeout for a in runner.list("aws_batch", cfg)}
    assert (listed[guarded], listed[plain]) == (30.0, None)


class Counter:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, str]]] = []

    def incr(self, name: str, tags: dict[str, str] | None = None, **_: Any) -> None:
        self.calls.append((name, dict(tags or {})))


class Cancels:
    """A stand-in runner (``sources.runner_for``) that records each cancel."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None, CancelledBy | None]] = []

    def cancel(self, handle: str, *, reason: str | None = None, by: CancelledBy | None = None) -> None:
        self.calls.append((handle, reason, by))


def test_a_round_cancels_the_job_waiting_past_its_start_timeout_and_comes_back_for_the_next(
    fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_provider_torchx import sources
    from airflow_provider_torchx.reaper import loop
    from airflow_provider_torchx.reaper.settings import ReaperSettings

    overdue = job(created=fake_clock.now - 31, start_timeout=30.0)
    waiting = job(handle="aws_batch://s/q:w", created=fake_clock.now, start_timeout=4.0)
    runner, counter = Cancels(), Counter()
    monkeypatch.setattr(sources, "runner_for", lambda handle, conn_id: runner)
    monkeypatch.setattr("airflow_provider_torchx.metrics.stats", lambda: counter)
    monkeypatch.setattr(loop, "reaper_settings", lambda: ReaperSettings(True, 30.0))
    monkeypatch.setattr(loop, "live_jobs", lambda: [overdue, waiting])
    monkeypatch.setattr(loop, "read_task_views", lambda ids: {})  # no task known: the table keeps both

    wait = loop.Reconciler(clock=fake_clock.clock).round()

    assert runner.calls == [(overdue.handle, "guardrail start_timeout=30 tripped", CancelledBy.REAPER)]
    tags = {"scheduler": "aws_batch", "dag_id": "acc", "task_id": "job", "guard": "start_timeout"}
    assert counter.calls == [("torchx.job.guardrail", tags)]
    assert wait == pytest.approx(4.1)  # when the other job's limit runs out
