"""The status poller's schedule: when its next round starts and which ids the round describes.

``StatusPoller`` (``poller.py``) answers watchers and makes the calls; this module decides the
rhythm. Ids come in two kinds: asked for at once (a watcher wants a recent answer, or the
change sweep saw the job leave its status) and scheduled (a watcher's next look, one period
after its previous one). ``RoundSchedule`` holds both, plus the time of the last round; the
rules it applies are the pure functions below (``round_gap``, ``round_calls``,
``next_round_at``, ``round_ids``), so they can be read and tested one at a time. It reads no
clock: the poller passes ``now`` (see docs/architecture.md, "is looked at on the poller's
schedule").
"""

from __future__ import annotations

import collections
import heapq
import math
from collections.abc import Iterable, Iterator

#: DescribeJobs accepts at most this many ids per call.
DESCRIBE_BATCH = 100


def round_gap(rate: float, min_period: float, min_interval: float, batch: int = DESCRIBE_BATCH) -> float:
    """Seconds between two scheduled rounds: the time ids falling due at ``rate`` a second
    take to fill the round's calls (``round_calls``: one, or as many as fall due in
    ``min_interval``), at least ``min_interval`` and at most a quarter of the shortest period
    asked for (so that no job is looked at more than an eighth of its period early, nor, when
    calls are full, a quarter late)."""
    if rate <= 0:
        return min_interval
    calls = max(1, math.ceil(round(rate * min_interval / batch, 6)))  # 5.0000001 (a float sum) is 5
    return max(min_interval, min(calls * batch / rate, min_period / 4))


def round_calls(rate: float, gap: float, batch: int = DESCRIBE_BATCH) -> int:
    """The calls a round of scheduled looks makes, ``gap`` seconds after the last (at least
    one): those the ids falling due meanwhile fill."""
    return max(1, round(rate * gap / batch))


def next_round_at(
    last_round: float,
    min_interval: float,
    gap: float,
    coalesce: float,
    asap_since: float | None,
    earliest_due: float | None,
) -> float | None:
    """When the next round starts (None: nothing to do). Ids asked for without a schedule
    (``asap_since``: when the first of them was asked) wait ``coalesce`` for company and at
    least ``min_interval`` after the last round; scheduled ids are looked at from half a gap
    before their due time, rounds at least ``gap`` apart, so that a job's looks stay one
    period apart on average and a round describes ``gap`` seconds' worth of due ids."""
    times = []
    if asap_since is not None:
        times.append(max(last_round + min_interval, asap_since + coalesce))
    if earliest_due is not None:
        times.append(max(last_round + gap, earliest_due - gap / 2))
    return min(times) if times else None


class _Ahead:
    """The scheduled ``(due time, id)`` pairs not read yet, earliest first, with the one read
    but not taken (a phase stops at the first id that is not its own; the next phase starts
    there)."""

    def __init__(self, due: Iterable[tuple[float, str]]) -> None:
        self._due = iter(due)
        self._held: tuple[float, str] | None = None

    def take_into(self, ids: set[str], by: float, room: float) -> None:
        """Add to ``ids`` the ids due by ``by``, in order, while ``ids`` has fewer than ``room``."""
        while len(ids) < room:
            if self._held is None:
                self._held = next(self._due, None)
                if self._held is None:
                    return
            at, job_id = self._held
            if at > by:
                return
            ids.add(job_id)
            self._held = None


def _open_calls(n: int) -> int:
    """The calls ``n`` ids need."""
    return -(-n // DESCRIBE_BATCH)


def round_ids(
    asap: Iterable[str], due: Iterable[tuple[float, str]], now: float, gap: float, coalesce: float, calls: int = 1
) -> list[str]:
    """The ids a round at ``now`` describes, in three phases over ``due`` (the scheduled
    ``(due time, id)`` pairs, earliest first; read only as far as the round takes, and one
    more). Nothing is looked at more than half a ``gap`` early.

    1. *must*: every id asked for without a schedule (``asap``) and every scheduled one
       overdue (by more than ``coalesce``), whatever the calls they take;
    2. *share*: those due now (give or take ``coalesce``), up to ``calls`` calls
       (``round_calls``: the round's share), or to the end of the last call the must phase
       opened;
    3. *fill*: those due early (within half a ``gap``) while they fit the calls already open
       (at least one): a call of 100 ids costs what a call of 1 costs.

    A due id left out is overdue in the next round, a gap later: a round's scheduled looks
    fill its calls and never cost one more for a few (the looks a round makes fall due
    together a period later, so such a call would come back every period)."""
    ids = set(asap)
    ahead = _Ahead(due)
    horizon = now + gap / 2
    ahead.take_into(ids, by=min(now - coalesce, horizon), room=math.inf)
    ahead.take_into(ids, by=min(now + coalesce, horizon), room=max(calls, _open_calls(len(ids))) * DESCRIBE_BATCH)
    ahead.take_into(ids, by=horizon, room=max(1, _open_calls(len(ids))) * DESCRIBE_BATCH)
    return sorted(ids)


class RoundSchedule:
    """The ids waiting for a round and when the next round starts; not locked (the poller
    holds its lock around every use).

    Invariants (``tests/core/aws_batch/test_schedule.py``):

    - an id is scheduled at most once, at the earliest due time and the shortest period it
      was scheduled with since it was last taken;
    - ``rate`` is the sum of ``1 / period`` over the scheduled ids, derived from the count of
      ids per period (so it returns to exactly 0 and never drifts); ``gap`` and the round's
      calls follow from it (``round_gap``, ``round_calls``);
    - the heap holds a current ``(due time, id)`` entry for every scheduled id (entries of
      ids rescheduled or taken since are stale and skipped), so ``earliest_due`` is the
      earliest due time of the scheduled ids;
    - ``take`` returns each id asked for, and unschedules what it returns: a round describes
      an id once, and the id is scheduled again only when a watcher asks for its next look.
    """

    def __init__(self, min_interval: float, coalesce: float) -> None:
        self.min_interval = min_interval
        self.coalesce = coalesce
        #: When the last round that described ids started.
        self.last_round = -math.inf
        self._asap: set[str] = set()
        self._asap_since: float | None = None
        self._due: dict[str, tuple[float, float]] = {}  # id -> (due time, period)
        self._heap: list[tuple[float, str]] = []  # (due time, id); stale entries skipped
        self._periods: collections.Counter[float] = collections.Counter()

    def ask(self, job_id: str, now: float) -> None:
        """Describe ``job_id`` in the next round, which starts ``coalesce`` after the first
        id asked for (and ``min_interval`` after the last round)."""
        if not self._asap:
            self._asap_since = now
        self._asap.add(job_id)

    def schedule(self, job_id: str, due: float, period: float) -> None:
        """Look at ``job_id`` at ``due`` (or earlier, if it is due earlier already)."""
        old = self._due.get(job_id)
        if old is not None:
            if old[0] <= due and old[1] <= period:
                return
            self._unschedule(job_id)
            due, period = min(due, old[0]), min(period, old[1])
        self._due[job_id] = (due, period)
        heapq.heappush(self._heap, (due, job_id))
        self._periods[period] += 1

    def __contains__(self, job_id: object) -> bool:
        """Whether ``job_id`` waits for a scheduled look."""
        return job_id in self._due

    def __len__(self) -> int:
        """The number of ids waiting for a scheduled look."""
        return len(self._due)

    def periods(self) -> Iterator[tuple[str, float]]:
        """Each scheduled id with its period."""
        return ((job_id, period) for job_id, (_, period) in self._due.items())

    @property
    def rate(self) -> float:
        """Scheduled looks a second: the sum of ``1 / period`` over the scheduled ids."""
        return sum(n / period for period, n in self._periods.items())

    def gap(self) -> float:
        """Seconds between two scheduled rounds (``round_gap`` of the scheduled ids)."""
        return round_gap(self.rate, min(self._periods, default=math.inf), self.min_interval)

    def earliest_due(self) -> float | None:
        """The earliest due time of the scheduled ids (None: none)."""
        while self._heap:
            due, job_id = self._heap[0]
            if self._due.get(job_id, (None,))[0] == due:
                return due
            heapq.heappop(self._heap)  # rescheduled or taken since
        return None

    def next_round_at(self) -> float | None:
        """When the next round starts (``next_round_at``; None: nothing to do)."""
        asap_since = self._asap_since if self._asap else None
        return next_round_at(
            self.last_round, self.min_interval, self.gap(), self.coalesce, asap_since, self.earliest_due()
        )

    def take(self, now: float) -> list[str]:
        """The ids a round starting at ``now`` describes (``round_ids``), unscheduled; the
        round counts as the last one if it describes any."""
        gap = self.gap()
        ids = round_ids(self._asap, self._due_in_order(), now, gap, self.coalesce, round_calls(self.rate, gap))
        self._asap.clear()
        self._asap_since = None
        for job_id in ids:
            self._unschedule(job_id)
        if ids:
            self.last_round = now
        return ids

    def _unschedule(self, job_id: str) -> None:
        due = self._due.pop(job_id, None)
        if due is None:
            return
        period = due[1]
        self._periods[period] -= 1
        if not self._periods[period]:
            del self._periods[period]

    def _due_in_order(self) -> Iterator[tuple[float, str]]:
        """The scheduled ``(due time, id)`` pairs, earliest first; each leaves the heap once
        the next one is asked for (one not taken stays)."""
        while (due := self.earliest_due()) is not None:
            yield due, self._heap[0][1]
            heapq.heappop(self._heap)
