"""The status poller's schedule (``aws_batch/schedule.py``: ``RoundSchedule`` and ``round_ids``)
without a poller, a client or a thread: its invariants, each tested here once, on a fake clock
(the times passed in). The poller driving it against a stub client is ``test_poller.py``."""

from __future__ import annotations

import itertools

import pytest

from airflow_provider_torchx.core.schedulers.aws_batch.poller import StatusPoller
from airflow_provider_torchx.core.schedulers.aws_batch.schedule import (
    DESCRIBE_BATCH,
    RoundSchedule,
    round_calls,
    round_gap,
    round_ids,
)
from tests.core.aws_batch.fakes import FakeBatch

MIN_INTERVAL, COALESCE = 1.0, 0.05


def schedule() -> RoundSchedule:
    return RoundSchedule(MIN_INTERVAL, COALESCE)


def test_an_id_is_scheduled_once_at_its_earliest_due_time_and_shortest_period() -> None:
    s = schedule()
    s.schedule("a", 110.0, 10.0)
    s.schedule("a", 120.0, 20.0)  # later and longer: no change
    assert (len(s), s.earliest_due(), list(s.periods()), s.rate) == (1, 110.0, [("a", 10.0)], 0.1)
    s.schedule("a", 105.0, 30.0)  # earlier: its due time, the shorter period kept
    assert (len(s), s.earliest_due(), list(s.periods())) == (1, 105.0, [("a", 10.0)])
    s.schedule("a", 108.0, 5.0)  # shorter: its period, the earlier due time kept
    assert (len(s), s.earliest_due(), list(s.periods()), s.rate) == (1, 105.0, [("a", 5.0)], 0.2)
    assert "a" in s and "b" not in s


def test_the_earliest_due_time_is_that_of_a_scheduled_id_never_a_stale_entry() -> None:
    s = schedule()
    s.schedule("a", 110.0, 10.0)
    s.schedule("b", 120.0, 10.0)
    s.schedule("a", 105.0, 10.0)  # a's entry at 110 is stale now
    assert s.earliest_due() == 105.0
    assert s.take(105.0) == ["a"]  # b is due 15 s later: not early enough to come along
    assert s.earliest_due() == 120.0  # not a's stale 110
    assert s.take(120.0) == ["b"]
    assert (len(s), s.earliest_due(), s.next_round_at()) == (0, None, None)


def test_the_rate_is_the_sum_of_the_inverse_periods_at_every_step() -> None:
    """Ids of periods whose inverses are not exact floats, taken in rounds until none is left:
    the rate (derived from the count of ids per period, never kept in step by hand) and the
    gap follow the scheduled ids at every step, and are exactly 0 and ``min_interval`` at
    the end."""
    s = schedule()
    periods = [0.3, 0.7, 3.0, 10.0, 11.0]
    for i in range(5000):
        s.schedule(f"j{i}", 100.0 + i / 1000, periods[i % len(periods)])
    now = 100.0
    while (wake := s.next_round_at()) is not None:
        now = max(now, wake)
        assert s.rate == pytest.approx(sum(1 / period for _, period in s.periods()))
        assert s.gap() == round_gap(s.rate, min(p for _, p in s.periods()), MIN_INTERVAL)
        assert s.take(now)
    assert (len(s), s.rate, s.gap()) == (0, 0.0, MIN_INTERVAL)


def test_ids_asked_for_wait_coalesce_for_company_and_min_interval_after_the_last_round() -> None:
    s = schedule()
    s.ask("x", 100.0)
    s.ask("y", 100.03)
    assert s.next_round_at() == 100.0 + COALESCE  # from the first ask
    assert s.take(100.05) == ["x", "y"] and s.last_round == 100.05
    assert s.next_round_at() is None
    s.ask("z", 100.2)
    assert s.next_round_at() == 100.05 + MIN_INTERVAL
    assert s.take(101.05) == ["z"]
    assert s.take(200.0) == [] and s.last_round == 101.05  # a round without ids does not count


def test_a_round_takes_each_id_asked_for_and_unschedules_what_it_takes() -> None:
    """An id the change sweep asks for while it waits for its scheduled look is taken at once,
    and its scheduled look goes: a round describes an id once."""
    s = schedule()
    s.schedule("a", 200.0, 10.0)
    s.ask("a", 100.0)
    assert s.take(100.05) == ["a"]
    assert ("a" in s, s.earliest_due(), s.rate) == (False, None, 0.0)


def due(prefix: str, n: int, at: float) -> list[tuple[float, str]]:
    return [(at, f"{prefix}{i:03}") for i in range(n)]


NOW, GAP = 100.0, 2.0  # ids due by 100.05 are due now; up to 101.0 early; later ones wait
OVERDUE, NOW_DUE, EARLY, LATER = 99.0, 100.02, 100.5, 101.5


@pytest.mark.parametrize(
    ("asked", "scheduled", "calls", "taken"),
    [
        # must: asked and overdue, whatever the calls they take
        pytest.param(120, due("o", 130, OVERDUE), 1, 250, id="must-takes-asked-and-overdue-past-the-calls"),
        # share: due now, up to the round's calls ...
        pytest.param(0, due("n", 150, NOW_DUE), 1, 100, id="share-stops-at-the-rounds-calls"),
        pytest.param(0, due("n", 250, NOW_DUE), 2, 200, id="share-of-two-calls"),
        # ... or to the end of the last call the must phase opened
        pytest.param(0, due("o", 130, OVERDUE) + due("n", 100, NOW_DUE), 1, 200, id="share-fills-the-open-call"),
        pytest.param(0, due("o", 100, OVERDUE) + due("n", 10, NOW_DUE), 1, 100, id="share-opens-no-call-past-its-own"),
        # fill: early ids while they fit the calls already open, at least one
        pytest.param(0, due("e", 150, EARLY), 1, 100, id="fill-takes-one-call-of-early-ids"),
        pytest.param(30, due("e", 150, EARLY), 3, 100, id="fill-tops-up-the-open-call-whatever-the-share"),
        pytest.param(0, due("n", 100, NOW_DUE) + due("e", 10, EARLY), 1, 100, id="fill-opens-no-call"),
        # nothing more than half a gap early
        pytest.param(0, due("l", 10, LATER), 1, 0, id="later-ids-wait"),
    ],
)
def test_a_round_takes_must_then_share_then_fill(
    asked: int, scheduled: list[tuple[float, str]], calls: int, taken: int
) -> None:
    ids = round_ids({f"a{i:03}" for i in range(asked)}, scheduled, NOW, GAP, COALESCE, calls)
    assert len(ids) == taken
    expected = {f"a{i:03}" for i in range(asked)} | {job_id for _, job_id in scheduled[: taken - asked]}
    assert set(ids) == expected  # the earliest first


def test_a_round_reads_the_due_ids_only_as_far_as_it_takes_and_one_more() -> None:
    read: list[str] = []
    pairs = [(OVERDUE, "o"), (NOW_DUE, "n"), (EARLY, "e"), (LATER, "l"), (LATER + 1, "never read")]
    assert round_ids(set(), ((at, read.append(i) or i) for at, i in pairs), NOW, GAP, COALESCE) == ["e", "n", "o"]
    assert read == ["o", "n", "e", "l"]


def run_rounds(
    s: RoundSchedule, joins: dict[float, list[str]], period: float, until: float
) -> list[tuple[float, list[str], list[float]]]:
    """Drive ``s`` on a fake clock as the poller does: ids join (a first look, asked for at
    once) at their times; each round starts when ``next_round_at`` says, and every id it
    takes is scheduled again one period after the round's start. Returns each round's
    start, ids and the due times of its scheduled ids."""
    rounds = []
    due_at: dict[str, float] = {}
    pending = sorted(joins.items())
    now = 0.0
    while True:
        wake = s.next_round_at()
        join_at = pending[0][0] if pending else None
        times = [t for t in (wake, join_at) if t is not None and t <= until]
        if not times:
            return rounds
        now = max(now, min(times))
        if join_at is not None and join_at <= now:
            for job_id in pending.pop(0)[1]:
                s.ask(job_id, now)
            continue
        ids = s.take(now)
        rounds.append((now, ids, [due_at.pop(i) for i in ids if i in due_at]))
        for job_id in ids:
            due_at[job_id] = now + period
            s.schedule(job_id, now + period, period)


def test_on_a_fake_clock_looks_fill_their_calls_one_period_apart_within_a_gap_of_due() -> None:
    """1,000 ids at a 10 s period joining over 13.7 s in uneven bursts (4 to 16 every 0.137 s):
    once all joined, the rate is exactly 100 looks a second, the gap 1 s and every round
    one full call, a second apart; throughout, no look comes more than half a gap early nor
    a gap (plus ``coalesce``) late (a round's share leaves the excess to the next round,
    where it is overdue)."""
    s = schedule()
    period, sizes = 10.0, [13, 7, 16, 4, 10, 10, 15, 5, 12, 8]
    names = iter(f"j{i:04}" for i in itertools.count())
    joins = {round(k * 0.137, 3): [next(names) for _ in range(sizes[k % 10])] for k in range(100)}
    rounds = run_rounds(s, joins, period, until=200.0)
    assert s.rate == 1000 / period and s.gap() == 1.0 and round_calls(s.rate, s.gap()) == 1
    lateness = [at - d for at, _, dues in rounds for d in dues]
    assert len(lateness) > 10_000
    assert min(lateness) >= -s.gap() / 2 and max(lateness) < s.gap() + COALESCE
    steady = [(at, ids) for at, ids, _ in rounds if at >= 50.0]
    assert all(len(ids) == DESCRIBE_BATCH for _, ids in steady), [len(ids) for _, ids in steady]
    assert all(b[0] - a[0] == pytest.approx(s.gap()) for a, b in itertools.pairwise(steady))


def test_the_pollers_round_intervals_are_its_schedules() -> None:
    poller = StatusPoller(FakeBatch(), min_interval=0.5, coalesce=0.1)
    assert (poller.schedule.min_interval, poller.schedule.coalesce) == (0.5, 0.1)
    poller.min_interval = 0.01  # as tests that want rounds as fast as they go do
    assert poller.schedule.min_interval == poller.min_interval == 0.01
