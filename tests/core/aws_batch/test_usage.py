"""Batch usage summaries from ``DescribeJobs`` entries shaped like real AWS, with known
timestamps (epoch ms) and attempts: a multi-node job with child jobs, the same without child
jobs (as moto answers), a single-node ``container`` job, and through ``describe``."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_torchx.core.schedulers.aws_batch import create_scheduler
from airflow_provider_torchx.core.schedulers.aws_batch.status import describe_response
from airflow_provider_torchx.core.schedulers.aws_batch.usage import batch_usage
from airflow_provider_torchx.core.specs import AppState
from tests.core.aws_batch.fakes import FakeBatch, FakeLogs, child_job, mnp_job

T0 = 1700000000000  # createdAt of the fakes' jobs


def attempt(start_s: float, stop_s: float, exit_code: int, reason: str = "") -> dict[str, Any]:
    """An ``AttemptDetail``: seconds after T0 in, epoch ms out."""
    return {
        "startedAt": T0 + int(start_s * 1000),
        "stoppedAt": T0 + int(stop_s * 1000),
        "statusReason": reason,
        "container": {"exitCode": exit_code, "logStreamName": "s"},
    }


def ended_mnp_job() -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
    """trainer x2 and ps x1 (2 vCPUs, 1024 MiB each); node 0 ran twice (the first attempt's
    host went away after 60 s), the others once for 600 s; queued 30 s."""
    job = mnp_job(status="SUCCEEDED", startedAt=T0 + 30_000, stoppedAt=T0 + 700_000)
    job["attempts"] = [attempt(30, 90, 1, "Host EC2 (instance i-1) terminated."), attempt(100, 700, 0)]
    nodes = {
        0: child_job("j1", 0, "SUCCEEDED", 0, attempts=job["attempts"]),
        1: child_job("j1", 1, "SUCCEEDED", 0, attempts=[attempt(31, 91, 1), attempt(100, 700, 0)]),
        2: child_job("j1", 2, "SUCCEEDED", 0, attempts=[attempt(32, 92, 1), attempt(100, 700, 0)]),
    }
    return job, nodes


def test_multi_node_job_with_child_jobs_and_attempts() -> None:
    job, nodes = ended_mnp_job()
    roles = describe_response("q1:app-1", job, nodes, "us-west-2").roles
    usage = batch_usage(job, nodes, roles)
    assert usage.submitted == T0 / 1000
    assert usage.queue_wait_s == 30.0
    assert usage.run_time_s == 670.0
    trainer, ps = usage.roles
    assert (trainer.role, trainer.replicas, trainer.node_seconds) == ("trainer", 2, 2 * (60 + 600))
    assert (ps.role, ps.replicas, ps.node_seconds) == ("ps", 1, 660)
    assert trainer.vcpu_hours == pytest.approx(2 * 1320 / 3600)
    assert trainer.memory_gb_hours == pytest.approx(1 * 1320 / 3600)
    assert usage.gpu_hours == 0.0
    assert len(usage.attempts) == 6
    first = usage.attempts[0]
    assert (first.role, first.replica, first.number, first.exit_code) == ("trainer", 0, 1, 1)
    assert first.reason == "Host EC2 (instance i-1) terminated."
    assert [(a.role, a.replica, a.number, a.exit_code) for a in usage.attempts[3:]] == [
        ("trainer", 0, 2, 0),
        ("trainer", 1, 2, 0),
        ("ps", 0, 2, 0),
    ]


def test_multi_node_job_without_child_jobs_takes_the_jobs_run() -> None:
    """moto describes no child jobs: every node ran while the job ran."""
    job = mnp_job(status="FAILED", startedAt=T0 + 5_000, stoppedAt=T0 + 65_000, statusReason="Essential exited")
    roles = describe_response("q1:app-1", job, {}, "us-west-2").roles
    usage = batch_usage(job, {}, roles)
    assert usage.queue_wait_s == 5.0 and usage.run_time_s == 60.0
    assert [r.node_seconds for r in usage.roles] == [120.0, 60.0]
    assert [(a.role, a.replica) for a in usage.attempts] == [("trainer", 0), ("trainer", 1), ("ps", 0)]


def test_single_node_container_job() -> None:
    """A ``container`` job (no ``nodeProperties``): one replica, the job's attempts, its
    container's GPUs."""
    job = {
        "jobId": "c1",
        "jobName": "train-1",
        "status": "SUCCEEDED",
        "createdAt": T0,
        "startedAt": T0 + 120_000,
        "stoppedAt": T0 + 3_720_000,
        "container": {
            "image": "img",
            "command": ["python", "train.py"],
            "environment": [{"name": "TORCHX_ROLE_NAME", "value": "train"}],
            "resourceRequirements": [
                {"type": "VCPU", "value": "8"},
                {"type": "MEMORY", "value": "61440"},
                {"type": "GPU", "value": "1"},
            ],
            "exitCode": 0,
        },
        "attempts": [attempt(120, 3720, 0)],
    }
    roles = describe_response("q1:train-1", job, {}, "us-west-2").roles
    assert [(r.name, r.resource.cpu, r.resource.gpu, r.resource.memMB) for r in roles] == [("train", 8, 1, 61440)]
    usage = batch_usage(job, {}, roles)
    assert usage.queue_wait_s == 120.0 and usage.run_time_s == 3600.0
    (role,) = usage.roles
    assert (role.vcpu_hours, role.gpu_hours, role.memory_gb_hours) == (8.0, 1.0, 60.0)
    assert [(a.role, a.replica, a.exit_code) for a in usage.attempts] == [("train", 0, 0)]


def test_describe_carries_usage_once_the_job_ended() -> None:
    batch = FakeBatch()
    job, nodes = ended_mnp_job()
    batch.jobs["j1"] = job
    batch.jobs.update({f"j1#{n}": c for n, c in nodes.items()})
    running = mnp_job(job_id="j2", name="app-2", status="RUNNING", startedAt=T0 + 30_000)
    batch.jobs["j2"] = running
    sched = create_scheduler("s", client=batch, log_client=FakeLogs())
    sched.poller.min_interval = 0.01
    desc = sched.describe("q1:app-1")
    assert desc is not None and desc.state == AppState.SUCCEEDED
    assert desc.usage is not None and desc.usage.node_seconds == 3 * 660
    running_desc = sched.describe("q1:app-2")
    assert running_desc is not None and running_desc.usage is None


def test_last_attempt_without_an_exit_code_takes_the_jobs() -> None:
    """moto's attempts carry no exit code; the job's ``container.exitCode`` is the last run's."""
    job = mnp_job(status="FAILED", startedAt=T0 + 1_000, stoppedAt=T0 + 2_000, roles=(("main", 1),))
    job["attempts"] = [
        {"startedAt": T0 + 1_000, "stoppedAt": T0 + 1_500, "container": {"exitCode": 1}},
        {"startedAt": T0 + 1_600, "stoppedAt": T0 + 2_000, "container": {}},
    ]
    job["container"] = {"exitCode": 3}
    usage = batch_usage(job, {}, describe_response("q1:app-1", job, {}, "us-west-2").roles)
    assert [(a.number, a.exit_code) for a in usage.attempts] == [(1, 1), (2, 3)]
