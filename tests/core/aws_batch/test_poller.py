"""The shared status poller (stub client; the log budget is
in ``test_log_budget.py``; the moto-server run of the same poller is in ``test_integration.py`` and the benchmark)."""

from __future__ import annotations

import concurrent.futures
import gc
import itertools
import math
import statistics
import threading
import time
from typing import Any

import pytest

from airflow_provider_torchx.core.schedulers.aws_batch import clients as clients_module
from airflow_provider_torchx.core.schedulers.aws_batch import create_scheduler
from airflow_provider_torchx.core.schedulers.aws_batch import poller as poller_module
from airflow_provider_torchx.core.schedulers.aws_batch.poller import (
    StatusPoller,
    Waiter,
    answer_waiters,
    cached,
    shared_poller,
)
from airflow_provider_torchx.core.schedulers.aws_batch.schedule import next_round_at, round_gap, round_ids
from airflow_provider_torchx.core.schedulers.aws_batch.sweep import FAILED_PAUSE, GroupSize, sweep_plan
from tests.core.aws_batch.fakes import FakeBatch, FakeLogs, client_error, mnp_job
from tests.fixtures.clock import FakeClock


def test_many_watchers_share_batched_rounds() -> None:
    batch = FakeBatch()
    for i in range(250):
        batch.jobs[f"j{i}"] = mnp_job(job_id=f"j{i}")
    poller = StatusPoller(batch, min_interval=0.2)
    results: dict[str, Any] = {}
    start = threading.Barrier(250)

    def watch(job_id: str) -> None:
        start.wait()
        for _ in range(3):
            results[job_id] = poller.get([job_id])[job_id]
            time.sleep(0.1)

    threads = [threading.Thread(target=watch, args=(f"j{i}",)) for i in range(250)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(results[f"j{i}"]["jobId"] == f"j{i}" for i in range(250))
    sizes = [len(kw["jobs"]) for name, kw in batch.calls if name == "describe_jobs"]
    assert max(sizes) == 100
    # 250 watchers, 3 polls each: without sharing 750 calls; shared rounds of <= 3 calls
    assert poller.calls == len(sizes) <= 3 * poller.rounds
    assert poller.rounds <= 6
    assert poller.calls < 750 / 20


def test_the_cache_holds_nothing_the_collector_tracks_and_every_answer_is_a_copy() -> None:
    """The poller keeps every watched job's last description for a poll: as plain tuples of
    atoms (``cached``), which the garbage collector stops tracking, not as DescribeJobs dicts
    that would reach its oldest generation. Each answer is a copy of its own."""
    batch = FakeBatch()
    for i in range(200):
        batch.jobs[f"j{i}"] = mnp_job(job_id=f"j{i}")
    poller = StatusPoller(batch, min_interval=0.01)
    first = poller.get([f"j{i}" for i in range(200)])
    assert first["j7"] == batch.jobs["j7"]
    gc.collect()
    assert not any(gc.is_tracked(entry) for entry in poller._results.values())
    first["j7"]["status"] = "changed by a caller"
    again = poller.get(["j7"], max_age=3600.0)["j7"]
    assert again == batch.jobs["j7"] and again is not first["j7"]


def test_terminal_jobs_are_answered_from_cache_and_not_polled_again() -> None:
    batch = FakeBatch()
    batch.jobs["done"] = mnp_job(job_id="done", status="SUCCEEDED")
    batch.jobs["live"] = mnp_job(job_id="live", status="RUNNING")
    poller = StatusPoller(batch, min_interval=0.01)
    poller.get(["done", "live"])
    calls = len(batch.calls)
    poller.get(["done"], max_age=0)
    assert len(batch.calls) == calls
    poller.get(["live"], max_age=0)
    (last,) = [kw["jobs"] for name, kw in batch.calls[calls:]]
    assert last == ["live"]


def test_errors_reach_the_waiters_and_the_poller_recovers() -> None:
    batch = FakeBatch()
    batch.jobs["j"] = mnp_job(job_id="j")
    poller = StatusPoller(batch, min_interval=0.01)
    batch.fail_next = [client_error("AccessDeniedException", 403)]
    with pytest.raises(Exception, match="AccessDenied"):
        poller.get(["j"])
    assert poller.get(["j"])["j"]["jobId"] == "j"


def test_unknown_ids_are_none_and_expected_ids_are_not_visible_yet() -> None:
    batch = FakeBatch()
    poller = StatusPoller(batch, min_interval=0.01, visibility_grace=60)
    poller.expect("soon")
    got = poller.get(["soon", "never"])
    assert got["never"] is None
    assert got["soon"] is not None and got["soon"]["status"] == "SUBMITTED"


def test_pollers_are_shared_per_account_region_endpoint() -> None:
    a, b = FakeBatch(), FakeBatch()
    assert shared_poller(a) is shared_poller(a)
    assert shared_poller(a) is not shared_poller(b)


def test_pollers_are_shared_per_credentials_as_their_maker_names_them() -> None:
    a = FakeBatch()
    assert shared_poller(a, "conn:1") is shared_poller(a, "conn:1")
    assert shared_poller(a, "conn:1") is not shared_poller(a, "conn:2")


def test_idle_pollers_are_dropped_from_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pollers of credentials nobody uses any more (a connection edited, keys rotated) go;
    one with a round to come stays."""
    idle, busy = shared_poller(FakeBatch()), shared_poller(b := FakeBatch())
    busy.request(["j"], period=3600.0)  # its round is to come
    idle_client = idle.client
    monkeypatch.setattr(poller_module, "POLLER_IDLE_FORGET", 0.0)
    time.sleep(0.01)
    shared_poller(FakeBatch())  # a new poller: the registry is pruned
    assert shared_poller(b) is busy
    assert shared_poller(idle_client) is not idle


def test_requests_are_futures_its_thread_resolves_without_waiters_threads() -> None:
    """1,000 waiters hold no thread: their futures are resolved by the poller's thread, in
    shared rounds; an error reaches every waiter of its round; a cancelled one is skipped."""
    batch = FakeBatch()
    for i in range(1000):
        batch.jobs[f"j{i}"] = mnp_job(job_id=f"j{i}")
    poller = StatusPoller(batch, min_interval=0.05)
    threads_before = threading.active_count()
    futures = [poller.request([f"j{i}"]) for i in range(1000)]
    assert threading.active_count() <= threads_before + 1  # the poller's own thread, at most
    resolvers: set[str] = set()
    for f in futures:
        f.add_done_callback(lambda _: resolvers.add(threading.current_thread().name))
    answers = [f.result(timeout=10) for f in futures]
    assert [a[f"j{i}"]["jobId"] for i, a in enumerate(answers)] == [f"j{i}" for i in range(1000)]
    assert poller.rounds <= 2 and poller.calls <= 20
    assert resolvers <= {"aws-batch-status-poller", threading.current_thread().name}

    cancelled = poller.request(["j1"], max_age=0)
    cancelled.cancel()
    batch.fail_next = [client_error("AccessDeniedException", 403)]
    failing = poller.request(["j2"], max_age=0)
    with pytest.raises(Exception, match="AccessDenied"):
        failing.result(timeout=10)
    assert cancelled.cancelled()
    assert poller.request(["j3"], max_age=0).result(timeout=10)["j3"]["jobId"] == "j3"


def test_a_round_describes_only_the_ids_asked_for_since_the_last() -> None:
    """A job costs one id in one call per poll of its watcher: a round does not refresh every
    job watched lately (at 2,000 jobs that was 20 calls a round whatever their poll interval)."""
    batch = FakeBatch()
    for job_id in ("a", "b", "c"):
        batch.jobs[job_id] = mnp_job(job_id=job_id, status="RUNNING")
    poller = StatusPoller(batch, min_interval=0.01)
    poller.get(["a", "b", "c"])
    calls = len(batch.calls)
    poller.get(["a"], max_age=0)
    poller.get(["b", "c"], max_age=0)
    assert [kw["jobs"] for _, kw in batch.calls[calls:]] == [["a"], ["b", "c"]]


# ---------------------------------------------------------------------- scheduled looks


def test_round_gap_fills_its_calls_within_an_eighth_of_the_period() -> None:
    assert round_gap(rate=1000 / 10, min_period=10, min_interval=1.0) == 1.0  # 100 ids a round
    assert round_gap(rate=500 / 10, min_period=10, min_interval=1.0) == 2.0  # 100 ids, 2 s apart
    assert round_gap(rate=10 / 10, min_period=10, min_interval=1.0) == 2.5  # few jobs: a quarter period
    assert round_gap(rate=5000 / 10, min_period=10, min_interval=1.0) == 1.0  # 5 calls a round
    assert round_gap(rate=1500 / 10, min_period=10, min_interval=1.0) == pytest.approx(4 / 3)  # 2 full calls
    assert round_gap(rate=sum([0.1] * 5000), min_period=10, min_interval=1.0) == 1.0  # a float sum's 500.0000001
    assert round_gap(rate=0.0, min_period=math.inf, min_interval=1.0) == 1.0


def test_next_round_at() -> None:
    # ids asked for at once: coalesce after the first ask, at least min_interval after the last round
    assert next_round_at(100.0, 1.0, 2.0, 0.05, asap_since=100.5, earliest_due=None) == 101.0
    assert next_round_at(100.0, 1.0, 2.0, 0.05, asap_since=103.0, earliest_due=None) == 103.05
    # scheduled ids: from half a gap before the earliest due time, rounds a gap apart
    assert next_round_at(100.0, 1.0, 2.0, 0.05, asap_since=None, earliest_due=110.0) == 109.0
    assert next_round_at(100.0, 1.0, 2.0, 0.05, asap_since=None, earliest_due=100.5) == 102.0
    assert next_round_at(100.0, 1.0, 2.0, 0.05, asap_since=101.0, earliest_due=110.0) == 101.05
    assert next_round_at(100.0, 1.0, 2.0, 0.05, asap_since=None, earliest_due=None) is None


def test_a_round_takes_asked_and_overdue_ids_its_share_of_due_ones_and_early_ones_while_calls_have_room() -> None:
    due = [(99.0, "late"), (100.02, "now"), (100.5, "early"), (101.5, "later")]
    # gap 2: due by 101 (half a gap ahead) is taken; "later" waits for its own round
    assert round_ids({"asked"}, due, now=100.0, gap=2.0, coalesce=0.05) == ["asked", "early", "late", "now"]
    # 100 ids already fill a call: an early id waits; one due within ``coalesce`` still comes
    asked = {f"a{i:03}" for i in range(98)}
    assert round_ids(asked, due, now=100.0, gap=2.0, coalesce=0.05) == sorted({*asked, "late", "now"})
    assert round_ids(set(), [], now=100.0, gap=2.0, coalesce=0.05) == []
    # a round's share of calls: due ids past it wait for the next round, overdue ones never do
    crowd = [(100.0, f"d{i:03}") for i in range(150)]
    assert round_ids(set(), crowd, now=100.0, gap=1.0, coalesce=0.05, calls=1) == [f"d{i:03}" for i in range(100)]
    assert len(round_ids(set(), crowd, now=100.0, gap=1.0, coalesce=0.05, calls=2)) == 150
    overdue = [(99.0, f"o{i:03}") for i in range(130)] + [(100.0, "now"), (100.3, "early")]
    assert len(round_ids(set(), overdue, now=100.0, gap=1.0, coalesce=0.05, calls=1)) == 132  # its 2nd call filled
    # ``due`` is read only as far as the round takes, and one more
    seen: list[str] = []
    lazily = ((at, seen.append(job_id) or job_id) for at, job_id in due)
    round_ids(set(), lazily, now=100.0, gap=0.0, coalesce=0.05)
    assert seen == ["late", "now"]  # "late" taken, "now" (beyond the horizon) read and left


def test_a_round_answers_the_waiters_it_completes_and_a_failed_one_those_it_touched() -> None:
    def waiter(ids: list[str], need: set[str], after_round: int) -> Waiter:
        return Waiter(tuple(ids), need, after_round, concurrent.futures.Future(), lambda answer: None)

    results = {"a": cached(1.0, {"status": "RUNNING"}), "b": cached(1.0, None)}
    done = waiter(["a", "b"], {"a"}, 0)
    half = waiter(["a", "c"], {"a", "c"}, 0)
    newer = waiter(["a"], {"a"}, 5)  # made after round 5 began: only a later round answers it
    gone = waiter(["a"], {"a"}, 0)
    gone.future.cancel()
    ready, pending = answer_waiters([done, half, newer, gone], 5, {"a", "b"}, results, None)
    assert ready == [(done, {"a": {"status": "RUNNING"}, "b": None})]
    assert [(w.ids, w.need) for w in pending] == [(("a", "c"), {"c"}), (("a",), {"a"})]
    assert half.need == {"a", "c"}  # the snapshot is left as it was
    boom = RuntimeError("throttled")
    ready, pending = answer_waiters([done, half, newer], 5, {"a"}, results, boom)
    assert ready == [(done, boom), (half, boom)] and pending == [newer]


class HandPoller(StatusPoller):
    """A poller whose rounds the test runs by hand at the fake clock's times (no thread)."""

    def _ensure_thread(self) -> None:
        pass

    def step(self, clock: FakeClock, seconds: float) -> None:
        """Advance ``clock`` by ``seconds``, running each round when it is due (as the thread
        would, waking on time)."""
        end = clock.now + seconds
        while (wake := self._next_round_at()) is not None and wake <= end:
            clock.now = max(clock.now, wake)
            self._round()
        clock.now = end


def test_a_pollers_memory_stays_flat_over_100000_job_lifetimes() -> None:
    """A triggerer's poller over a long life: 100,000 jobs submitted (their app id and job id
    remembered, expected), watched until they end, then left, 100 every 6 minutes. Every table
    the poller keeps per job (the app ids too) holds only the jobs asked about within
    ``FORGET_AFTER``: as many entries after the 100,000th job as after the 2,000th."""
    clock = FakeClock()
    batch = FakeBatch()
    poller = HandPoller(batch, clock=clock.clock)
    per_step, step_s = 100, 360.0
    sizes: list[tuple[int, ...]] = []
    for step in range(100_000 // per_step):
        ids = [f"j{step}-{i}" for i in range(per_step)]
        for job_id in ids:
            batch.jobs[job_id] = {"jobId": job_id, "jobName": job_id, "jobQueue": "q1", "status": "RUNNING"}
            poller.remember(f"q1:{job_id}", job_id)
            poller.expect(job_id)
        poller.request(ids)
        poller.step(clock, 1.0)
        for job_id in ids:
            batch.jobs[job_id]["status"] = "SUCCEEDED"
        ended = poller.request(ids, max_age=0)
        poller.step(clock, step_s - 1.0)
        assert all(job["status"] == "SUCCEEDED" for job in ended.result(timeout=0).values())
        for job_id in ids:
            del batch.jobs[job_id]
        tables = (poller._accessed, poller._results, poller._expected, poller._job_ids)
        sizes.append((*map(len, tables), len(poller.schedule), len(poller._waiters)))
    window = per_step * (int(poller_module.FORGET_AFTER // step_s) + 1)
    assert max(max(s[:4]) for s in sizes) <= window and all(s[4:] == (0, 0) for s in sizes)
    assert sizes[-1] == sizes[19] == max(sizes)
    assert poller.job_id("q1:j0-0") is None and poller.job_id("q1:j999-0") == "j999-0"


def follow(poller: StatusPoller, job_id: str, period: float, seen: dict[str, list[tuple[float, str]]]) -> None:
    """A trigger's rhythm: on each answer, note it and ask for the next scheduled look."""

    def answered(future: Any) -> None:
        job = future.result()[job_id]
        seen[job_id].append((poller.clock.monotonic(), job["status"]))
        if job["status"] not in ("SUCCEEDED", "FAILED"):
            poller.request([job_id], period=period).add_done_callback(answered)

    poller.request([job_id]).add_done_callback(answered)


def test_scheduled_looks_keep_one_period_and_fill_their_calls() -> None:
    """1,000 jobs followed at a 10 s period by watchers that joined over 10 s: the poller looks
    at each job every 10 s on average (its watcher's latency does not add up), in rounds of
    one full call a second; a job's end is seen by the first round that looks at it."""
    clock = FakeClock()
    batch = FakeBatch()
    n, period = 1000, 10.0
    for i in range(n):
        batch.jobs[f"j{i}"] = mnp_job(job_id=f"j{i}", status="PENDING")
    poller = HandPoller(batch, clock=clock.clock)
    seen: dict[str, list[tuple[float, str]]] = {f"j{i}": [] for i in range(n)}
    for tick in range(2000):  # 200 s in steps of 0.1 s
        if tick < 100:
            for i in range(n * tick // 100, n * (tick + 1) // 100):
                follow(poller, f"j{i}", period, seen)
        if tick == 1500:
            ended = clock.now
            for i in range(n):
                batch.jobs[f"j{i}"] = mnp_job(job_id=f"j{i}", status="SUCCEEDED")
        poller.step(clock, 0.1)
    steady = [c for c in batch.calls if c[0] == "describe_jobs"][30:140]  # ~110 s of steady rounds
    assert all(len(kw["jobs"]) == 100 for _, kw in steady)
    gaps = [b[0] - a[0] for looks in seen.values() for a, b in itertools.pairwise(looks[2:15])]
    assert 9.9 <= statistics.mean(gaps) <= 10.1 and max(gaps) <= period + poller.gap()
    calls_s = len([c for c in batch.calls if c[0] == "describe_jobs"]) / 200
    assert calls_s <= 1.1
    delays = sorted(looks[-1][0] - ended for looks in seen.values())
    assert all(looks[-1][1] == "SUCCEEDED" for looks in seen.values())
    assert delays[-1] <= period + poller.gap() / 2 + 0.2  # the first look after the end, no extra poll


def test_watchers_joining_in_uneven_bursts_cost_one_full_call_a_second() -> None:
    """1,000 jobs whose watchers join in bursts of 40 to 160 a second: each round's looks
    fall due together a period later, so a burst over 100 would cost a second call every
    period; the rounds' share keeps them at one full call a second, each job looked at about
    every period and never more than a gap late."""
    clock = FakeClock()
    batch = FakeBatch()
    period, bursts = 10.0, [130, 70, 160, 40, 100, 100, 150, 50, 120, 80]
    n = sum(bursts)
    for i in range(n):
        batch.jobs[f"j{i}"] = mnp_job(job_id=f"j{i}", status="RUNNING")
    poller = HandPoller(batch, clock=clock.clock)
    seen: dict[str, list[tuple[float, str]]] = {f"j{i}": [] for i in range(n)}
    joined = 0
    for size in bursts:  # a burst a second
        for i in range(joined, joined + size):
            follow(poller, f"j{i}", period, seen)
        joined += size
        poller.step(clock, 1.0)
    poller.step(clock, 40.0)  # settled
    start = len(batch.calls)
    poller.step(clock, 100.0)
    steady = [kw["jobs"] for name, kw in batch.calls[start:] if name == "describe_jobs"]
    assert len(steady) <= 101 and sum(map(len, steady)) >= 99 * 100, [len(ids) for ids in steady]
    gaps = [b[0] - a[0] for looks in seen.values() for a, b in itertools.pairwise(looks[5:])]
    assert 9.9 <= statistics.mean(gaps) <= 10.1 and max(gaps) <= period + poller.gap() + poller.coalesce


def test_any_round_that_looks_at_a_job_answers_its_scheduled_waiters() -> None:
    """A waiter for a job's next scheduled look is answered by an earlier round that describes
    the job for someone else (and so sees an end as soon as any round does)."""
    clock = FakeClock()
    batch = FakeBatch()
    batch.jobs["j"] = mnp_job(job_id="j", status="RUNNING")
    poller = HandPoller(batch, clock=clock.clock)
    first = poller.request(["j"])
    poller.step(clock, 0.1)
    assert first.result(timeout=0)["j"]["status"] == "RUNNING"
    scheduled = poller.request(["j"], period=60.0)
    batch.jobs["j"] = mnp_job(job_id="j", status="FAILED")
    poller.step(clock, 3.0)
    assert not scheduled.done()  # not due for a minute
    other = poller.request(["j"], max_age=0)
    poller.step(clock, 0.1)
    assert other.result(timeout=0)["j"]["status"] == "FAILED"
    assert scheduled.result(timeout=0)["j"]["status"] == "FAILED"
    assert poller.request(["j"], period=60.0).result(timeout=0)["j"]["status"] == "FAILED"  # terminal: cached


def test_sweep_plan_lists_groups_within_the_scheduled_calls_budget() -> None:
    q = [("arn:q1", "PENDING"), ("arn:q1", "RUNNING"), ("arn:q2", "RUNNING")]
    assert sweep_plan({q[0]: GroupSize(1000, 10.0, 1000, 1)}) == {q[0]: 2.5}  # a quarter period
    assert sweep_plan({q[0]: GroupSize(5, 10.0, 5, 1)}) == {q[0]: 2.5}  # one group at full rate
    assert sweep_plan({q[0]: GroupSize(1000, 10.0, 4000, 4)}) == {q[0]: 5.0}  # most are others'
    assert sweep_plan({q[0]: GroupSize(1000, 10.0, 8000, 8)}) == {}  # no sooner than the schedule
    three = {key: GroupSize(1000, 10.0, 1000, 1) for key in q}
    assert sweep_plan(three) == dict.fromkeys(q, 2.5)  # 1.2 ListJobs/s within 3 DescribeJobs/s
    # Small groups share the budget (here 1 call/s), the biggest first; the rest wait their looks.
    small = {q[0]: GroupSize(100, 10.0, 100, 1), q[1]: GroupSize(300, 10.0, 300, 1), q[2]: GroupSize(600, 10.0, 600, 1)}
    assert sweep_plan(small) == pytest.approx({q[2]: 2.5, q[1]: 2.5, q[0]: 5.0})
    many = {(f"arn:q{i}", "RUNNING"): GroupSize(5, 10.0, 5, 1) for i in range(10)}
    assert len(sweep_plan(many)) == 1
    assert sweep_plan({}) == {}


def sweeping_step(poller: HandPoller, clock: FakeClock, seconds: float) -> None:
    """``HandPoller.step`` with the change sweep's passes at their due times too."""
    end = clock.now + seconds
    while True:
        wake = poller._next_round_at()
        sweep_at = poller.sweep.step()
        due = [t for t in (wake, sweep_at) if t is not None and t <= end]
        if not due:
            break
        clock.now = max(clock.now, min(due))
        if wake is not None and wake <= clock.now:
            poller._round()
    clock.now = end


def test_the_change_sweep_sees_ends_within_a_quarter_period_for_a_few_list_calls() -> None:
    """1,000 PENDING jobs followed at a 10 s period: ``ListJobs(PENDING)`` every 2.5 s finds
    the jobs that left PENDING and the next round describes them, so every end is seen within
    about a quarter period, for 0.4 ListJobs calls a second on top of the scheduled
    DescribeJobs call a second."""
    clock = FakeClock()
    batch = FakeBatch(page_size=1000)
    n, period = 1000, 10.0
    for i in range(n):
        batch.jobs[f"j{i}"] = mnp_job(job_id=f"j{i}", status="PENDING")
    poller = HandPoller(batch, clock=clock.clock)
    seen: dict[str, list[tuple[float, str]]] = {f"j{i}": [] for i in range(n)}
    ends: dict[str, float] = {}
    for tick in range(1200):  # 120 s in steps of 0.1 s
        if tick < 100:
            for i in range(n * tick // 100, n * (tick + 1) // 100):
                follow(poller, f"j{i}", period, seen)
        if 600 <= tick < 700:  # ten jobs end every 0.1 s for 10 s
            for i in range(10 * (tick - 600), 10 * (tick - 599)):
                batch.jobs[f"j{i}"] = mnp_job(job_id=f"j{i}", status="SUCCEEDED")
                ends[f"j{i}"] = clock.now
        sweeping_step(poller, clock, 0.1)
    lists = [kw for name, kw in batch.calls if name == "list_jobs"]
    queue = "arn:aws:batch:us-west-2:1:job-queue/q1"
    assert {(kw["jobQueue"], kw["jobStatus"], kw["maxResults"]) for kw in lists} == {(queue, "PENDING", 1000)}
    assert len(lists) / 120 <= 0.45
    assert all(looks[-1][1] == "SUCCEEDED" for looks in seen.values())
    delays = sorted(seen[j][-1][0] - ends[j] for j in ends)
    assert delays[-1] <= period / 4 + poller.gap() + 0.3  # the listing, then the next round
    describes = [kw for name, kw in batch.calls if name == "describe_jobs"]
    assert len(describes) / 120 <= 1.5  # the scheduled call a second, and the ended jobs'


def test_a_hint_for_a_job_described_in_another_status_since_is_ignored() -> None:
    clock = FakeClock()
    batch = FakeBatch(page_size=1000)
    batch.jobs["j"] = mnp_job(job_id="j", status="RUNNABLE")
    poller = HandPoller(batch, clock=clock.clock)
    poller.request(["j"])
    poller.step(clock, 0.1)
    waiter = poller.request(["j"], period=60.0)
    queue = "arn:aws:batch:us-west-2:1:job-queue/q1"
    poller.look_soon((queue, "PENDING"), ["j"])  # listed before the description said RUNNABLE
    poller.step(clock, 5.0)
    assert not waiter.done()
    poller.look_soon((queue, "RUNNABLE"), ["j"])
    poller.step(clock, 1.0)
    assert waiter.result(timeout=0)["j"]["status"] == "RUNNABLE"


def test_a_failed_listing_leaves_the_scheduled_looks_and_is_tried_again_minutes_later() -> None:
    clock = FakeClock()
    batch = FakeBatch(page_size=1000)
    batch.jobs["j"] = mnp_job(job_id="j", status="RUNNING")
    poller = HandPoller(batch, clock=clock.clock)
    seen: dict[str, list[tuple[float, str]]] = {"j": []}
    follow(poller, "j", 10.0, seen)
    poller.step(clock, 0.1)
    denied = client_error("AccessDeniedException", 403)
    batch.fail_next = [denied]
    sweeping_step(poller, clock, 60.0)
    lists = [c for c in batch.calls if c[0] == "list_jobs"]
    assert len(lists) == 1  # the failed one; the next comes FAILED_PAUSE later
    assert len(seen["j"]) >= 6  # looked at every 10 s all the same
    sweeping_step(poller, clock, FAILED_PAUSE)
    assert len([c for c in batch.calls if c[0] == "list_jobs"]) > 1


def test_a_scheduler_holds_its_poller_until_the_registry_forgets_it_or_its_credentials_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A watcher reads ``AWSBatchScheduler.poller`` on every look: it is held, not looked up
    each time, yet it is always the registry's poller for the scheduler's client and credentials."""
    batch = FakeBatch()
    sched = create_scheduler("s", client=batch, log_client=FakeLogs(), session_key="conn:1")
    held = sched.poller
    lookups = []
    monkeypatch.setattr(
        clients_module, "shared_poller", lambda *a: lookups.append(a) or poller_module.shared_poller(*a)
    )
    assert sched.poller is held and sched.poller is held
    assert lookups == []  # held: no registry look-up per access

    monkeypatch.setattr(poller_module, "POLLER_IDLE_FORGET", 0.0)
    time.sleep(0.01)
    shared_poller(FakeBatch())  # a new poller prunes the idle one from the registry
    assert held.forgotten
    renewed = sched.poller
    assert renewed is not held and renewed is shared_poller(batch, "conn:1")  # shared again
    assert sched.poller is renewed

    sched.aws._session_key = "conn:2"  # what its maker says it signs with now
    assert sched.poller is shared_poller(batch, "conn:2") and sched.poller is not renewed
