"""What a submit sends to AWS Batch, read back from a moto server (without Docker: its jobs
never run) over HTTP on loopback: the fields moto keeps, as AWS received them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from airflow_provider_torchx.core.errors import InvalidRunConfigError
from airflow_provider_torchx.core.schedulers.aws_batch import AWSBatchScheduler, create_scheduler
from airflow_provider_torchx.core.specs import AppDef, Resource, Role
from tests.fixtures.aws import FAKE_CREDS, REGION, MotoServer, create_job_queue

QUEUE = "submit-test-queue"


@pytest.fixture
def batch(moto_without_docker: MotoServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A Batch client of the moto server, whose environment the scheduler's clients use too;
    the job queue ``QUEUE`` exists."""
    for key, value in {**FAKE_CREDS, "AWS_DEFAULT_REGION": REGION, "AWS_ENDPOINT_URL": moto_without_docker.url}.items():
        monkeypatch.setenv(key, value)
    for key in ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(key, raising=False)
    client = boto3.client("batch")
    if not client.describe_job_queues(jobQueues=[QUEUE])["jobQueues"]:
        create_job_queue(QUEUE)
    yield client


@pytest.fixture
def sched(batch: Any) -> Iterator[AWSBatchScheduler]:
    s = create_scheduler("submit-test")
    yield s
    s.close()


def app(replicas: int) -> AppDef:
    role = Role(
        "r", image="busybox", entrypoint="sleep", args=["600"], num_replicas=replicas, resource=Resource(1, 0, 64)
    )
    return AppDef("timed", roles=[role])


@pytest.mark.parametrize("replicas", [1, 2], ids=["single-node", "multi-node"])
def test_the_submitted_job_carries_the_attempt_timeout(batch: Any, sched: AWSBatchScheduler, replicas: int) -> None:
    app_id = sched.submit(app(replicas), {"queue": QUEUE, "attempt_timeout": 90})
    job_id = sched.poller.job_id(app_id)
    assert job_id, f"no job id remembered for {app_id}"
    (job,) = batch.describe_jobs(jobs=[job_id])["jobs"]
    assert job["timeout"] == {"attemptDurationSeconds": 90}


def test_an_attempt_timeout_under_60_submits_nothing(batch: Any, sched: AWSBatchScheduler) -> None:
    def held() -> tuple[set[str], set[str]]:
        """Every job (moto's DescribeJobs without ids lists them all) and job definition."""
        jobs = {j["jobId"] for j in batch.describe_jobs(jobs=[])["jobs"]}
        return jobs, {d["jobDefinitionArn"] for d in batch.describe_job_definitions()["jobDefinitions"]}

    before = held()
    with pytest.raises(InvalidRunConfigError, match="attempt_timeout=30 is below its minimum: it must be an int >= 60"):
        sched.submit(app(1), {"queue": QUEUE, "attempt_timeout": 30})
    assert held() == before
