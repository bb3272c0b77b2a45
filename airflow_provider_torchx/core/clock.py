"""Where the package reads time: one ``Clock`` handed to every component that decides by time.

The watchers (``logstream.py``, ``watch.py``), the Batch status poller and its change sweep,
the CloudWatch read budget, the queue preflight's cache, the host ledger's start timeout, the
orphaned-jobs reaper and ``[torchx] retain_finished`` each take a ``Clock``
(``SYSTEM_CLOCK`` unless a test passes its own), so a test drives all of them with one fake
clock. Code that only stamps a record with the time it was written reads ``time.time()``
itself. Light to import (no ``typing``): a local job's supervisor imports it at its start.
"""

from __future__ import annotations

import time

TYPE_CHECKING = False  # not ``typing``: the supervisor's start-up must stay fast
if TYPE_CHECKING:
    from collections.abc import Callable


class Clock:
    """Where a component takes its time from: ``monotonic`` for intervals, ``wall`` (epoch
    seconds) for deadlines and for ages of what carries an epoch time (a file's mtime, a
    task's end), ``sleep`` for pauses. Each defaults to the system's."""

    __slots__ = ("monotonic", "sleep", "wall")

    def __init__(
        self,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.monotonic = monotonic
        self.wall = wall
        self.sleep = sleep


#: The system's clock: what every component uses unless a test passes its own.
SYSTEM_CLOCK = Clock()
