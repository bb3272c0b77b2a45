"""Economical, resilient AWS calls: retries with jittered back-off, a process-wide status poller
that batches ``DescribeJobs`` for every watched job (the log reads' shared budget is in ``logs.py``).

Many watchers (a triggerer holds up to 1000 triggers, each in its own thread or event loop)
ask "how is my job?" every few seconds. Asking AWS once per watcher would hit Batch's API
throttling quickly; instead every scheduler instance of the process that talks to the same
account/region/endpoint shares one ``StatusPoller``, whose thread describes all watched jobs
in calls of 100 ids and answers each watcher from the newest batch.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import heapq
import logging
import math
import pickle
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from airflow_provider_torchx.core.schedulers.api import settle
from airflow_provider_torchx.core.schedulers.aws_batch.sweep import ChangeSweep, Group

log = logging.getLogger(__name__)

R = TypeVar("R")

#: DescribeJobs accepts at most this many ids per call.
DESCRIBE_BATCH = 100
#: A job nobody asked about for this long is forgotten (seconds): memory stays bounded in a
#: long-running triggerer.
FORGET_AFTER = 3600.0
#: A shared poller nobody asked anything for this long, with no round to come, is dropped from
#: the registry (seconds): the pollers of credentials that changed (a connection edited, keys
#: rotated) do not pile up in a long-running triggerer.
POLLER_IDLE_FORGET = 600.0

_THROTTLE_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "RequestThrottled",
        "SlowDown",
        "ProvisionedThroughputExceededException",
        "ServiceUnavailable",
        "ServiceUnavailableException",
        "InternalFailure",
        "InternalError",
        "InternalServerError",
        "ServerException",
    }
)


def is_retryable(err: BaseException) -> bool:
    """Throttling, 5xx and connection errors: worth retrying; anything else is the caller's."""
    import botocore.exceptions as bce

    if isinstance(err, bce.ClientError):
        code = str(err.response.get("Error", {}).get("Code", ""))
        status = int(err.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        return code in _THROTTLE_CODES or status == 429 or status >= 500
    return isinstance(err, bce.ConnectionError | bce.HTTPClientError)


def backoff_delays(base: float = 0.2, cap: float = 10.0) -> Iterable[float]:
    """Delays for successive retries: "full jitter" exponential back-off.

    Each delay is drawn uniformly from ``[0, min(cap, base * 2**n)]``. The randomness matters:
    when throttling hits many watchers at once, fixed delays would make them all retry in the
    same instant and be throttled again together; jitter spreads them out.
    """
    n = 0
    while True:
        yield random.uniform(0, min(cap, base * 2**n))
        n += 1


def call_with_retry(
    fn: Callable[..., R],
    *args: Any,
    attempts: int = 8,
    sleep: Callable[[float], None] = time.sleep,
    **kwargs: Any,
) -> R:
    """``fn(*args, **kwargs)``, retrying throttling/5xx/connection errors with jittered back-off."""
    delays = iter(backoff_delays())
    for attempt in range(1, attempts + 1):
        try:
            return fn(*args, **kwargs)
        except Exception as err:
            if attempt == attempts or not is_retryable(err):
                raise
            delay = next(delays)
            log.debug(
                "retrying %s after %s (attempt %d, sleeping %.2fs)", getattr(fn, "__name__", fn), err, attempt, delay
            )
            sleep(delay)
    raise AssertionError("unreachable")


Jobs = dict[str, dict[str, Any] | None]


class Cancellable(Protocol):
    """A waiter's future, concurrent or asyncio: the poller only asks whether it was cancelled."""

    def cancelled(self) -> bool: ...


@dataclass(slots=True)
class Waiter:
    """A request waiting for rounds: its ids, those no round answered yet, the number of the
    last round started before it was made (only later rounds answer it), the caller's future
    (dropped once cancelled) and what to call with the answer (``StatusPoller.request_then``).
    Slotted, its ids a tuple: a scheduled look's waiter lives a whole poll."""

    ids: tuple[str, ...]
    need: set[str]
    after_round: int
    future: Cancellable
    then: Callable[[Jobs | BaseException], None]


#: The marker result of a job submitted by this process that DescribeJobs does not show yet.
NOT_VISIBLE: dict[str, Any] = {"status": "SUBMITTED", "statusReason": "submitted; not yet visible in DescribeJobs"}

#: A cached answer for one id: when the round that gave it started, the job's status and job
#: queue (what the change sweep groups by) and the job, pickled (None: no such job; empty:
#: ``NOT_VISIBLE``). A plain tuple of atoms, which the garbage collector stops tracking: the
#: cache holds every watched job for a poll, and DescribeJobs entries kept as dicts (dozens of
#: containers each) would reach the collector's oldest generation and bring on the full
#: collections that hold a triggerer's loop. Each answer unpickles a copy of its own.
Entry = tuple[float, str | None, str | None, bytes | None]


def cached(at: float, job: dict[str, Any] | None) -> Entry:
    """The cache's ``Entry`` for ``job`` (a DescribeJobs entry, None or ``NOT_VISIBLE``)
    described by a round started at ``at``."""
    if job is None:
        return (at, None, None, None)
    if job is NOT_VISIBLE:
        return (at, NOT_VISIBLE["status"], None, b"")
    queue = job.get("jobQueue")
    return (at, str(job.get("status", "")), None if queue is None else str(queue), pickle.dumps(job, 5))


def job_of(entry: Entry) -> dict[str, Any] | None:
    """The job an ``Entry`` holds (a copy of its own), None or ``NOT_VISIBLE``."""
    data = entry[3]
    if data is None:
        return None
    return pickle.loads(data) if data else NOT_VISIBLE


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


def round_ids(
    asap: Iterable[str], due: Iterable[tuple[float, str]], now: float, gap: float, coalesce: float, calls: int = 1
) -> list[str]:
    """The ids a round at ``now`` describes: every one asked for without a schedule
    (``asap``) and every scheduled one overdue (by more than ``coalesce``); those due by now
    (give or take ``coalesce``) in up to ``calls`` calls (``round_calls``: the round's share); and
    those due within half a ``gap`` as long as they fit in the calls the others need (a call
    of 100 ids costs what a call of 1 costs, and a round of 101 ids costs two). A due id left
    out is overdue in the next round, a gap later: a round's scheduled looks fill its calls
    and never cost one more for a few (the looks a round makes fall due together a period
    later, so such a call would come back every period). ``due``: the scheduled
    ``(due time, id)`` pairs, earliest first; read only as far as the round takes (and one
    more)."""
    ids = set(asap)
    overdue, horizon = now - coalesce, now + gap / 2
    for at, job_id in due:
        full = bool(ids) and len(ids) % DESCRIBE_BATCH == 0
        if at > horizon or (full and at > overdue and (at > now + coalesce or len(ids) >= calls * DESCRIBE_BATCH)):
            break  # not due yet, or it would open a call: early, or past the round's share
        ids.add(job_id)
    return sorted(ids)


Answer = tuple[Waiter, Jobs | BaseException]


def answer_waiters(
    waiters: Iterable[Waiter],
    round_no: int,
    ids: set[str],
    results: Mapping[str, Entry],
    failed: BaseException | None,
) -> tuple[list[Answer], list[Waiter]]:
    """Which ``waiters`` round ``round_no`` (which described ``ids``; ``results``: the newest
    answer per id, ``cached``) answers, with their answers, and those still waiting: a waiter
    made before the round whose last needed ids it described, or, if the round ``failed``, any
    waiter made before it that needed one of its ids. Cancelled waiters are dropped."""
    ready: list[Answer] = []
    pending: list[Waiter] = []
    for w in waiters:
        if w.future.cancelled():
            continue
        hit = w.need & ids if w.after_round < round_no else set()
        if hit and failed is not None:
            ready.append((w, failed))
        elif w.need - hit:
            pending.append(dataclasses.replace(w, need=w.need - hit) if hit else w)
        else:
            ready.append((w, {i: job_of(results[i]) for i in w.ids}))
    return ready, pending


class StatusPoller:
    """Describes every watched job in batches of 100 from one thread; ``get`` answers from the
    newest batch, waiting for a new round only when the cached answer is too old; ``request``
    does the same without blocking: it returns a future the poller's thread resolves, so any
    number of waiters (triggers on an event loop) hold no thread.

    - A round describes the ids asked for since the last one, so watchers out of phase share
      the round their requests fall in, and a job costs one id in one call per look.
    - Two kinds of requests: with ``max_age`` (the default), a recent answer: from the cache,
      else from the next round (rounds at least ``min_interval`` apart, waiting ``coalesce``
      seconds for more requests); with ``period``, the job's next scheduled look, one period
      after its previous one. Scheduled looks are grouped into rounds ``round_gap`` apart, so
      the poller, not each watcher's own sleep, sets the rhythm: a job is looked at every
      period whatever its watcher's latency, and 1,000 jobs at a 10 s period cost one full
      call a second. Any round that describes a job answers every waiter of that job, so a
      waiter learns of the end from the first round that sees it.
    - A change sweep (``sweep.py``: ``ListJobs`` by queue and status, from a thread of its
      own) tells which scheduled jobs changed status since they were described; those are
      described in the next round (``look_soon``), so an end is seen within a fraction of the
      period at a fraction of the calls looking that often would cost.
    - A job ``expect``-ed (just submitted here) that DescribeJobs does not show yet is reported
      as ``NOT_VISIBLE`` for ``visibility_grace`` seconds instead of as missing.
    - The thread exits after ``idle_exit`` seconds without requests and restarts on demand.
      ``clock`` (monotonic seconds) and ``sleep`` (the retries' back-off) are injectable
      for tests that drive rounds by hand; which ids a round takes and which waiters it
      answers are pure functions (``round_ids``, ``answer_waiters``).
    """

    def __init__(
        self,
        client: Any,
        *,
        min_interval: float = 1.0,
        coalesce: float = 0.05,
        visibility_grace: float = 60.0,
        idle_exit: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.client = client
        #: Set once ``shared_poller``'s registry dropped this poller (idle): holders ask it again.
        self.forgotten = False
        self.min_interval = min_interval
        self.coalesce = coalesce
        self.visibility_grace = visibility_grace
        self.idle_exit = idle_exit
        self.clock = clock
        self.sleep = sleep
        self._cond = threading.Condition()
        self._results: dict[str, Entry] = {}
        self._accessed: dict[str, float] = {}
        self._asap: set[str] = set()
        self._asap_since: float | None = None
        self._due: dict[str, tuple[float, float]] = {}  # id -> (due time, period)
        self._heap: list[tuple[float, str]] = []  # (due time, id); stale entries skipped
        self._periods: collections.Counter[float] = collections.Counter()
        self._rate = 0.0  # scheduled looks a second: sum of 1 / period over ``_due``
        self._expected: dict[str, float] = {}
        self._job_ids: dict[str, str] = {}
        self._waiters: list[Waiter] = []
        self._thread: threading.Thread | None = None
        self._last_round = -math.inf
        self._last_request = clock()
        #: DescribeJobs calls and rounds made (benchmarks and tests read them).
        self.calls = 0
        self.rounds = 0
        self.sweep = ChangeSweep(
            client, self._sweep_groups, self.look_soon, call=call_with_retry, idle_exit=idle_exit, clock=clock
        )

    # ------------------------------------------------------------------ watchers' side

    def expect(self, job_id: str) -> None:
        """Note a job just submitted, so that not seeing it yet is not "no such job"."""
        with self._cond:
            self._expected[job_id] = self.clock() + self.visibility_grace
            self._results.pop(job_id, None)

    def remember(self, app_id: str, job_id: str) -> None:
        """Record which job id an app id (``queue:name``) has, for every scheduler instance."""
        with self._cond:
            self._job_ids[app_id] = job_id

    def job_id(self, app_id: str) -> str | None:
        """The job id recorded for ``app_id``, if any. Read without the lock (one dict read;
        writes hold it): a watcher asks on every look, and waiting while the poller's thread
        answers a round's waiters under the lock held the loop."""
        return self._job_ids.get(app_id)

    def invalidate(self, job_id: str) -> None:
        """Drop the cached answer (after a cancel, say) so the next ``get`` asks AWS."""
        with self._cond:
            self._results.pop(job_id, None)

    def get(self, job_ids: list[str], max_age: float | None = None) -> Jobs:
        """The newest DescribeJobs entry of each id (None: no such job), at most ``max_age``
        seconds old (default ``min_interval``); terminal jobs are answered from cache. Blocks
        until a round answers; raises what that round's DescribeJobs raised."""
        return self.request(job_ids, max_age).result()

    def request(
        self, job_ids: list[str], max_age: float | None = None, period: float | None = None
    ) -> concurrent.futures.Future[Jobs]:
        """``get`` as a future, resolved (from the poller's thread) once rounds answered every
        id; already resolved when the cache answers. With ``period``: each id's next scheduled
        look instead (see the class docstring), or the first earlier round describing it; a
        terminal entry answers at once. Never blocks."""
        future: concurrent.futures.Future[Jobs] = concurrent.futures.Future()
        self.request_then(future, functools.partial(_settle_answer, future), job_ids, max_age, period)
        return future

    def request_then(
        self,
        future: Cancellable,
        then: Callable[[Jobs | BaseException], None],
        job_ids: list[str],
        max_age: float | None = None,
        period: float | None = None,
    ) -> None:
        """``request`` without a future of its own: ``then`` gets the answer (or what the
        round raised), from the poller's thread or, when the cache answers, at once; it
        resolves ``future`` (the caller's, concurrent or asyncio, dropped from the waiters
        once cancelled). One future per look for a caller that maps the answer
        (``describe_future_as``, ``describe_on_loop_as``); ``then`` must not raise."""
        max_age = self.min_interval if max_age is None else max_age
        with self._cond:
            now = self._last_request = self.clock()
            wake = self._next_round_at()
            need = set()
            for job_id in job_ids:
                self._accessed[job_id] = now
                got = self._results.get(job_id)
                if got is not None and got[1] in _TERMINAL:
                    continue
                if period is not None and got is not None:
                    self._schedule(job_id, got[0] + period, period)
                elif got is None or now - got[0] > max_age:
                    if not self._asap:
                        self._asap_since = now
                    self._asap.add(job_id)
                else:
                    continue
                need.add(job_id)
            if need:
                self._waiters.append(Waiter(tuple(job_ids), need, self.rounds, future, then))
                self._ensure_thread()
                if wake is None or (self._next_round_at() or wake) < wake:
                    self._cond.notify_all()  # the next round is sooner now
                return
            answer = {i: job_of(self._results[i]) for i in job_ids}
        then(answer)

    def look_soon(self, group: Group, job_ids: list[str]) -> None:
        """Describe ``job_ids`` in the next round (the change sweep found them gone from
        ``group``): those still waiting for a scheduled look and last described in ``group``."""
        with self._cond:
            now = self.clock()
            wake = self._next_round_at()
            for job_id in job_ids:
                got = self._results.get(job_id)
                if job_id in self._due and got is not None and (got[2], got[1]) == group:
                    if not self._asap:
                        self._asap_since = now
                    self._asap.add(job_id)
            if self._asap and (wake is None or (self._next_round_at() or wake) < wake):
                self._cond.notify_all()

    def _sweep_groups(self) -> dict[Group, tuple[frozenset[str], float]]:
        """The jobs waiting for a scheduled look by (queue, status) of their last description,
        with each group's shortest period (what the change sweep lists)."""
        groups: dict[Group, tuple[set[str], float]] = {}
        with self._cond:
            for job_id, (_, period) in self._due.items():
                got = self._results.get(job_id)
                if got is None or not got[2] or got[1] is None:
                    continue  # no such job, or not visible yet
                key = (got[2], got[1])
                ids, shortest = groups.get(key, (set(), period))
                ids.add(job_id)
                groups[key] = (ids, min(shortest, period))
        return {group: (frozenset(ids), period) for group, (ids, period) in groups.items()}

    def _schedule(self, job_id: str, due: float, period: float) -> None:
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
        self._rate += 1.0 / period

    def _unschedule(self, job_id: str) -> None:
        due = self._due.pop(job_id, None)
        if due is None:
            return
        period = due[1]
        self._periods[period] -= 1
        if not self._periods[period]:
            del self._periods[period]
        self._rate = max(0.0, self._rate - 1.0 / period) if self._due else 0.0

    def _earliest_due(self) -> float | None:
        while self._heap:
            due, job_id = self._heap[0]
            if self._due.get(job_id, (None,))[0] == due:
                return due
            heapq.heappop(self._heap)  # rescheduled or looked at since
        return None

    def gap(self) -> float:
        """Seconds between two scheduled rounds now (``round_gap`` of the scheduled ids)."""
        with self._cond:
            return self._gap()

    def _gap(self) -> float:
        return round_gap(self._rate, min(self._periods, default=math.inf), self.min_interval)

    def _next_round_at(self) -> float | None:
        asap_since = self._asap_since if self._asap else None
        return next_round_at(
            self._last_round, self.min_interval, self._gap(), self.coalesce, asap_since, self._earliest_due()
        )

    def _take(self, now: float) -> list[str]:
        """The ids this round describes (``round_ids``), unscheduled."""
        gap = self._gap()
        ids = round_ids(self._asap, self._due_in_order(), now, gap, self.coalesce, round_calls(self._rate, gap))
        self._asap.clear()
        self._asap_since = None
        for job_id in ids:
            self._unschedule(job_id)
        return ids

    def _due_in_order(self) -> Iterator[tuple[float, str]]:
        """The scheduled ``(due time, id)`` pairs, earliest first; each leaves the heap once
        the next one is asked for (one not taken stays)."""
        while (due := self._earliest_due()) is not None:
            yield due, self._heap[0][1]
            heapq.heappop(self._heap)

    # ------------------------------------------------------------------ the thread

    def idle_for(self) -> float:
        """Seconds since the last request when no round is to come (no thread, no waiter, no
        scheduled look), else 0."""
        with self._cond:
            if self._thread is not None or self._waiters or self._due:
                return 0.0
            return max(0.0, self.clock() - self._last_request)

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="aws-batch-status-poller", daemon=True)
            self._thread.start()
        if self._due:
            self.sweep.wake()

    def _loop(self) -> None:
        while True:
            with self._cond:
                idle_since = self.clock()
                while True:
                    now = self.clock()
                    wake = self._next_round_at()
                    if wake is not None and wake <= now:
                        break
                    if wake is None and now - idle_since > self.idle_exit:
                        self._thread = None
                        return
                    self._cond.wait(1.0 if wake is None else min(1.0, wake - now))
            try:
                self._round()
            except BaseException as err:  # a bug here must not leave waiters waiting forever
                log.exception("status poller round failed")
                with self._cond:
                    waiters, self._waiters, self._thread = self._waiters, [], None
                for w in waiters:
                    w.then(err)
                raise

    def _round(self) -> None:
        """One round: describe the ids taken (``_take``), 100 a call, and answer the waiters
        each call completes as soon as it returns (the waiters' loop then takes its answers a
        call's worth at a time, not a whole round's: 500 at 5,000 jobs held it 100 ms)."""
        with self._cond:
            start = self.clock()
            ids = self._take(start)
            if not ids:
                return
            self._last_round = start
            self.rounds += 1
            round_no = self.rounds
            self._prune(start)
        for n in range(0, len(ids), DESCRIBE_BATCH):
            chunk = ids[n : n + DESCRIBE_BATCH]
            try:
                with self._cond:
                    self.calls += 1
                resp = call_with_retry(self.client.describe_jobs, jobs=chunk, sleep=self.sleep)
            except Exception as err:
                self._answer_round(round_no, start, ids[n:], {}, err)  # every id left: the error
                return
            self._answer_round(round_no, start, chunk, {job["jobId"]: job for job in resp.get("jobs", [])}, None)

    def _answer_round(
        self,
        round_no: int,
        start: float,
        ids: list[str],
        found: dict[str, dict[str, Any]],
        failed: BaseException | None,
    ) -> None:
        """Record what round ``round_no`` (started at ``start``) found of ``ids`` and answer
        the waiters it completes (or, if it ``failed``, those that needed one of them)."""
        with self._cond:
            if failed is None:
                for job_id in ids:
                    job = found.get(job_id)
                    if job is None and self._expected.get(job_id, 0.0) > start:
                        job = NOT_VISIBLE
                    elif job is not None:
                        self._expected.pop(job_id, None)
                    self._results[job_id] = cached(start, job)
            ready, self._waiters = answer_waiters(self._waiters, round_no, set(ids), self._results, failed)
            self._cond.notify_all()
        for w, answer in ready:  # outside the lock: callbacks may ask again
            if not w.future.cancelled():
                w.then(answer)

    def _prune(self, now: float) -> None:
        """Forget jobs nobody asked about for a long time (bounded memory in long runs)."""
        stale = [i for i, at in self._accessed.items() if now - at > FORGET_AFTER]
        for job_id in stale:
            for table in (self._accessed, self._results, self._expected):
                table.pop(job_id, None)


def answer_jobs(answer: Jobs | BaseException) -> Jobs:
    """The jobs of a ``request_then`` answer; raises what the round raised."""
    if isinstance(answer, BaseException):
        raise answer
    return answer


def _settle_answer(future: concurrent.futures.Future[Jobs], answer: Jobs | BaseException) -> None:
    settle(future, functools.partial(answer_jobs, answer))


_TERMINAL = frozenset({"SUCCEEDED", "FAILED"})


_pollers: dict[tuple[str, ...], StatusPoller] = {}
_registry_lock = threading.Lock()


def client_key(client: Any, credentials: str | None = None) -> tuple[str, ...]:
    """Which account/region/endpoint a client talks to, with which credentials: clients with
    equal keys share. ``credentials`` names the credentials the client signs with, as its
    maker knows them (``AWSBatchScheduler.credentials_key``: the connection's fingerprint, or
    boto3's default chain), so that refreshing credentials keep their key; None: this client
    alone."""
    meta = client.meta
    who = credentials if credentials is not None else f"client:{id(client)}"
    return (str(meta.service_model.service_name), str(meta.region_name), str(meta.endpoint_url), who)


def shared_poller(client: Any, credentials: str | None = None) -> StatusPoller:
    """The process-wide poller for the account/region/endpoint and credentials of the Batch
    ``client`` (``client_key``); pollers idle for ``POLLER_IDLE_FORGET`` are dropped."""
    key = client_key(client, credentials)
    with _registry_lock:
        poller = _pollers.get(key)
        if poller is None:
            for old in [k for k, p in _pollers.items() if p.idle_for() > POLLER_IDLE_FORGET]:
                _pollers.pop(old).forgotten = True
            poller = _pollers[key] = StatusPoller(client)
        return poller
