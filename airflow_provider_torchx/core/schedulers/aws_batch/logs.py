"""Reading a node's CloudWatch Logs streams through a resumable cursor (docs/architecture.md,
"Cursors"), under one fair ``GetLogEvents`` budget per process.

A node has one stream per attempt, read in attempt order. The cursor records the stream
being read, the CloudWatch forward token of the page being read and how many events of that
page were already returned, so a reader restarted from a saved cursor re-requests the same
page and skips what it has seen: every event once, in order.

Every read of every log in the process draws its calls from a ``LogBudget``: a rate within
the account's quota, shared round-robin by the logs being read, so that with thousands of
jobs watched each log still advances (it may lag; the read says by how much). A call's retries
(botocore's, ``clients.client_config``) take from the same budget (``count_attempts``).
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_provider_torchx.core.clock import SYSTEM_CLOCK, Clock
from airflow_provider_torchx.core.errors import shown
from airflow_provider_torchx.core.schedulers.api import cursor_object
from airflow_provider_torchx.core.schedulers.aws_batch.poller import client_key
from airflow_provider_torchx.core.schedulers.aws_batch.render import LOG_GROUP

log = logging.getLogger(__name__)

#: Events per GetLogEvents page (the API's maximum).
PAGE = 10000

#: ``GetLogEvents`` calls per second a process makes per account and region unless
#: ``AIRFLOW_TORCHX_CLOUDWATCH_RPS`` says otherwise. CloudWatch Logs allows 10 per account and
#: region by default, shared with every other reader (the console, other tools): take half.
DEFAULT_RPS = 5.0
RPS_ENV = "AIRFLOW_TORCHX_CLOUDWATCH_RPS"


def budget_rate(environ: Mapping[str, str] = os.environ) -> float:
    """The ``GetLogEvents`` rate budget from ``AIRFLOW_TORCHX_CLOUDWATCH_RPS`` (default 5)."""
    text = environ.get(RPS_ENV, "").strip()
    if not text:
        return DEFAULT_RPS
    try:
        rate = float(text)
    except ValueError:
        rate = 0.0
    if not 0 < rate <= 1000:
        raise ValueError(f"{RPS_ENV}: {text!r} is not a rate; give calls per second, a number in (0, 1000]")
    return rate


class LogBudget:
    """``GetLogEvents`` calls shared fairly, in rounds, by every log reader of a process.

    1. At most ``rate`` calls a second on average (bursts up to ``burst``), whoever asks.
    2. Round-robin by reader ``key`` (one replica's log): in each round every reader that
       asked within ``active_for`` seconds gets one call before any gets a second, so with
       thousands of logs every one still advances, each by one page a round. A reader that
       already had its turn gets another only from tokens left over once each reader still
       waiting for its turn could have one (a lone reader reads at the full rate).
    3. ``try_acquire`` never waits (a refused reader keeps its place in the round and reads
       on at its next poll: its log lags, nothing is lost); ``acquire`` waits for the turn.
    4. A retry of a granted call is ``charge``-d: it takes a call from the rate, owed when none
       is left, so the rate holds over every attempt.
    5. Memory is bounded by the readers active within ``active_for``.

    ``clock`` (its monotonic time and sleep) is injectable: tests drive time by hand.
    """

    def __init__(
        self,
        rate: float,
        burst: int | None = None,
        *,
        active_for: float = 120.0,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.rate = rate
        self.burst = burst if burst is not None else max(1, int(rate))
        self.active_for = active_for
        self.clock = clock
        self._tokens = float(self.burst)
        self._stamp = clock.monotonic()
        self._asked: dict[Hashable, float] = {}
        self._granted: dict[Hashable, float] = {}
        self._served: set[Hashable] = set()
        self._pruned = self._stamp
        self._lock = threading.Lock()
        #: Calls granted and retries charged (benchmarks and tests read it).
        self.calls = 0

    def _refill(self) -> float:
        """Add the calls the rate allowed since the last look (up to ``burst``); the time now."""
        now = self.clock.monotonic()
        self._tokens = min(float(self.burst), self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now
        return now

    def try_acquire(self, key: Hashable) -> bool:
        """Take a call for reader ``key`` if the rate and its turn allow; never waits."""
        with self._lock:
            now = self._refill()
            if key not in self._asked:
                self._granted[key] = now
            self._asked[key] = now
            if now - self._pruned > self.active_for / 4:
                self._prune(now)
            waiting = len(self._asked) - len(self._served)
            if self._tokens < 1 or (key in self._served and self._tokens < waiting + 1):
                return False
            self._tokens -= 1
            self.calls += 1
            self._granted[key] = now
            self._served.add(key)
            if len(self._served) >= len(self._asked):
                self._served.clear()  # every active reader had its turn: a new round
            return True

    def acquire(self, key: Hashable) -> None:
        """Wait for a call for reader ``key`` (its turn in the round and the rate)."""
        while not self.try_acquire(key):
            self.clock.sleep(random.uniform(0.5, 1.0) / self.rate)

    def charge(self) -> None:
        """Take a call for an attempt no turn granted (a retry): owed when none is left, so the
        next grants wait until the rate has paid it back. Never waits (botocore's back-off
        already spaces retries)."""
        with self._lock:
            self._refill()
            self._tokens -= 1
            self.calls += 1

    def waited(self, key: Hashable) -> float:
        """Seconds since reader ``key`` last had a call (or first asked)."""
        with self._lock:
            return self.clock.monotonic() - self._granted.get(key, self.clock.monotonic())

    def _prune(self, now: float) -> None:
        """Forget readers that stopped asking (their jobs ended or moved elsewhere)."""
        self._pruned = now
        for key in [k for k, at in self._asked.items() if now - at > self.active_for]:
            del self._asked[key]
            self._granted.pop(key, None)
            self._served.discard(key)
        if self._served and len(self._served) >= len(self._asked):
            self._served.clear()


def count_attempts(client: Any, budget: Callable[[], LogBudget]) -> None:
    """Charge every retry of the CloudWatch Logs ``client``'s calls to ``budget()``: the
    first attempt of a call is its reader's grant (``acquire``), each further one is
    ``charge``-d. ``request-created`` fires once per attempt, its context numbering them.
    Registered once per client."""

    def charge_retry(request: Any, **_: Any) -> None:
        if request.context.get("retries", {}).get("attempt", 1) > 1:
            budget().charge()

    client.meta.events.register("request-created.cloudwatch-logs", charge_retry, unique_id="airflow-torchx-log-budget")


_budgets: dict[tuple[str, ...], LogBudget] = {}
_budgets_lock = threading.Lock()


def shared_log_budget(client: Any, credentials: str | None = None) -> LogBudget:
    """The process-wide ``GetLogEvents`` budget for the account/region/endpoint and
    credentials of the CloudWatch Logs ``client`` (``poller.client_key``; rate from
    ``AIRFLOW_TORCHX_CLOUDWATCH_RPS``)."""
    key = client_key(client, credentials)
    with _budgets_lock:
        budget = _budgets.get(key)
        if budget is None:
            budget = _budgets[key] = LogBudget(budget_rate())
        return budget


@dataclass
class LogCursor:
    """Where a reader stands: stream ``index`` (in attempt order), the forward ``token`` of
    the current page (None: the stream's head) and events of that page already returned."""

    index: int = 0
    token: str | None = None
    skip: int = 0

    @classmethod
    def load(cls, text: str | None) -> LogCursor:
        """Parse a cursor string (None: the start); a malformed one raises ``ValueError``."""
        if not text:
            return cls()
        try:
            data = cursor_object(text)
            return cls(index=int(data["i"]), token=data["token"], skip=int(data["skip"]))
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"cursor: {shown(text)} is not a cursor returned by aws_batch read_log ({err})") from None

    def dump(self) -> str:
        """The opaque JSON string handed to callers."""
        return json.dumps({"i": self.index, "token": self.token, "skip": self.skip})


def _missing_stream(err: Exception) -> bool:
    import botocore.exceptions as bce

    return isinstance(err, bce.ClientError) and err.response.get("Error", {}).get("Code") == "ResourceNotFoundException"


def read_events(
    logs_client: Any,
    budget: LogBudget,
    key: Hashable,
    streams: list[str],
    cursor: LogCursor,
    max_lines: int | None,
    terminal: bool,
    *,
    wait: bool,
    group: str = LOG_GROUP,
) -> tuple[list[dict[str, Any]], LogCursor, bool, float]:
    """Events after ``cursor`` across ``streams`` of log ``group``; the next cursor; whether
    the log is over; how many seconds the log read so far may lag the log (``behind``).

    1. Each ``GetLogEvents`` call is drawn from ``budget`` as reader ``key``: with ``wait``
       the read waits for its turn; without, a refused call ends the read early (the cursor
       stops before what was not read: nothing is lost or repeated).
    2. A stream that does not exist yet has no events yet. ``eof`` is true when the job is
       ``terminal`` and the last stream is drained. Never waits for new events.
    3. ``behind`` is 0 when the read reached the end of what is logged; else the age of the
       newest event returned or, when none was, the time since ``key`` last had a call.
    """
    events: list[dict[str, Any]] = []
    cur = LogCursor(cursor.index, cursor.token, cursor.skip)
    while cur.index < len(streams):
        drained = False
        while not drained:
            if max_lines is not None and len(events) >= max_lines:
                return events, cur, False, _behind(events, budget, key)
            if wait:
                budget.acquire(key)
            elif not budget.try_acquire(key):
                return events, cur, False, _behind(events, budget, key)
            # By hand, not a paginator: the token outlives the call in the cursor, a page may
            # be returned in part, and the budget decides each page.
            kwargs: dict[str, Any] = {"nextToken": cur.token} if cur.token else {}
            try:
                resp = logs_client.get_log_events(
                    logGroupName=group,
                    logStreamName=streams[cur.index],
                    startFromHead=True,
                    limit=PAGE,
                    **kwargs,
                )
            except Exception as err:
                if not _missing_stream(err):
                    raise
                return events, cur, False, 0.0
            raw = resp.get("events", [])
            page = raw[cur.skip :]
            room = len(page) if max_lines is None else max_lines - len(events)
            events.extend(page[:room])
            if room < len(page):
                cur.skip += room
                return events, cur, False, _behind(events, budget, key)
            nxt = resp.get("nextForwardToken")
            if not raw or not nxt or nxt == cur.token:
                cur.skip += len(page)
                drained = True
            else:
                cur = LogCursor(cur.index, nxt, 0)
        if cur.index + 1 >= len(streams):
            break
        cur = LogCursor(cur.index + 1, None, 0)
    return events, cur, terminal and cur.index >= len(streams) - 1, 0.0


_warned: dict[Hashable, None] = {}
_MAX_WARNED = 10000


def warn_once(key: Hashable, message: str, *args: Any) -> None:
    """Log ``message`` as a warning the first time ``key`` asks in this process (the newest
    ``_MAX_WARNED`` keys are remembered): a log read repeated every few seconds says it once."""
    with _budgets_lock:
        if key in _warned:
            return
        _warned[key] = None
        if len(_warned) > _MAX_WARNED:
            del _warned[next(iter(_warned))]
    log.warning(message, *args)


def list_streams(
    logs_client: Any, budget: LogBudget, key: Hashable, group: str, prefix: str, *, wait: bool
) -> list[str] | None:
    """Names of the streams of ``group`` that start with ``prefix``, oldest first (``[]``:
    none, or no such group); None when ``budget`` refused a call (without ``wait``). Each
    ``DescribeLogStreams`` page (boto3's paginator) is drawn from ``budget`` as reader
    ``key``, like a read, before the paginator asks for it."""
    found: list[dict[str, Any]] = []
    pages = iter(
        logs_client.get_paginator("describe_log_streams").paginate(logGroupName=group, logStreamNamePrefix=prefix)
    )
    more = True
    while more:
        if wait:
            budget.acquire(key)
        elif not budget.try_acquire(key):
            return None
        try:
            page = next(pages)
        except Exception as err:
            if not _missing_stream(err):
                raise
            warn_once(("group", group), "CloudWatch log group %s does not exist (yet): no pod output to read", group)
            return []
        found.extend(page.get("logStreams", []))
        more = bool(page.get("nextToken"))
    found.sort(key=lambda s: (s.get("creationTime", 0), str(s.get("logStreamName"))))
    return [str(s["logStreamName"]) for s in found]


def _behind(events: list[dict[str, Any]], budget: LogBudget, key: Hashable) -> float:
    """How far a read that stopped before the end of the log lags it (seconds)."""
    stamp = events[-1].get("timestamp") if events else None
    if stamp is None:
        return budget.waited(key)
    return max(0.0, budget.clock.wall() - float(stamp) / 1000)


def as_line(event: Mapping[str, Any]) -> str:
    """A log event's message as a line ending in ``"\\n"``."""
    msg = str(event.get("message", ""))
    return msg if msg.endswith("\n") else msg + "\n"
