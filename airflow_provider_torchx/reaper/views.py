"""What the decision table is fed: each task instance as Airflow's database tells it (four
batched queries, whatever the number of jobs), and each live job beside its siblings."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, NamedTuple

from airflow_provider_torchx.core.identity import TaskIdentity
from airflow_provider_torchx.orphans import DISOWNED_XCOM, ENDED_RUN_STATES, JobView, TaskView
from airflow_provider_torchx.reaper.listing import LiveJob


class RunRow(NamedTuple):
    """A DAG run as the database tells it: its state and end (epoch seconds; None: unset)."""

    state: str | None
    ended_at: float | None


class TaskRow(NamedTuple):
    """A task instance as the database tells it (times in epoch seconds; None: unset)."""

    state: str | None
    try_number: int
    started_at: float | None
    ended_at: float | None


def _epoch(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def _state(value: Any) -> str | None:
    """A state column's value as text (an enum's value; None stays None)."""
    return None if value is None else str(getattr(value, "value", value))


def read_task_views(identities: Iterable[TaskIdentity | None]) -> dict[TaskIdentity, TaskView]:
    """What Airflow's database says of each task instance (its DAG, run, state, and whether
    its try disowned the job), in four queries whatever the number of jobs (None, a refused
    job's unknown identity, is left out). Raises when the database cannot be read."""
    from airflow.models.dag import DagModel
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    wanted = {i for i in identities if i is not None}
    if not wanted:
        return {}
    dag_ids = {i.dag_id for i in wanted}
    task_ids = {i.task_id for i in wanted}
    run_ids = {i.run_id for i in wanted}
    with create_session() as session:
        dags = set(session.scalars(select(DagModel.dag_id).where(DagModel.dag_id.in_(dag_ids))))
        runs = {
            (row.dag_id, row.run_id): RunRow(str(row.state) if row.state is not None else None, _epoch(row.end_date))
            for row in session.execute(
                select(DagRun.dag_id, DagRun.run_id, DagRun.state, DagRun.end_date).where(
                    DagRun.dag_id.in_(dag_ids), DagRun.run_id.in_(run_ids)
                )
            )
        }
        tis = {
            TaskIdentity(row.dag_id, row.task_id, row.run_id, row.map_index): TaskRow(
                _state(row.state), int(row.try_number or 0), _epoch(row.start_date), _epoch(row.end_date)
            )
            for row in session.execute(
                select(
                    TaskInstance.dag_id,
                    TaskInstance.task_id,
                    TaskInstance.run_id,
                    TaskInstance.map_index,
                    TaskInstance.state,
                    TaskInstance.try_number,
                    TaskInstance.start_date,
                    TaskInstance.end_date,
                ).where(
                    TaskInstance.dag_id.in_(dag_ids),
                    TaskInstance.run_id.in_(run_ids),
                    TaskInstance.task_id.in_(task_ids),
                )
            )
        }
        disowned = {
            TaskIdentity(row.dag_id, row.task_id, row.run_id, row.map_index)
            for row in session.execute(
                select(XComModel.dag_id, XComModel.task_id, XComModel.run_id, XComModel.map_index).where(
                    XComModel.key == DISOWNED_XCOM,
                    XComModel.dag_id.in_(dag_ids),
                    XComModel.run_id.in_(run_ids),
                    XComModel.task_id.in_(task_ids),
                )
            )
        }
    views = {}
    for ident in wanted:
        run = runs.get((ident.dag_id, ident.run_id))
        ti = tis.get(ident)
        if run is None or ti is None:
            views[ident] = TaskView(dag_known=ident.dag_id in dags, run_state=run.state if run else None, found=False)
            continue
        views[ident] = TaskView(
            dag_known=True,
            run_state=run.state,
            found=True,
            state=ti.state,
            try_number=ti.try_number,
            try_started_at=ti.started_at,
            ended_at=ti.ended_at or (run.ended_at if run.state in ENDED_RUN_STATES else None),
            disowned=ident in disowned,
        )
    return views


def view_of(views: Mapping[TaskIdentity, TaskView] | None, job: LiveJob) -> TaskView | None:
    """What ``views`` say of ``job``'s task instance (None: nothing, or it names none)."""
    return views.get(job.identity) if views is not None and job.identity is not None else None


class ListedJob(NamedTuple):
    """A live job and what the table needs of it."""

    job: LiveJob
    view: JobView


def job_views(jobs: list[LiveJob]) -> list[ListedJob]:
    """Each job with what the table needs of it, including its newest live sibling (another
    job of the same task instance)."""
    by_identity: dict[TaskIdentity, list[LiveJob]] = {}
    for job in jobs:
        if job.identity is not None:
            by_identity.setdefault(job.identity, []).append(job)
    out = []
    for job in jobs:
        siblings = by_identity.get(job.identity, []) if job.identity is not None else []
        others = [o.created for o in siblings if o is not job and o.created is not None]
        newest = max(others) if others else None
        out.append(ListedJob(job, JobView(job.state, job.identity, job.created, newest, job.refused)))
    return out
