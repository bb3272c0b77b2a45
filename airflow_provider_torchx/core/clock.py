"""Where the package reads time: one ``Clock`` handed to every component that decides by time.

The watchers (``logstream.py``, ``watch.py``), the Batch status poller and its change sweep,
the CloudWatch read budget, the queue preflight's cache, the orphaned-jobs reaper and
``[torchx] retain_finished`` each take a ``Clock`` (``SYSTEM_CLOCK`` unless a test passes its
own), so a test drives all of them with one fake clock. Code that only stamps a record with
the time it was written reads ``time.time()`` itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple


class Clock(NamedTuple):
    """Where a component takes its time from: ``monotonic`` for intervals, ``wall`` (epoch
    seconds) for deadlines and for ages of what carries an epoch time (a file's mtime, a
    job's end), ``sleep`` for pauses."""

    monotonic: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep


#: The system's clock: what every component uses unless a test passes its own.
SYSTEM_CLOCK = Clock()
