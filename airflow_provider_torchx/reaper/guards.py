"""The guards the reaper holds: a job's ``start_timeout`` that its scheduler cannot hold itself
(AWS Batch: the run option is tagged on the job, and ``list_live`` gives it back as
``ListAppResponse.start_timeout``), with nobody watching. Each round of the reconciling loop
applies ``core/guards.py``'s rule (``start_trip``) to the live jobs it listed anyway, and
cancels those past their limit, so such a job's overrun is bounded by the loop's round, not by
an outage of whoever watches. (The local supervisor holds its jobs' guards itself.)"""

from __future__ import annotations

import logging

from airflow_provider_torchx.core.guards import Trip, start_trip
from airflow_provider_torchx.core.schedulers.api import CancelledBy
from airflow_provider_torchx.core.specs import AppState
from airflow_provider_torchx.reaper.listing import LiveJob

log = logging.getLogger(__name__)


def start_overdue(job: LiveJob, now: float) -> Trip | None:
    """The ``start_timeout`` trip of the listed ``job`` at ``now`` (epoch seconds), if any: a
    job that has not run (no start time, not RUNNING) more than its limit after its submission."""
    if job.start_timeout is None:
        return None
    started = job.started is not None or job.state == AppState.RUNNING
    return start_trip(job.start_timeout, job.state, job.created, started, "", now)


def next_due(jobs: list[LiveJob], now: float) -> float | None:
    """Seconds until the earliest ``start_timeout`` of the ``jobs`` still waiting runs out
    (None: none will), so the loop's next round comes then (one already over was acted on
    this round: a cancel that failed waits for the next regular round)."""
    due = [
        job.created + job.start_timeout - now
        for job in jobs
        if job.start_timeout is not None
        and job.created is not None
        and job.started is None
        and job.state != AppState.RUNNING
    ]
    ahead = [d for d in due if d >= 0]
    return min(ahead) + 0.1 if ahead else None


def hold_start_timeouts(jobs: list[LiveJob], now: float, where: str) -> list[Trip]:
    """Cancel each of ``jobs`` past its ``start_timeout`` (the cancel's reason names the guard,
    as a watcher's trip does); log it and count it (``torchx.job.guardrail``). A cancel that
    fails is logged: the next round tries again. Returns the trips acted on."""
    from airflow_provider_torchx.metrics import emit_guardrail
    from airflow_provider_torchx.sources import runner_for

    tripped = []
    for job in jobs:
        trip = start_overdue(job, now)
        if trip is None:
            continue
        reason = f"guardrail {trip.guard}={trip.limit:g} tripped"
        try:
            runner_for(job.handle, job.conn_id).cancel(job.handle, reason=reason, by=CancelledBy.REAPER)
        except Exception as e:
            log.warning("guardrail: %s: cancel failed (%s: %s); trying again later", job.handle, type(e).__name__, e)
            continue
        log.warning("Cancelled job %s (%s): %s", job.handle, where, trip.message(job.handle))
        ident = job.identity  # None only for a record the scheduler refuses, which names no task
        dag_id, task_id = (ident.dag_id, ident.task_id) if ident is not None else ("", "")
        emit_guardrail(scheduler=job.scheduler, dag_id=dag_id, task_id=task_id, guard=trip.guard)
        tripped.append(trip)
    return tripped
