"""The scheduler's AWS clients (``clients.py``): those it makes retry throttling and 5xx in
botocore; a client the caller injects is called as its maker configured it (nothing of ours
retries on top); every CloudWatch Logs attempt, retries included, counts against the log
budget. Against the moto server over HTTP behind a ``FlakyProxy``, whose requests follow one
pattern of four (forwarded, throttled, forwarded, 503): calls made one after another meet it
in order."""

from __future__ import annotations

import contextlib
import time
import uuid

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from airflow_provider_torchx.core.schedulers.aws_batch import create_scheduler
from airflow_provider_torchx.core.schedulers.aws_batch.clients import MAX_ATTEMPTS
from airflow_provider_torchx.core.schedulers.aws_batch.render import LOG_GROUP
from tests.core.aws_batch.fakes import FakeBatch, child_job, mnp_job
from tests.fixtures.aws import FlakyProxy

pytestmark = pytest.mark.timeout(120)


def test_the_clients_it_makes_retry_throttling_and_5xx(
    batch_queue: str, flaky_aws_endpoint: FlakyProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", flaky_aws_endpoint.url)
    sched = create_scheduler("made-clients")
    assert sched.client.meta.config.retries == {"mode": "standard", "total_max_attempts": MAX_ATTEMPTS}
    for _ in range(4):  # a call's requests: ok; throttled, ok; 503, ok; throttled, ok
        assert "ENABLED" in sched.check_settings({"queue": batch_queue})
    assert flaky_aws_endpoint.counts == {"forwarded": 4, "throttled": 2, "unavailable": 1}


def test_an_injected_client_keeps_its_makers_retries(batch_queue: str, flaky_aws_endpoint: FlakyProxy) -> None:
    no_retries = Config(retries={"mode": "standard", "total_max_attempts": 1})
    sched = create_scheduler(
        "injected", client=boto3.client("batch", endpoint_url=flaky_aws_endpoint.url, config=no_retries)
    )
    assert "ENABLED" in sched.check_settings({"queue": batch_queue})
    with pytest.raises(ClientError, match="TooManyRequestsException"):
        sched.check_settings({"queue": batch_queue})
    assert flaky_aws_endpoint.counts == {"forwarded": 1, "throttled": 1, "unavailable": 0}  # one request a call


def test_every_cloudwatch_attempt_retries_included_counts_against_the_log_budget(
    flaky_aws_endpoint: FlakyProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A finished three-node job's logs read through the scheduler's own Logs client: the
    budget counted as many calls as the endpoint saw requests, the retried ones included."""
    job_id = f"j{uuid.uuid4().hex[:8]}"
    moto = boto3.client("logs")
    with contextlib.suppress(moto.exceptions.ResourceAlreadyExistsException):
        moto.create_log_group(logGroupName=LOG_GROUP)
    now_ms = int(time.time() * 1000)  # CloudWatch (and moto) reject events older than 14 days
    batch = FakeBatch()
    batch.jobs[job_id] = mnp_job(job_id=job_id, status="SUCCEEDED")
    for node in range(3):
        batch.jobs[f"{job_id}#{node}"] = child = child_job(job_id, node, "SUCCEEDED", exit_code=0)
        stream = child["container"]["logStreamName"]
        moto.create_log_stream(logGroupName=LOG_GROUP, logStreamName=stream)
        moto.put_log_events(
            logGroupName=LOG_GROUP,
            logStreamName=stream,
            logEvents=[{"timestamp": now_ms + n, "message": f"node {node} line {n}"} for n in range(3)],
        )
    monkeypatch.setenv("AWS_ENDPOINT_URL", flaky_aws_endpoint.url)
    monkeypatch.setenv("AIRFLOW_TORCHX_CLOUDWATCH_RPS", "1000")
    sched = create_scheduler("budget", client=batch)  # Batch: the fake; CloudWatch Logs: made here
    sched.poller.min_interval = 0.01
    for role, k, node in (("trainer", 0, 0), ("trainer", 1, 1), ("ps", 0, 2)):
        assert list(sched.log_iter("q1:app-1", role, k)) == [f"node {node} line {n}\n" for n in range(3)]
    counts = flaky_aws_endpoint.counts
    assert counts["throttled"] >= 1 and counts["unavailable"] >= 1
    assert sched.aws.log_budget.calls == sum(counts.values())
