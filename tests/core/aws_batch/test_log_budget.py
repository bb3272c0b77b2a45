"""The process's fair ``GetLogEvents`` budget: the rate, round-robin turns over thousands of
logs, no line lost or repeated under the budget, how far behind a read is (stub clients and a
fake clock), and the same over a real moto server."""

from __future__ import annotations

import collections
import contextlib
import json
import time
from typing import Any

import pytest

from airflow_provider_torchx.core.schedulers.aws_batch import create_scheduler
from airflow_provider_torchx.core.schedulers.aws_batch.logs import (
    DEFAULT_RPS,
    LogBudget,
    LogCursor,
    budget_rate,
    read_events,
)
from tests.core.aws_batch.fakes import FakeBatch, FakeLogs, child_job, mnp_job
from tests.fixtures.clock import FakeClock


def test_budget_bounds_the_rate_whoever_asks() -> None:
    clock = FakeClock()
    budget = LogBudget(rate=5.0, burst=5, clock=clock.clock)
    granted = 0
    for step in range(1000):  # 100 s in 0.1 s steps, 50 readers asking every step
        clock.now += 0.1
        granted += sum(budget.try_acquire(f"log-{(step + i) % 50}") for i in range(50))
    assert granted == budget.calls
    assert 5 * 100 <= granted <= 5 * 100 + 5


def test_two_thousand_logs_each_get_a_turn_every_round() -> None:
    """2,000 logs polled every 10 s under 5 calls/s: every log advances once per round of
    about 400 s; only calls left over at a round's end (its last readers ask only every 10 s)
    go to readers that already had their turn."""
    clock = FakeClock()
    budget = LogBudget(rate=5.0, clock=clock.clock, active_for=120.0)
    keys = [f"job-{i}" for i in range(2000)]
    grants = dict.fromkeys(keys, 0)
    for second in range(1200):  # 3 rounds; each second 200 logs poll (every log once in 10 s)
        clock.now += 1.0
        for key in keys[(second % 10) * 200 : (second % 10 + 1) * 200]:
            if budget.try_acquire(key):
                grants[key] += 1
    counts = collections.Counter(grants.values())
    assert min(counts) >= 2  # every log advanced, at least twice in 1,200 s
    assert counts[3] >= 1980 and max(counts) <= 5  # 3 rounds: all but a few got exactly 3 calls
    assert budget.calls <= 5 * 1200 + budget.burst


def test_a_lone_reader_reads_at_the_full_rate_and_others_keep_their_turn() -> None:
    clock = FakeClock()
    budget = LogBudget(rate=10.0, burst=10, clock=clock.clock)
    # one busy log: every call it asks for is granted while the bucket has tokens
    assert sum(budget.try_acquire("busy") for _ in range(12)) == 10
    clock.now += 1.0
    # a second log asks once: "busy" now takes all the tokens but one, kept for "quiet"'s turn
    assert budget.try_acquire("quiet")
    assert sum(budget.try_acquire("busy") for _ in range(20)) == 8
    assert budget.try_acquire("quiet")  # served at once although "busy" keeps asking
    assert not budget.try_acquire("busy") and not budget.try_acquire("quiet")  # the rate holds
    assert budget.calls == 10 + 10


def test_readers_that_stop_asking_are_forgotten() -> None:
    clock = FakeClock()
    budget = LogBudget(rate=1.0, burst=1, clock=clock.clock, active_for=30.0)
    for i in range(100):
        budget.try_acquire(f"gone-{i}")
    clock.now += 100.0
    # the 100 silent readers no longer hold turns: a lone new reader is served each second
    assert budget.try_acquire("alive")
    clock.now += 1.0
    assert budget.try_acquire("alive")
    assert len(budget._asked) == 1


def test_acquire_waits_for_the_turn() -> None:
    clock = FakeClock()
    budget = LogBudget(rate=2.0, burst=1, clock=clock.clock)
    assert budget.try_acquire("a")
    budget.acquire("b")
    assert clock.slept and 0.5 <= sum(clock.slept) <= 1.5


def test_a_retry_takes_a_call_from_the_rate_owed_when_none_is_left() -> None:
    """A granted call's retry (``charge``) takes a call too: the next grants wait until the
    rate has paid it back, so the rate holds over every attempt."""
    clock = FakeClock()
    budget = LogBudget(rate=1.0, burst=1, clock=clock.clock)
    assert budget.try_acquire("a")
    budget.charge()  # its retry: one call owed
    clock.now += 1.0
    assert not budget.try_acquire("b")  # the second paid the debt back
    clock.now += 1.0
    assert budget.try_acquire("b")
    assert budget.calls == 3


def test_rate_setting() -> None:
    assert budget_rate({}) == DEFAULT_RPS <= 10  # within the default quota of 10 per account and region
    assert budget_rate({"AIRFLOW_TORCHX_CLOUDWATCH_RPS": "2.5"}) == 2.5
    for bad in ("fast", "0", "-1", "5000"):
        with pytest.raises(ValueError, match=rf"AIRFLOW_TORCHX_CLOUDWATCH_RPS: '{bad}' is not a rate"):
            budget_rate({"AIRFLOW_TORCHX_CLOUDWATCH_RPS": bad})


def test_many_growing_logs_under_the_budget_lose_and_repeat_nothing() -> None:
    """200 logs growing for 30 s while they are read, non-waiting reads under 20 calls/s with
    pages of 3 events: every log advances in its turn and, once drained, holds every event
    exactly once, in order."""
    clock = FakeClock()
    budget = LogBudget(rate=20.0, burst=20, clock=clock.clock)
    logs = FakeLogs(page=3)
    names = [f"jd/default/s{i}" for i in range(200)]
    for name in names:
        logs.add(name, *(f"{name} {n}" for n in range(5)))
    cursors = {name: LogCursor() for name in names}
    seen: dict[str, list[str]] = {name: [] for name in names}
    behind: list[float] = []
    second = 0
    while second < 30 or any(len(v) < 35 for v in seen.values()):
        assert second < 600, "the logs were not drained in 600 s"
        clock.now += 1.0
        if second < 30:  # the jobs keep writing for 30 s
            for name in names:
                logs.add(name, f"{name} {5 + second}", start=10_000 + second * 1000)
        for name in names:
            events, cursors[name], _, lag = read_events(
                logs, budget, name, [name], cursors[name], None, False, wait=False
            )
            seen[name].extend(e["message"] for e in events)
            behind.append(lag)
        if second == 20:  # 20 s in, every log has advanced, none is done: fair shares (the
            # first readers read alone for a moment before the others asked, and ran ahead)
            progress = sorted(len(seen[n]) for n in names)
            assert progress[0] >= 3 and progress[-10] - progress[0] <= 3
        second += 1
    assert budget.calls <= 20 * second + 20
    for name in names:
        assert seen[name] == [f"{name} {n}" for n in range(35)]
    # a read refused its turn says how long since its last call; one that reached the end, 0:
    # once drained, every log is at most a round (200 logs / 20 calls/s = 10 s) behind
    assert any(0 < lag <= second for lag in behind)
    for _ in range(30):
        clock.now += 1.0
        for name in names:
            events, cursors[name], _, lag = read_events(
                logs, budget, name, [name], cursors[name], None, False, wait=False
            )
            assert events == [] and lag <= 10.0 + 1.0
            behind.append(lag)
    assert behind[-200:].count(0.0) >= 15


def test_read_log_says_how_far_behind_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_TORCHX_CLOUDWATCH_RPS", "3")  # this fake's budget: 3 calls, 3/s
    batch, logs = FakeBatch(), FakeLogs(page=2)
    batch.jobs["j1"] = mnp_job(status="RUNNING")
    batch.jobs["j1#0"] = child_job("j1", 0, "RUNNING")
    sched = create_scheduler("s", client=batch, log_client=logs)
    logs.add("jd/default/j1-0", "a1", "a2", "a3")
    chunk = sched.read_log("q1:app-1", "trainer", 0)  # 3 calls: 2 pages and the end
    assert chunk.lines == ["a1\n", "a2\n", "a3\n"] and chunk.behind_s == 0.0
    logs.add("jd/default/j1-0", "a4", start=3000)
    # the budget is spent: the read returns nothing and keeps its place, lagging
    lagging = sched.read_log("q1:app-1", "trainer", 0, cursor=chunk.cursor)
    assert lagging.lines == [] and lagging.cursor == chunk.cursor and not lagging.eof
    assert lagging.behind_s is not None and 0.0 <= lagging.behind_s < 5.0
    assert logs.calls == 3


def test_fair_reads_over_a_moto_server(aws_env: str) -> None:
    """60 real CloudWatch streams on the moto server, read without waiting under 30 calls/s
    with pages of 2 events: the rate holds and each stream ends with every event once, in
    order."""
    import boto3

    client: Any = boto3.client("logs")
    group = "/aws/batch/job"
    with contextlib.suppress(client.exceptions.ResourceAlreadyExistsException):
        client.create_log_group(logGroupName=group)
    names = [f"budget-test/default/s{i}" for i in range(60)]
    now_ms = int(time.time() * 1000)  # CloudWatch (and moto) reject events older than 14 days
    for name in names:
        client.create_log_stream(logGroupName=group, logStreamName=name)
        client.put_log_events(
            logGroupName=group,
            logStreamName=name,
            logEvents=[{"timestamp": now_ms + n, "message": f"{name} {n}"} for n in range(6)],
        )

    class SmallPages:
        """The real client, asked for pages of 2 events (CloudWatch pages hold up to 10,000)."""

        meta = client.meta

        def get_log_events(self, **kwargs: Any) -> dict[str, Any]:
            return dict(client.get_log_events(**{**kwargs, "limit": 2}))

    budget = LogBudget(rate=30.0, burst=30)
    cursors = {name: LogCursor() for name in names}
    seen: dict[str, list[str]] = {name: [] for name in names}
    rounds = 0
    started = time.monotonic()
    while any(len(v) < 6 for v in seen.values()):
        rounds += 1
        assert rounds < 600, f"not drained: {json.dumps({k: len(v) for k, v in seen.items()})}"
        for name in names:
            events, cursors[name], _, _ = read_events(
                SmallPages(), budget, name, [name], cursors[name], None, False, wait=False
            )
            seen[name].extend(e["message"] for e in events)
        time.sleep(0.05)
    assert budget.calls <= 30 + 30 * (time.monotonic() - started)  # the rate held
    assert rounds > 2  # reads were refused (the budget mattered) ...
    for name in names:  # ... and yet each stream holds every event once, in order
        assert seen[name] == [f"{name} {n}" for n in range(6)]
