"""moto's server for the triggerer benchmark's thousands of PENDING Batch jobs.

moto runs a thread per Batch job; a job waiting for a dependency checks it once a second. With
5,000 such jobs that is 5,000 wake-ups a second in the server (a load average of 600 on the
2-core build machine when they were terminated, and requests timing out). Here a waiting job
sleeps until it is terminated (``TerminateJob``/``CancelJob`` set an event), re-checking its
dependencies every 30 s; everything else is moto's own. The benchmark's dependencies never
finish, so what a client sees is unchanged: PENDING until terminated, then FAILED.

    python benchmarks/moto_quiet.py -H 127.0.0.1 -p PORT      # moto.server's arguments
"""

from __future__ import annotations

import threading
from typing import Any

from moto.batch import models
from moto.server import main

#: Seconds between two checks of a waiting job's dependencies.
RECHECK = 30.0

_events: dict[int, threading.Event] = {}
_lock = threading.Lock()


def _event(job: Any) -> threading.Event:
    with _lock:
        return _events.setdefault(id(job), threading.Event())


def _wait_for_dependencies(self: Any) -> bool:
    """moto's ``Job._wait_for_dependencies``, waiting on the job's event instead of polling."""
    dependent_ids = [dependency["jobId"] for dependency in self.depends_on]
    successful: set[str] = set()
    while len(successful) != len(dependent_ids):
        for dependent_id in dependent_ids:
            dependent = self.all_jobs.get(dependent_id)
            if dependent is not None and dependent.status == models.JobStatus.SUCCEEDED:
                successful.add(dependent_id)
            if dependent is not None and dependent.status == models.JobStatus.FAILED:
                self._mark_stopped(success=False)
                return False
        _event(self).wait(RECHECK)
        if self.stop:
            self._mark_stopped(success=False)
            return False
    return True


_terminate = models.Job.terminate


def _terminate_and_wake(self: Any, reason: str) -> None:
    _terminate(self, reason)
    _event(self).set()


models.Job._wait_for_dependencies = _wait_for_dependencies  # type: ignore[method-assign]
models.Job.terminate = _terminate_and_wake  # type: ignore[method-assign]

if __name__ == "__main__":
    main()
