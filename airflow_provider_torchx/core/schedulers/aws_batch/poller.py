"""Economical status reads: a process-wide status poller that batches ``DescribeJobs`` for every
watched job (the log reads' shared budget is in ``logs.py``; retries are the Batch client's,
``clients.client_config``).

Many watchers (a triggerer holds up to 1000 triggers, each in its own thread or event loop)
ask "how is my job?" every few seconds. Asking AWS once per watcher would hit Batch's API
throttling quickly; instead every scheduler instance of the process that talks to the same
account/region/endpoint shares one ``StatusPoller``, whose thread describes all watched jobs
in calls of 100 ids and answers each watcher from the newest batch.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import logging
import pickle
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from airflow_provider_torchx.core.clock import SYSTEM_CLOCK, Clock
from airflow_provider_torchx.core.schedulers.api import settle
from airflow_provider_torchx.core.schedulers.aws_batch.schedule import DESCRIBE_BATCH, RoundSchedule
from airflow_provider_torchx.core.schedulers.aws_batch.status import ENDED
from airflow_provider_torchx.core.schedulers.aws_batch.sweep import ChangeSweep, Group

log = logging.getLogger(__name__)

#: A job nobody asked about for this long is forgotten (seconds): memory stays bounded in a
#: long-running triggerer.
FORGET_AFTER = 3600.0
#: A shared poller nobody asked anything for this long, with no round to come, is dropped from
#: the registry (seconds): the pollers of credentials that changed (a connection edited, keys
#: rotated) do not pile up in a long-running triggerer.
POLLER_IDLE_FORGET = 600.0

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
      after its previous one. Scheduled looks are grouped into rounds a gap apart
      (``schedule.py``: ``RoundSchedule`` decides when a round starts and which ids it
      takes), so the poller, not each watcher's own sleep, sets the rhythm: a job is looked
      at every period whatever its watcher's latency, and a round fills its calls. Any
      round that describes a job answers every waiter of that job, so a waiter learns of
      the end from the first round that sees it.
    - A change sweep (``sweep.py``: ``ListJobs`` by queue and status, from a thread of its
      own) tells which scheduled jobs changed status since they were described; those are
      described in the next round (``look_soon``), so an end is seen within a fraction of the
      period at a fraction of the calls looking that often would cost.
    - A job ``expect``-ed (just submitted here) that DescribeJobs does not show yet is reported
      as ``NOT_VISIBLE`` for ``visibility_grace`` seconds instead of as missing.
    - The thread exits after ``idle_exit`` seconds without requests and restarts on demand.
      ``clock`` is injectable for tests that drive rounds by hand; which waiters a round
      answers is a pure function (``answer_waiters``).
    - A round's ``DescribeJobs`` calls are retried by the client (``clients.client_config``);
      one that still fails answers the waiters of its ids with the error.
    """

    def __init__(
        self,
        client: Any,
        *,
        min_interval: float = 1.0,
        coalesce: float = 0.05,
        visibility_grace: float = 60.0,
        idle_exit: float = 30.0,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.client = client
        #: Set once ``shared_poller``'s registry dropped this poller (idle): holders ask it again.
        self.forgotten = False
        self.visibility_grace = visibility_grace
        self.idle_exit = idle_exit
        self.clock = clock
        self._cond = threading.Condition()
        self._results: dict[str, Entry] = {}
        self._accessed: dict[str, float] = {}
        #: The ids waiting for a round and when it starts (under the lock).
        self.schedule = RoundSchedule(min_interval, coalesce)
        self._expected: dict[str, float] = {}
        self._job_ids: dict[str, str] = {}
        self._waiters: list[Waiter] = []
        self._thread: threading.Thread | None = None
        self._last_request = clock.monotonic()
        #: DescribeJobs calls and rounds made (benchmarks and tests read them).
        self.calls = 0
        self.rounds = 0
        self.sweep = ChangeSweep(client, self._sweep_groups, self.look_soon, idle_exit=idle_exit, clock=clock)

    # ------------------------------------------------------------------ watchers' side

    def expect(self, job_id: str) -> None:
        """Note a job just submitted, so that not seeing it yet is not "no such job"."""
        with self._cond:
            now = self._accessed[job_id] = self.clock.monotonic()
            self._expected[job_id] = now + self.visibility_grace
            self._results.pop(job_id, None)

    def remember(self, app_id: str, job_id: str) -> None:
        """Record which job id an app id (``queue:name``) has, for every scheduler instance;
        forgotten with the job (``FORGET_AFTER``)."""
        with self._cond:
            self._job_ids[app_id] = job_id
            self._accessed[job_id] = self.clock.monotonic()

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
            now = self._last_request = self.clock.monotonic()
            wake = self._next_round_at()
            need = set()
            for job_id in job_ids:
                self._accessed[job_id] = now
                got = self._results.get(job_id)
                if got is not None and got[1] in ENDED:
                    continue
                if period is not None and got is not None:
                    self.schedule.schedule(job_id, got[0] + period, period)
                elif got is None or now - got[0] > max_age:
                    self.schedule.ask(job_id, now)
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
            now = self.clock.monotonic()
            wake = self._next_round_at()
            asked = False
            for job_id in job_ids:
                got = self._results.get(job_id)
                if job_id in self.schedule and got is not None and (got[2], got[1]) == group:
                    self.schedule.ask(job_id, now)
                    asked = True
            if asked and (wake is None or (self._next_round_at() or wake) < wake):
                self._cond.notify_all()

    def _sweep_groups(self) -> dict[Group, tuple[frozenset[str], float]]:
        """The jobs waiting for a scheduled look by (queue, status) of their last description,
        with each group's shortest period (what the change sweep lists)."""
        groups: dict[Group, tuple[set[str], float]] = {}
        with self._cond:
            for job_id, period in self.schedule.periods():
                got = self._results.get(job_id)
                if got is None or not got[2] or got[1] is None:
                    continue  # no such job, or not visible yet
                key = (got[2], got[1])
                ids, shortest = groups.get(key, (set(), period))
                ids.add(job_id)
                groups[key] = (ids, min(shortest, period))
        return {group: (frozenset(ids), period) for group, (ids, period) in groups.items()}

    @property
    def min_interval(self) -> float:
        """Seconds between two rounds at least (the schedule's; tests shorten it)."""
        return self.schedule.min_interval

    @min_interval.setter
    def min_interval(self, seconds: float) -> None:
        self.schedule.min_interval = seconds

    @property
    def coalesce(self) -> float:
        """Seconds a round waits for more requests after the first (the schedule's)."""
        return self.schedule.coalesce

    def gap(self) -> float:
        """Seconds between two scheduled rounds now (``round_gap`` of the scheduled ids)."""
        with self._cond:
            return self.schedule.gap()

    def _next_round_at(self) -> float | None:
        return self.schedule.next_round_at()

    # ------------------------------------------------------------------ the thread

    def idle_for(self) -> float:
        """Seconds since the last request when no round is to come (no thread, no waiter, no
        scheduled look), else 0."""
        with self._cond:
            if self._thread is not None or self._waiters or self.schedule:
                return 0.0
            return max(0.0, self.clock.monotonic() - self._last_request)

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="aws-batch-status-poller", daemon=True)
            self._thread.start()
        if self.schedule:
            self.sweep.wake()

    def _loop(self) -> None:
        while True:
            with self._cond:
                idle_since = self.clock.monotonic()
                while True:
                    now = self.clock.monotonic()
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
        """One round: describe the ids the schedule gives (``RoundSchedule.take``), 100 a
        call, and answer the waiters each call completes as soon as it returns (the waiters'
        loop then takes its answers a call's worth at a time, not a whole round's)."""
        with self._cond:
            start = self.clock.monotonic()
            ids = self.schedule.take(start)
            if not ids:
                return
            self.rounds += 1
            round_no = self.rounds
            self._prune(start)
        for n in range(0, len(ids), DESCRIBE_BATCH):
            chunk = ids[n : n + DESCRIBE_BATCH]
            try:
                with self._cond:
                    self.calls += 1
                resp = self.client.describe_jobs(jobs=chunk)
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
        """Forget jobs nobody asked about for ``FORGET_AFTER``, with the app ids that name
        them: a long-running triggerer's memory stays bounded by the jobs it watches."""
        stale = {i for i, at in self._accessed.items() if now - at > FORGET_AFTER}
        if not stale:
            return
        for job_id in stale:
            for table in (self._accessed, self._results, self._expected):
                table.pop(job_id, None)
        # a new dict, swapped in whole: ``job_id`` reads the table without the lock
        self._job_ids = {app_id: job_id for app_id, job_id in self._job_ids.items() if job_id not in stale}


def answer_jobs(answer: Jobs | BaseException) -> Jobs:
    """The jobs of a ``request_then`` answer; raises what the round raised."""
    if isinstance(answer, BaseException):
        raise answer
    return answer


def _settle_answer(future: concurrent.futures.Future[Jobs], answer: Jobs | BaseException) -> None:
    settle(future, functools.partial(answer_jobs, answer))


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
    ``client`` (``client_key``); making a new one drops those idle for ``POLLER_IDLE_FORGET``."""
    key = client_key(client, credentials)
    with _registry_lock:
        poller = _pollers.get(key)
        if poller is None:
            for old in [k for k, p in _pollers.items() if p.idle_for() > POLLER_IDLE_FORGET]:
                _pollers.pop(old).forgotten = True
            poller = _pollers[key] = StatusPoller(client)
        return poller
