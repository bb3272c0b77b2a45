"""Status at scale: one status fetch per round answers every watcher of a scheduler.

A triggerer may watch hundreds of Slurm jobs; asking the controller once per job and poll
would load it in proportion. Instead each ``SlurmScheduler`` has one ``SqueuePoller``, whose
thread runs a round when the first waiting look is due: one fetch, given the ids of every job
looked at (``SlurmScheduler``'s: one ``squeue --json``, the jobs Slurm knows, all at once, and,
with accounting, one ``sacct`` for those of the ids it no longer knows), and every look due by
then is answered from it (``Scheduler.describe_future``'s
guarantees: a look made with a ``period`` is due one ``period`` after the previous look at its
job; without, at once). A look not due yet whose job the round shows ended is answered too.
Rounds are at least ``min_interval`` apart, so a burst of looks shares one call.

``plan`` is the pure rule (which looks a round at ``now`` answers, when the next round is);
the thread only carries it out.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_torchx.core.clock import SYSTEM_CLOCK, Clock
from airflow_provider_torchx.core.schedulers.api import settle

log = logging.getLogger(__name__)

#: The shortest time between two rounds (seconds).
MIN_INTERVAL = 1.0
#: A job nobody looked at for this long is forgotten (seconds): memory stays bounded in a
#: long-running triggerer.
FORGET_AFTER = 3600.0

Entries = Mapping[str, Mapping[str, Any]]


@dataclass(eq=False)
class Look:
    """A watcher's look at job ``app_id``, due at ``due`` (monotonic seconds); ``answer`` is
    called with the round's entries (or the error the round raised) on the poller's thread."""

    app_id: str
    due: float
    future: concurrent.futures.Future[Any]
    answer: Callable[[Entries | BaseException], None] = field(repr=False)


def plan(looks: list[Look], now: float, last_round: float | None, min_interval: float) -> tuple[bool, float | None]:
    """Whether a round runs at ``now``, and else when the next one is due (None: no look waits):
    a round runs once the earliest look is due and ``min_interval`` passed since the last."""
    live = [look for look in looks if not look.future.cancelled()]
    if not live:
        return False, None
    start = max(min(look.due for look in live), (last_round or float("-inf")) + min_interval)
    return (start <= now), start


def answered(looks: list[Look], now: float, ended: Callable[[str], bool]) -> list[Look]:
    """The looks a round started at ``now`` answers: those due, and those whose job it shows ended."""
    return [look for look in looks if look.due <= now or ended(look.app_id)]


class SqueuePoller:
    """One round of ``fetch`` (given the ids looked at: every job Slurm knows, by app id) for
    every look due."""

    def __init__(
        self,
        fetch: Callable[[Collection[str]], Entries],
        ended: Callable[[Mapping[str, Any]], bool],
        clock: Clock = SYSTEM_CLOCK,
        min_interval: float = MIN_INTERVAL,
        thread: bool = True,
    ) -> None:
        """``thread`` False: no thread of its own, the caller runs the rounds (``run_round``)."""
        self._fetch = fetch
        self._ended = ended
        self._clock = clock
        self.min_interval = min_interval
        self._looks: list[Look] = []
        self._last_look: dict[str, float] = {}
        self._last_round: float | None = None
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._threaded = thread
        self._closed = False
        #: Rounds run (one ``squeue`` call each).
        self.rounds = 0

    def look(
        self, app_id: str, answer: Callable[[Entries | BaseException], Any], period: float | None
    ) -> concurrent.futures.Future[Any]:
        """A future resolved with ``answer(entries)`` by the round that answers this look."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        now = self._clock.monotonic()
        with self._cond:
            previous = self._last_look.get(app_id)
            due = now if period is None or previous is None else max(now, previous + period)

            def settle_with(entries: Entries | BaseException) -> None:
                settle(future, lambda: answer(entries))

            self._looks.append(Look(app_id, due, future, settle_with))
            if self._thread is None and self._threaded:
                self._thread = threading.Thread(target=self._loop, name="slurm-squeue-poller", daemon=True)
                self._thread.start()
            self._cond.notify()
        return future

    def run_round(self) -> int:
        """Run one round now (one ``fetch``) and answer the looks it answers; how many."""
        now = self._clock.monotonic()
        with self._cond:
            # the looks the fetch is for: one made while it runs waits for the next round
            asked = list(self._looks)
        ids = {look.app_id for look in asked}
        try:
            entries: Entries | BaseException = self._fetch(ids)
        except Exception as err:
            entries = err
        self.rounds += 1
        with self._cond:
            self._last_round = now
            if isinstance(entries, BaseException):
                done = [look for look in asked if look.due <= now]
            else:
                got = entries
                done = answered(asked, now, lambda app_id: app_id in got and self._ended(got[app_id]))
            for look in done:
                self._last_look[look.app_id] = now
            self._last_look = {k: t for k, t in self._last_look.items() if now - t <= FORGET_AFTER}
            self._looks = [look for look in self._looks if look not in done and not look.future.cancelled()]
        for look in done:
            look.answer(entries)
        return len(done)

    def _loop(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    return
                run, start = plan(self._looks, self._clock.monotonic(), self._last_round, self.min_interval)
                if not run:
                    self._cond.wait(None if start is None else max(0.0, start - self._clock.monotonic()))
                    continue
            try:
                self.run_round()
            except Exception:  # an answer's own error is its future's; keep polling for the others
                log.exception("slurm poller round failed")

    def close(self) -> None:
        """Stop the thread; waiting looks are cancelled."""
        with self._cond:
            self._closed = True
            looks, self._looks = self._looks, []
            self._cond.notify()
        for look in looks:
            look.future.cancel()
