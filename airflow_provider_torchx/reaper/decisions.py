"""The table applied: a decision for each live job, and the cancel of each orphan whose grace
passed; also the table's answer for the UI (which live jobs are orphans) and for a task's own
components (a trigger's start check, the trigger's and the operator's kill hooks)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import NamedTuple

from airflow_provider_torchx.core.clock import SYSTEM_CLOCK, Clock
from airflow_provider_torchx.core.errors import RecordRefusedError
from airflow_provider_torchx.core.identity import TaskIdentity
from airflow_provider_torchx.core.schedulers.api import CancelledBy
from airflow_provider_torchx.core.specs import AppState
from airflow_provider_torchx.orphans import Decision, JobView, Killed, TaskView, Verdict, decide
from airflow_provider_torchx.reaper.listing import LiveJob
from airflow_provider_torchx.reaper.settings import ReaperSettings, reaper_settings
from airflow_provider_torchx.reaper.views import job_views, read_task_views, view_of

log = logging.getLogger(__name__)


class Judged(NamedTuple):
    """A live job and the table's decision for it."""

    job: LiveJob
    decision: Decision


def cancel_orphan(job: LiveJob, decision: Decision, where: str) -> None:
    """Cancel ``job`` with the decision's reason in its status message; log it and count it
    (``torchx.job.orphan_cancelled``). Failures are logged: the next round tries again."""
    from airflow_provider_torchx.metrics import emit_orphan_cancelled
    from airflow_provider_torchx.sources import runner_for

    message = f"cancelled: {decision.detail}"
    try:
        runner_for(job.handle, job.conn_id).cancel(job.handle, reason=decision.detail, by=CancelledBy.REAPER)
    except RecordRefusedError as e:
        if not e.delivered:  # no supervisor of it runs any more: nothing left to stop
            log.info("orphaned job %s: nothing to cancel (%s)", job.handle, e)
            return
        message = f"{message} (its record is refused: the cancel reached it all the same)"
    except Exception as e:
        log.warning("orphaned job %s: cancel failed (%s: %s); trying again later", job.handle, type(e).__name__, e)
        return
    log.warning("Cancelled orphaned job %s (%s): %s", job.handle, where, message)
    ident = job.identity
    emit_orphan_cancelled(
        scheduler=job.scheduler,
        dag_id=ident.dag_id if ident else "",
        task_id=ident.task_id if ident else "",
        reason=str(decision.reason),
    )


def apply(
    jobs: list[LiveJob],
    views: Mapping[TaskIdentity, TaskView] | None,
    *,
    settings: ReaperSettings,
    now: float,
    where: str,
    first_seen: dict[str, float] | None = None,
) -> list[Judged]:
    """Decide for each job (``views`` None: the states could not be read) and cancel the
    orphans whose grace passed. ``first_seen`` (handle -> epoch seconds) is kept up to date
    for orphans without an end date. Returns every decision."""
    seen = first_seen if first_seen is not None else {}
    out = []
    for job, view in job_views(jobs):
        task = view_of(views, job)
        decision = decide(
            task, view, enabled=settings.enabled, grace=settings.grace, now=now, first_seen=seen.get(job.handle)
        )
        if decision.orphaned:
            seen.setdefault(job.handle, now)
        if decision.verdict == Verdict.CANCEL:
            cancel_orphan(job, decision, where)
            seen.pop(job.handle, None)
        elif decision.verdict == Verdict.LATER and not decision.orphaned:
            log.debug("orphaned jobs: %s: asking again later (%s)", job.handle, decision.why)
        out.append(Judged(job, decision))
    for handle in set(seen) - {job.handle for job in jobs}:
        del seen[handle]
    return out


def orphans_among(jobs: list[LiveJob], *, clock: Clock = SYSTEM_CLOCK) -> dict[str, str]:
    """``{handle: why}`` for the live ``jobs`` whose task instance ended (the UI marks them
    "orphaned" until they are cancelled), whatever the setting or the grace period say.
    Empty when the states cannot be read."""
    settings = reaper_settings()
    try:
        views = read_task_views({job.identity for job in jobs})
    except Exception as e:
        log.warning("orphaned jobs: could not read task instance states (%s: %s)", type(e).__name__, e)
        return {}
    now = clock.wall()
    out = {}
    for job, view in job_views(jobs):
        decision = decide(view_of(views, job), view, enabled=settings.enabled, grace=settings.grace, now=now)
        if decision.orphaned:
            out[job.handle] = decision.detail
    return out


def own_decision(
    identity: TaskIdentity | None,
    task: TaskView | None,
    *,
    killed: Killed | None = None,
    clock: Clock = SYSTEM_CLOCK,
) -> Decision:
    """The table's answer for the live job of the task instance ``identity`` (None: its labels
    name none), asked by one of the task's own components: ``task`` is what it read of the
    task instance (None: nothing, or it could not), ``killed`` whether the task's kill or
    cancel hook fired (None: a trigger's start check). No grace: such a component cancels an
    orphan at once."""
    settings = reaper_settings()
    job = JobView(AppState.RUNNING, identity)
    return decide(task, job, enabled=settings.enabled, grace=0.0, now=clock.wall(), killed=killed)
