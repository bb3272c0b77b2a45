"""The status poller's rounds (``poller.py``): one ``squeue`` per round for every look due."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import pytest

from airflow_provider_torchx.core.clock import Clock
from airflow_provider_torchx.core.schedulers.slurm.poller import Entries, SqueuePoller, plan


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.clock = Clock(monotonic=lambda: self.now, wall=lambda: self.now, sleep=lambda s: None)


class Squeue:
    """A stand-in for ``squeue``: what it shows, and how often it was asked."""

    def __init__(self, jobs: dict[str, str]) -> None:
        self.jobs = jobs
        self.calls = 0
        self.asked: list[set[str]] = []

    def __call__(self, ids: Collection[str]) -> Entries:
        self.calls += 1
        self.asked.append(set(ids))
        return {job: {"job_state": state} for job, state in self.jobs.items()}


def _ended(entry: Mapping[str, Any]) -> bool:
    return entry["job_state"] in ("COMPLETED", "FAILED")


def _state(job: str) -> Any:
    return lambda entries: entries[job]["job_state"] if not isinstance(entries, BaseException) else entries


def test_one_round_answers_every_look_with_one_call() -> None:
    t = FakeClock()
    squeue = Squeue({str(i): "RUNNING" for i in range(500)})
    poller = SqueuePoller(squeue, _ended, t.clock, thread=False)
    futures = [poller.look(str(i), _state(str(i)), None) for i in range(500)]
    assert poller.run_round() == 500
    assert squeue.calls == 1
    assert {f.result(timeout=0) for f in futures} == {"RUNNING"}


def test_a_look_with_a_period_waits_for_it_unless_its_job_ended() -> None:
    t = FakeClock()
    squeue = Squeue({"1": "RUNNING", "2": "RUNNING"})
    poller = SqueuePoller(squeue, _ended, t.clock, thread=False)
    for job in ("1", "2"):
        poller.look(job, _state(job), None)
    poller.run_round()
    t.now += 1
    running = poller.look("1", _state("1"), period=5)
    ending = poller.look("2", _state("2"), period=5)
    squeue.jobs["2"] = "COMPLETED"
    assert poller.run_round() == 1
    assert not running.done() and ending.result(timeout=0) == "COMPLETED"
    t.now += 4
    assert poller.run_round() == 1 and running.result(timeout=0) == "RUNNING"


def test_a_failed_round_fails_the_looks_due() -> None:
    t = FakeClock()

    def broken(ids: Collection[str]) -> Entries:
        raise RuntimeError("slurmctld is down")

    poller = SqueuePoller(broken, _ended, t.clock, thread=False)
    future = poller.look("1", lambda e: (_ for _ in ()).throw(e) if isinstance(e, BaseException) else e, None)
    poller.run_round()
    with pytest.raises(RuntimeError, match="slurmctld is down"):
        future.result(timeout=0)


def test_a_cancelled_look_is_dropped() -> None:
    t = FakeClock()
    squeue = Squeue({"1": "RUNNING"})
    poller = SqueuePoller(squeue, _ended, t.clock, thread=False)
    poller.look("1", _state("1"), None).cancel()
    assert plan(poller._looks, t.now, None, 1.0) == (False, None)


@pytest.mark.parametrize(
    ("dues", "last_round", "now", "expected"),
    [
        ([], None, 10.0, (False, None)),
        ([10.0, 12.0], None, 10.0, (True, 10.0)),
        ([11.0], None, 10.0, (False, 11.0)),
        ([10.0], 9.5, 10.0, (False, 10.5)),  # rounds at least min_interval apart
    ],
)
def test_when_the_next_round_runs(
    dues: list[float], last_round: float | None, now: float, expected: tuple[bool, float | None]
) -> None:
    t = FakeClock()
    t.now = now
    poller = SqueuePoller(Squeue({}), _ended, t.clock, thread=False)
    for due in dues:
        t.now = due
        poller.look("1", _state("1"), None)
    assert plan(poller._looks, now, last_round, 1.0) == expected


def test_a_look_made_while_a_round_fetches_waits_for_the_next_round() -> None:
    t = FakeClock()
    poller = SqueuePoller(lambda ids: {}, _ended, t.clock, thread=False)
    late: list[Any] = []

    def fetch(ids: Collection[str]) -> Entries:
        late.append(poller.look("2", lambda e: e, None))  # made at the round's own instant
        return {i: {"job_state": "RUNNING"} for i in ids}

    poller._fetch = fetch
    first = poller.look("1", lambda e: sorted(e), None)
    assert poller.run_round() == 1
    assert first.result(timeout=0) == ["1"] and not late[0].done()
    poller._fetch = lambda ids: {i: {"job_state": "RUNNING"} for i in ids}
    poller.run_round()
    assert late[0].result(timeout=0) == {"2": {"job_state": "RUNNING"}}
