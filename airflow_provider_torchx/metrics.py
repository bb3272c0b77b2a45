"""A finished job's usage as Airflow metrics, through Airflow's own stats client (StatsD or
OpenTelemetry, as the deployment configured ``[metrics]``; nothing at all when metrics are
off: the client is then a no-op).

Every metric is tagged with the scheduler and the task, under Airflow's own names
(``scheduler``, ``dag_id``, ``task_id``: ``job_tags``); a usage metric adds ``app_name``,
``torchx.job.orphan_cancelled`` the ``reason``, ``torchx.job.guardrail`` the ``guard``,
``torchx.job.failed`` the failure's ``kind`` and ``torchx.job.moved`` the rungs (``from``, ``to``) and ``why``.
Plain StatsD carries no tags: they reach the wire with ``statsd_influxdb_enabled``, DogStatsD
(``statsd_datadog_enabled``) or OpenTelemetry.
"""

from __future__ import annotations

from datetime import timedelta

from airflow_provider_torchx._compat import stats
from airflow_provider_torchx.core.usage import Usage

#: Metric names (after Airflow's ``statsd_prefix``).
DURATION = "torchx.job.duration"
QUEUE_WAIT = "torchx.job.queue_wait"
GPU_HOURS = "torchx.job.gpu_hours"
VCPU_HOURS = "torchx.job.vcpu_hours"
ATTEMPTS = "torchx.job.attempts"
COST_USD = "torchx.job.cost_usd"
#: A counter: a job cancelled because it outlived its task instance (``reaper/decisions.py``).
ORPHAN_CANCELLED = "torchx.job.orphan_cancelled"
#: A counter: a guard stopped a job (``core/guards.py``; ``attempt_timeout``: the scheduler did).
GUARDRAIL = "torchx.job.guardrail"
#: A counter: a job moved down its capacity ladder (``ladder.py``), tagged ``from``, ``to``, ``why``.
MOVED = "torchx.job.moved"
#: A counter: a task failed for its job, tagged with the failure's ``kind`` (``core/failures.py``).
FAILED = "torchx.job.failed"


def job_tags(*, scheduler: str, dag_id: str, task_id: str, **more: str) -> dict[str, str]:
    """The tags of every metric (the scheduler, the DAG and the task, named as Airflow's own
    metrics name them) with ``more`` of the metric's own."""
    return {"scheduler": scheduler, "dag_id": dag_id, "task_id": task_id, **more}


def emit_usage_metrics(usage: Usage, *, scheduler: str, app_name: str, dag_id: str, task_id: str) -> None:
    """Emit the job's run time and queue wait (timers), GPU-hours, vCPU-hours, attempts and,
    when priced, its cost in US dollars (gauges); figures not known are left out."""
    tags = job_tags(scheduler=scheduler, dag_id=dag_id, task_id=task_id, app_name=app_name)
    client = stats()
    if usage.run_time_s is not None:
        client.timing(DURATION, timedelta(seconds=usage.run_time_s), tags=tags)
    if usage.queue_wait_s is not None:
        client.timing(QUEUE_WAIT, timedelta(seconds=usage.queue_wait_s), tags=tags)
    if usage.gpu_hours is not None:
        client.gauge(GPU_HOURS, usage.gpu_hours, tags=tags)
    if usage.vcpu_hours is not None:
        client.gauge(VCPU_HOURS, usage.vcpu_hours, tags=tags)
    client.gauge(ATTEMPTS, len(usage.attempts), tags=tags)
    if usage.cost_usd is not None:
        client.gauge(COST_USD, usage.cost_usd, tags=tags)


def emit_orphan_cancelled(*, scheduler: str, dag_id: str, task_id: str, reason: str) -> None:
    """Count a job cancelled for outliving its task instance, tagged with why (the decision
    table's reason: ``task_failed``, ``dag_run_deleted``, ``superseded``, ...)."""
    stats().incr(ORPHAN_CANCELLED, tags=job_tags(scheduler=scheduler, dag_id=dag_id, task_id=task_id, reason=reason))


def emit_guardrail(*, scheduler: str, dag_id: str, task_id: str, guard: str) -> None:
    """Count a job stopped by a guard (``start_timeout``, ``max_gpu_hours``,
    ``attempt_timeout``), tagged with which."""
    stats().incr(GUARDRAIL, tags=job_tags(scheduler=scheduler, dag_id=dag_id, task_id=task_id, guard=guard))


def emit_failed(*, scheduler: str, dag_id: str, task_id: str, kind: str) -> None:
    """Count a task failed for its job, tagged with the failure's kind (``app``, ``infra``,
    ``capacity``, ``config``, ``cancelled``, ``guardrail``, ``timeout``)."""
    stats().incr(FAILED, tags=job_tags(scheduler=scheduler, dag_id=dag_id, task_id=task_id, kind=kind))


def emit_moved(*, scheduler: str, dag_id: str, task_id: str, source: str, target: str, why: str) -> None:
    """Count a job moved from rung ``source`` to rung ``target`` of its ladder (connection ids),
    tagged with why (``start_timeout``, ``max_infra_failures``); ``scheduler``: the rung left's."""
    tags = job_tags(scheduler=scheduler, dag_id=dag_id, task_id=task_id, to=target, why=why)
    tags["from"] = source
    stats().incr(MOVED, tags=tags)
