"""``start_timeout`` on AWS Batch against the moto server over HTTP (the Docker-backed one:
moto keeps a job PENDING while it depends on a job that never finishes): the guard trips in
the worker's wait and in the trigger, the job is terminated, and the message gives AWS's
account (the job's state, its dependency, the queue's and its compute environment's states).
Why a job does not fit a managed environment: ``tests/core/aws_batch/test_stuck.py``."""

from __future__ import annotations

import logging
import time

import boto3
import pytest

from airflow_provider_torchx.core.guards import Guards
from airflow_provider_torchx.core.runner import Runner, get_runner
from airflow_provider_torchx.core.schedulers.aws_batch import create_scheduler
from airflow_provider_torchx.core.specs import AppDef, AppState, Resource, Role
from airflow_provider_torchx.outcome import End
from airflow_provider_torchx.triggers.torchx import TorchXJobTrigger
from airflow_provider_torchx.watch import TaskWatcher
from tests.airflow.helpers import run_deferred, wait_until

pytestmark = [pytest.mark.timeout(90), pytest.mark.docker]


def submit_pending(queue: str, cpu: int = 1) -> tuple[str, str]:
    """A job of ``cpu`` vCPUs on ``queue`` that depends on a job id that never finishes (moto
    keeps it PENDING), submitted past the preflight: ``(handle, job id)``."""
    batch = boto3.client("batch")
    sched = create_scheduler("torchx", client=batch)
    role = Role("main", image="busybox:local", entrypoint="true", resource=Resource(cpu, 0, 512))
    app = AppDef("stuck", roles=[role])
    job = sched.submit_dryrun(app, {"queue": queue}).request
    arn = batch.register_job_definition(**job.job_def)["jobDefinitionArn"]
    never = [{"jobId": "never-finishes"}]
    job_id = batch.submit_job(jobDefinition=arn, dependsOn=never, **job.submit_request())["jobId"]
    return f"aws_batch://torchx/{queue}:{job.name}", job_id


def terminated(job_id: str) -> dict[str, str]:
    """The job once AWS ended it (a terminated job ends FAILED, with the reason given)."""
    batch = boto3.client("batch")

    def ended() -> dict[str, str] | None:
        job = batch.describe_jobs(jobs=[job_id])["jobs"][0]
        return job if job["status"] in ("FAILED", "SUCCEEDED") else None

    return wait_until(ended, timeout=30, what=f"{job_id} to end")


def test_a_batch_job_pending_on_a_dependency_trips_start_timeout_in_the_worker_and_is_terminated(
    aws_env: str, batch_queue: str
) -> None:
    handle, job_id = submit_pending(batch_queue)
    runner: Runner = get_runner()
    watcher = TaskWatcher(
        runner, handle, logging.getLogger("test"), stream_logs=False, guards=Guards(start_timeout=2.0)
    )
    began = time.time()
    outcome = watcher.wait_for_outcome(0.5, None, began)
    assert outcome.end is End.GUARDRAIL and outcome.guard == "start_timeout", outcome
    message = str(outcome.message)
    assert message.startswith(f"start_timeout=2s: TorchX job {handle} did not start within 2s of its submission")
    assert "it depends on never-finishes" in message, message
    assert f"queue {batch_queue!r} ENABLED/VALID" in message
    assert f"compute environment '{batch_queue}-ce' ENABLED/VALID" in message, message
    job = terminated(job_id)
    assert job["status"] == "FAILED" and "guardrail start_timeout=2 tripped" in job["statusReason"], job
    status = runner.status(handle)
    assert status is not None and status.state in (AppState.CANCELLED, AppState.FAILED)


def test_a_batch_job_pending_on_a_dependency_trips_start_timeout_in_the_trigger(aws_env: str, batch_queue: str) -> None:
    handle, job_id = submit_pending(batch_queue)
    (event,) = run_deferred(TorchXJobTrigger(handle, poll_interval=0.5, stream_logs=False, start_timeout=1.5))
    assert event["status"] == "guardrail" and event["guard"] == "start_timeout", event
    assert "it depends on never-finishes" in event["message"], event
    assert terminated(job_id)["status"] == "FAILED"
