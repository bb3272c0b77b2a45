"""moto's server for the triggerer benchmark's thousands of PENDING Batch jobs.

moto runs a thread per Batch job; a job waiting for a dependency checks it once a second. With
5,000 such jobs that is 5,000 wake-ups a second in the server (a load average of 600 on the
2-core build machine when they were terminated, and requests timing out). Here a waiting job
sleeps until it is terminated (``TerminateJob``/``CancelJob`` set an event), re-checking its
dependencies every 30 s; everything else is moto's own. The benchmark's dependencies never
finish, so what a client sees is unchanged: PENDING until terminated, then FAILED.

With ``MOTO_QUIET_RUNNING=1`` in its environment a waiting job shows RUNNING instead, with one
attempt started then on the first ECS container instance registered in its region (``TBD``, as
moto's own attempts say, if none is): what pricing an attempt at AWS's prices starts from
(``triggerer_scale.py --pricing``); terminated, it is FAILED with that attempt stopped.

    python benchmarks/moto_quiet.py -H 127.0.0.1 -p PORT      # moto.server's arguments
"""

from __future__ import annotations

import os
import threading
from datetime import datetime
from typing import Any

from moto.batch import models
from moto.batch.models import datetime2int_milliseconds
from moto.ecs.models import ecs_backends
from moto.server import main

#: Seconds between two checks of a waiting job's dependencies.
RECHECK = 30.0
#: Whether a waiting job shows RUNNING on a container instance (see the module docstring).
RUNNING = os.environ.get("MOTO_QUIET_RUNNING") == "1"

_events: dict[int, threading.Event] = {}
_lock = threading.Lock()


def _event(job: Any) -> threading.Event:
    with _lock:
        return _events.setdefault(id(job), threading.Event())


def _start_running(job: Any) -> None:
    """Show ``job`` RUNNING from now, its one attempt on the region's first container instance."""
    ecs = ecs_backends[job.backend.account_id][job.backend.region_name]
    instances = (i.container_instance_arn for cluster in ecs.container_instances.values() for i in cluster.values())
    job.job_started_at = datetime.now()
    job.latest_attempt = {
        "container": {"containerInstanceArn": next(instances, "TBD"), "networkInterfaces": []},
        "startedAt": datetime2int_milliseconds(job.job_started_at),
    }
    job.attempts.append(job.latest_attempt)
    job.status = models.JobStatus.RUNNING.value


def _wait_for_dependencies(self: Any) -> bool:
    """moto's ``Job._wait_for_dependencies``, waiting on the job's event instead of polling
    (RUNNING meanwhile with ``MOTO_QUIET_RUNNING``)."""
    if RUNNING:
        _start_running(self)
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
