"""Economical, resilient AWS calls: retries with jittered back-off, a process-wide status poller
that batches ``DescribeJobs`` for every watched job (the log reads' shared budget is in ``logs.py``).

Many watchers (a triggerer holds up to 1000 triggers, each in its own thread or event loop)
ask "how is my job?" every few seconds. Asking AWS once per watcher would hit Batch's API
throttling quickly; instead every scheduler instance of the process that talks to the same
account/region/endpoint shares one ``StatusPoller``, whose thread describes all watched jobs
in calls of 100 ids and answers each watcher from the newest batch.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from airflow_provider_torchx.core.schedulers.api import settle

log = logging.getLogger(__name__)

R = TypeVar("R")

#: DescribeJobs accepts at most this many ids per call.
DESCRIBE_BATCH = 100
#: A job nobody asked about for this long is forgotten (seconds): memory stays bounded in a
#: long-running triggerer.
FORGET_AFTER = 3600.0

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


@dataclass
class _Waiter:
    """A request waiting for a round: its ids, when it was asked, the future to resolve."""

    ids: list[str]
    need: set[str]
    asked: float
    future: concurrent.futures.Future[Jobs]


#: The marker result of a job submitted by this process that DescribeJobs does not show yet.
NOT_VISIBLE: dict[str, Any] = {"status": "SUBMITTED", "statusReason": "submitted; not yet visible in DescribeJobs"}


class StatusPoller:
    """Describes every watched job in batches of 100 from one thread; ``get`` answers from the
    newest batch, waiting for a new round only when the cached answer is too old; ``request``
    does the same without blocking: it returns a future the poller's thread resolves, so any
    number of waiters (triggers on an event loop) hold no thread.

    - A round describes the ids asked for since the last one, so watchers out of phase share
      the round their requests fall in, and a job costs one id in one call per poll of its
      watcher. (Refreshing every recently watched job each round instead cost 20 calls a
      round at 2,000 jobs, whatever their poll interval: 17 calls/s and a busy GIL.)
    - Rounds are at least ``min_interval`` apart; a round waits ``coalesce`` seconds for more
      requests before calling AWS.
    - A job ``expect``-ed (just submitted here) that DescribeJobs does not show yet is reported
      as ``NOT_VISIBLE`` for ``visibility_grace`` seconds instead of as missing.
    - The thread exits after ``idle_exit`` seconds without requests and restarts on demand.
    """

    def __init__(
        self,
        client: Any,
        *,
        min_interval: float = 1.0,
        coalesce: float = 0.05,
        visibility_grace: float = 60.0,
        idle_exit: float = 30.0,
    ) -> None:
        self.client = client
        self.min_interval = min_interval
        self.coalesce = coalesce
        self.visibility_grace = visibility_grace
        self.idle_exit = idle_exit
        self._cond = threading.Condition()
        self._results: dict[str, tuple[float, dict[str, Any] | None]] = {}
        self._errors: dict[str, tuple[float, BaseException]] = {}
        self._accessed: dict[str, float] = {}
        self._wanted: set[str] = set()
        self._expected: dict[str, float] = {}
        self._job_ids: dict[str, str] = {}
        self._waiters: list[_Waiter] = []
        self._thread: threading.Thread | None = None
        self._last_round = 0.0
        #: DescribeJobs calls and rounds made (benchmarks and tests read them).
        self.calls = 0
        self.rounds = 0

    # ------------------------------------------------------------------ watchers' side

    def expect(self, job_id: str) -> None:
        """Note a job just submitted, so that not seeing it yet is not "no such job"."""
        with self._cond:
            self._expected[job_id] = time.monotonic() + self.visibility_grace
            self._results.pop(job_id, None)

    def remember(self, app_id: str, job_id: str) -> None:
        """Record which job id an app id (``queue:name``) has, for every scheduler instance."""
        with self._cond:
            self._job_ids[app_id] = job_id

    def job_id(self, app_id: str) -> str | None:
        """The job id recorded for ``app_id``, if any."""
        with self._cond:
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

    def request(self, job_ids: list[str], max_age: float | None = None) -> concurrent.futures.Future[Jobs]:
        """``get`` as a future, resolved (from the poller's thread) by the first round that
        answers every id; already resolved when the cache answers. Never blocks."""
        max_age = self.min_interval if max_age is None else max_age
        future: concurrent.futures.Future[Jobs] = concurrent.futures.Future()
        with self._cond:
            asked = time.monotonic()
            for job_id in job_ids:
                self._accessed[job_id] = asked
            need = {i for i in job_ids if not self._fresh(i, asked, max_age)}
            if need:
                self._wanted |= need
                self._waiters.append(_Waiter(list(job_ids), need, asked, future))
                self._ensure_thread()
                self._cond.notify_all()
                return future
            answer = {i: self._results[i][1] for i in job_ids}
        future.set_result(answer)
        return future

    def _answers(self) -> list[tuple[concurrent.futures.Future[Jobs], Jobs | BaseException]]:
        """Take the waiters the latest round answered (under the lock), with their answers."""
        ready: list[tuple[concurrent.futures.Future[Jobs], Jobs | BaseException]] = []
        pending = []
        for w in self._waiters:
            errors = [e for i in w.need if (e := self._errors.get(i)) and e[0] >= w.asked]
            if errors:
                ready.append((w.future, errors[0][1]))
            elif all(self._results.get(i, (-1.0, None))[0] >= w.asked for i in w.need):
                ready.append((w.future, {i: self._results[i][1] for i in w.ids}))
            elif not w.future.cancelled():
                pending.append(w)
        self._waiters = pending
        return ready

    def _fresh(self, job_id: str, now: float, max_age: float) -> bool:
        got = self._results.get(job_id)
        if got is None:
            return False
        stamp, job = got
        return (job is not None and _terminal(job)) or now - stamp <= max_age

    # ------------------------------------------------------------------ the thread

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="aws-batch-status-poller", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while True:
            with self._cond:
                idle_since = time.monotonic()
                while not self._wanted:
                    if time.monotonic() - idle_since > self.idle_exit:
                        self._thread = None
                        return
                    self._cond.wait(1.0)
                pause = self._last_round + self.min_interval - time.monotonic()
            time.sleep(max(self.coalesce, pause))
            try:
                self._round()
            except BaseException as err:  # a bug here must not leave waiters waiting forever
                log.exception("status poller round failed")
                with self._cond:
                    waiters, self._waiters, self._thread = self._waiters, [], None
                for w in waiters:
                    settle(w.future, functools.partial(_raise, err))
                raise

    def _round(self) -> None:
        with self._cond:
            start = time.monotonic()
            ids = sorted(self._wanted)
            self._wanted.clear()
            self._last_round = start
            self.rounds += 1
            self._prune(start)
        found: dict[str, dict[str, Any]] = {}
        failed: BaseException | None = None
        for n in range(0, len(ids), DESCRIBE_BATCH):
            chunk = ids[n : n + DESCRIBE_BATCH]
            try:
                with self._cond:
                    self.calls += 1
                resp = call_with_retry(self.client.describe_jobs, jobs=chunk)
            except Exception as err:
                failed = err
                break
            for job in resp.get("jobs", []):
                found[job["jobId"]] = job
        with self._cond:
            if failed is not None:
                for job_id in ids:
                    self._errors[job_id] = (start, failed)
            else:
                for job_id in ids:
                    job = found.get(job_id)
                    if job is None and self._expected.get(job_id, 0.0) > start:
                        job = NOT_VISIBLE
                    elif job is not None:
                        self._expected.pop(job_id, None)
                    self._results[job_id] = (start, job)
            ready = self._answers()
            self._cond.notify_all()
        for future, answer in ready:  # outside the lock: callbacks may ask again
            settle(future, functools.partial(_answer, answer))

    def _prune(self, now: float) -> None:
        """Forget jobs nobody asked about for a long time (bounded memory in long runs)."""
        stale = [i for i, at in self._accessed.items() if now - at > FORGET_AFTER]
        for job_id in stale:
            for table in (self._accessed, self._results, self._errors, self._expected):
                table.pop(job_id, None)


def _raise(err: BaseException) -> Jobs:
    raise err


def _answer(answer: Jobs | BaseException) -> Jobs:
    if isinstance(answer, BaseException):
        raise answer
    return answer


_TERMINAL = frozenset({"SUCCEEDED", "FAILED"})


def _terminal(job: dict[str, Any]) -> bool:
    return job.get("status") in _TERMINAL


_pollers: dict[tuple[str, ...], StatusPoller] = {}
_registry_lock = threading.Lock()


def client_key(client: Any) -> tuple[str, ...]:
    """Which account/region/endpoint a client talks to: clients with equal keys share."""
    meta = client.meta
    creds = getattr(getattr(client, "_request_signer", None), "_credentials", None)
    access_key = getattr(creds, "access_key", "") if creds is not None else ""
    return (str(meta.service_model.service_name), str(meta.region_name), str(meta.endpoint_url), str(access_key))


def shared_poller(client: Any) -> StatusPoller:
    """The process-wide poller for the account/region/endpoint of the Batch ``client``."""
    key = client_key(client)
    with _registry_lock:
        poller = _pollers.get(key)
        if poller is None:
            poller = _pollers[key] = StatusPoller(client)
        return poller
