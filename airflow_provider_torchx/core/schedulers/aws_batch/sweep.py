"""The change sweep: learn which watched Batch jobs changed status from ``ListJobs``, so that the
status poller describes those at once instead of at their next scheduled look.

The status poller looks at each watched job once a period (``StatusPoller.request(period=)``),
so a job's end is seen up to a period later (p95 0.95 x period). Looking sooner with
``DescribeJobs`` alone costs calls in proportion: at 100 ids a call, 1,000 jobs looked at every
2.5 s are 4 calls a second. ``ListJobs`` with ``jobStatus`` answers for a whole queue instead: it
returns every job of the queue in that status, up to 1,000 a page (the API reference's
``maxResults``; ``filters`` would make it ignore ``jobStatus``, so none are given). A watched job
missing from the listing of the status it was last described in has changed (ended, or moved
on): the poller describes it in its next round (``StatusPoller.look_soon``). A job that is
listed has not changed since the listing was served. The listing decides nothing else: a job
missing by mistake costs one id in a round, a change the listing misses is seen at the job's
scheduled look as before.

How often each group (queue, status) of watched jobs is listed is ``sweep_plan``'s: a quarter
of the period at most, within a budget of calls (what the scheduled DescribeJobs calls cost,
and at least one group at the full rate), and never where it would not come before the
scheduled look (a queue full of other jobs, say).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_provider_torchx.core.clock import SYSTEM_CLOCK, Clock

log = logging.getLogger(__name__)

#: A group of watched jobs: (job queue ARN, status they were last described in).
Group = tuple[str, str]
#: ``ListJobs`` returns at most this many summaries a page when ``jobStatus`` is given.
LIST_PAGE = 1000
#: A group is listed at most this many times a period.
SWEEPS_PER_PERIOD = 4
#: How many ``ListJobs`` summaries cost (botocore's parse) what one ``DescribeJobs`` entry
#: costs; kept below the measured ratio (benchmarks/README.md, "Costs measured in passing").
SUMMARY_WEIGHT = 8
#: ``DescribeJobs`` ids a call (the poller's batch).
DESCRIBE_IDS = 100
#: Seconds before a group whose listing failed (after the retries) is listed again.
FAILED_PAUSE = 300.0


@dataclass(frozen=True)
class GroupSize:
    """What the sweep plans a group's listings from: its ``watched`` jobs, their shortest
    ``period``, and the ``listed`` summaries in ``pages`` pages its last listing returned."""

    watched: int
    period: float
    listed: int
    pages: int


def sweep_plan(groups: Mapping[Group, GroupSize]) -> dict[Group, float]:
    """Seconds between two listings of each group worth listing (the others are left to their
    scheduled looks). A group is listed at most ``SWEEPS_PER_PERIOD`` times a period, less
    often when most of its listing is other jobs (its summaries at most ``SUMMARY_WEIGHT``
    times its jobs per period: what describing them costs to parse). The listings' calls a
    second stay within a budget: what the groups' scheduled DescribeJobs calls cost (100 ids a
    call, once a period), and at least one group listed at the full rate, so that the last
    jobs of a draining group are seen as soon as the first. Groups with the most watched jobs
    per page come first; one that would be listed only once a period or less gets nothing."""
    if not groups:
        return {}
    budget = max(
        sum(g.watched / (DESCRIBE_IDS * g.period) for g in groups.values()),
        SWEEPS_PER_PERIOD / min(g.period for g in groups.values()),
    )
    plan: dict[Group, float] = {}
    for key, g in sorted(groups.items(), key=lambda kv: (-kv[1].watched / max(kv[1].pages, 1), kv[0])):
        if g.watched <= 0 or budget <= 0:
            continue
        pages = max(g.pages, 1)
        interval = g.period * max(1.0 / SWEEPS_PER_PERIOD, max(g.listed, g.watched) / (SUMMARY_WEIGHT * g.watched))
        interval = max(interval, pages / budget)
        if interval < g.period:
            plan[key] = interval
            budget -= pages / interval
    return plan


def changed(watched: Iterable[str], listed: set[str]) -> list[str]:
    """The watched ids missing from a listing of their group (sorted)."""
    return sorted(set(watched) - listed)


class ChangeSweep:
    """Lists the groups of watched jobs from a thread of its own and hints the changed ones.

    ``groups()`` returns the watched jobs waiting for a scheduled look by group, with the
    group's shortest period; ``hint(group, ids)`` asks for a look at ``ids`` now (the poller
    checks they are still in ``group``). The thread starts on ``wake()`` and exits after
    ``idle_exit`` seconds without groups. ``step`` is one pass, for tests that drive ``clock``
    by hand."""

    def __init__(
        self,
        client: Any,
        groups: Callable[[], dict[Group, tuple[frozenset[str], float]]],
        hint: Callable[[Group, list[str]], None],
        *,
        idle_exit: float = 30.0,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.client = client
        self.groups = groups
        self.hint = hint
        self.idle_exit = idle_exit
        self.clock = clock
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._next: dict[Group, float] = {}
        self._sizes: dict[Group, tuple[int, int]] = {}  # group -> (summaries, pages) last listed
        #: ListJobs calls made (benchmarks and tests read it).
        self.calls = 0

    def wake(self) -> None:
        """Start the thread unless it runs."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="aws-batch-change-sweep", daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        idle_since = self.clock.monotonic()
        while True:
            wake = self.step()
            now = self.clock.monotonic()
            if wake is None:
                with self._lock:
                    if now - idle_since > self.idle_exit:
                        self._thread = None
                        return
            else:
                idle_since = now
            self.clock.sleep(1.0 if wake is None else min(1.0, max(wake - now, 0.05)))

    def step(self) -> float | None:
        """List every group that is due and hint its changed jobs; when the next group is due
        (None: no group is worth listing)."""
        groups = self.groups()
        for dropped in set(self._next) - set(groups):
            self._next.pop(dropped, None)
            self._sizes.pop(dropped, None)
        plan = sweep_plan(self.sizes(groups))
        wake: float | None = None
        for group in sorted(groups):
            interval = plan.get(group)
            if interval is None:
                self._next.pop(group, None)
                continue
            now = self.clock.monotonic()
            due = self._next.setdefault(group, now + interval)  # its jobs were just described
            if due <= now:
                try:
                    found, pages = self._list(group)
                except Exception as err:  # the scheduled looks go on without it
                    log.warning(
                        "listing the %s jobs of %s failed (%s: %s): trying again in %.0f s",
                        group[1],
                        group[0],
                        type(err).__name__,
                        err,
                        FAILED_PAUSE,
                    )
                    due = self._next[group] = now + FAILED_PAUSE
                else:
                    self._sizes[group] = (len(found), pages)
                    gone = changed(groups[group][0], found)
                    if gone:
                        self.hint(group, gone)
                    due = self._next[group] = now + interval
            wake = due if wake is None else min(wake, due)
        return wake

    def sizes(self, groups: Mapping[Group, tuple[frozenset[str], float]]) -> dict[Group, GroupSize]:
        """What ``sweep_plan`` plans ``groups`` from: their watched jobs and shortest period,
        with what each one's last listing returned (before any: its own jobs, in full pages)."""
        return {
            key: GroupSize(len(ids), period, *self._sizes.get(key, (len(ids), math.ceil(len(ids) / LIST_PAGE))))
            for key, (ids, period) in groups.items()
        }

    def _list(self, group: Group) -> tuple[set[str], int]:
        """The ids ``ListJobs`` lists in ``group`` (every page, boto3's paginator) and the
        number of pages."""
        queue, status = group
        found: set[str] = set()
        pages = 0
        listing = self.client.get_paginator("list_jobs").paginate(
            jobQueue=queue, jobStatus=status, PaginationConfig={"PageSize": LIST_PAGE}
        )
        for page in listing:
            self.calls += 1
            pages += 1
            found.update(s["jobId"] for s in page.get("jobSummaryList", []))
        return found, pages
