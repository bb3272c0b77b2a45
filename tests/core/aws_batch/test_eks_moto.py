"""Batch on EKS against a moto server over HTTP (no Docker): an EKS job definition registers,
the job submits, and ``describe`` of the job moto returns maps onto replicas; the pods' output,
put into moto's CloudWatch Logs as Container Insights' Fluent Bit names and shapes it, is read
through the scheduler's log path.

What moto does not model, and where it is tested instead (``test_eks.py``, on entries built
from the API's documented fields): moto runs no pods, so its EKS jobs have no ``eksAttempts``,
pod or node names or exit codes; its ``DescribeComputeEnvironments`` leaves out
``containerOrchestrationType`` and ``eksConfiguration``, so a queue here never reads as EKS
(jobs are submitted with ``check_queue=False``, and the platform that follows the queue is
tested on described queues); it keeps no consumable resources. The pod-log tests therefore serve
the job's description from an in-memory Batch (entries built from the API's fields) and only
CloudWatch Logs from the moto server.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore import xform_name

from airflow_provider_torchx.core.schedulers.api import DescribeAppResponse, LogChunk
from airflow_provider_torchx.core.schedulers.aws_batch import AWSBatchScheduler, create_scheduler, render
from airflow_provider_torchx.core.specs import AppDef, AppState, Resource, Role
from tests.core.aws_batch.fakes import FakeBatch
from tests.core.aws_batch.test_eks import EksBatch, NoCalls, mnp_eks_job, single_eks_job
from tests.fixtures.aws import MotoServer, create_job_queue, moto_settings

pytestmark = pytest.mark.timeout(60)

EKS = {"platform": "EKS", "namespace": "training", "service_account": "trainer-sa", "check_queue": False}


@pytest.fixture(scope="module")
def queue(moto_without_docker: MotoServer) -> Iterator[str]:
    """A job queue of the moto server, its AWS settings exported for the module."""
    with moto_settings(moto_without_docker):
        yield create_job_queue(f"eks-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def sched(queue: str) -> AWSBatchScheduler:
    return create_scheduler("eks")


def ended(sched: AWSBatchScheduler, app_id: str) -> DescribeAppResponse:
    """The job's description once it ended (moto ends jobs within a second or two)."""
    deadline = time.monotonic() + 30
    while True:
        resp = sched.describe(app_id)
        assert resp is not None
        if resp.state.is_terminal() or time.monotonic() > deadline:
            return resp
        time.sleep(0.2)


def trainer(num_replicas: int) -> Role:
    return Role(
        "trainer",
        image="ghcr.io/me/train:1",
        entrypoint="python",
        args=["-m", "train", "--rank", "${replica_id}"],
        env={"FOO": "bar"},
        num_replicas=num_replicas,
        resource=Resource(cpu=8, gpu=4, memMB=65536),
    )


def test_a_single_node_eks_job_registers_submits_and_is_described(sched: AWSBatchScheduler, queue: str) -> None:
    cfg = {"queue": queue, **EKS, "consumable_resources": ["matlab:2"]}
    app_id = sched.submit(AppDef("fit", roles=[trainer(1)]), cfg)
    batch = boto3.client("batch")
    job = batch.describe_jobs(jobs=[sched.native_id(app_id)])["jobs"][0]
    definition = batch.describe_job_definitions(jobDefinitions=[job["jobDefinition"]])["jobDefinitions"][0]
    pod = definition["eksProperties"]["podProperties"]
    assert pod["serviceAccountName"] == "trainer-sa" and pod["metadata"]["namespace"] == "training"
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "4"
    resp = ended(sched, app_id)
    assert resp.state == AppState.SUCCEEDED  # moto ends a job without running its pod
    (role,) = resp.roles
    assert (role.name, role.image, role.resource.gpu, role.resource.memMB) == (
        "trainer",
        "ghcr.io/me/train:1",
        4,
        65536,
    )
    assert role.entrypoint == "python" and role.args == ["-m", "train", "--rank", "0"]
    (replica,) = resp.roles_statuses[0].replicas
    assert replica.state == AppState.SUCCEEDED


def test_a_multi_node_eks_job_registers_submits_and_maps_each_node_to_a_replica(
    sched: AWSBatchScheduler, queue: str
) -> None:
    app_id = sched.submit(AppDef("fit", roles=[trainer(2)]), {"queue": queue, **EKS})
    job = boto3.client("batch").describe_jobs(jobs=[sched.native_id(app_id)])["jobs"][0]
    (node_range,) = job["nodeProperties"]["nodeRangeProperties"]
    assert node_range["targetNodes"] == "0:1" and "eksProperties" in node_range
    resp = ended(sched, app_id)
    assert [r.name for r in resp.roles] == ["trainer"] and resp.roles[0].num_replicas == 2
    assert [(r.id, r.state) for r in resp.roles_statuses[0].replicas] == [(0, resp.state), (1, resp.state)]
    native = sched.describe_native(app_id)
    assert native is not None and "eksProperties" in native.request.format()


# --------------------------------------------------------------------------- pod logs
# moto runs no pods and has no Fluent Bit: the job's description is built from the API's
# documented fields (``test_eks.single_eks_job``, ``mnp_eks_job``) and served by an in-memory
# Batch; the pods' output is put into moto's CloudWatch Logs, over HTTP, under the names and in
# the JSON records of Container Insights' Fluent Bit, and read through the scheduler's log path.

CONTAINER_ID = "5e7d" * 16


@pytest.fixture(autouse=True)
def fast_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """CloudWatch calls at 50 a second for these tests' own budgets (default 5)."""
    monkeypatch.setenv("AIRFLOW_TORCHX_CLOUDWATCH_RPS", "50")


def pod_stream(node: str, pod: str, container: str = "main", namespace: str = "training") -> str:
    """Container Insights' Fluent Bit stream name of a pod's container (``eks_logs``)."""
    return f"{node}-application.var.log.containers.{pod}_{namespace}_{container}-{CONTAINER_ID}.log"


def put_records(logs: Any, group: str, stream: str, lines: list[str]) -> None:
    """``lines`` as Fluent Bit's JSON records (a line starting with ``!`` as it is: not JSON),
    stamped now (CloudWatch drops events over 14 days old)."""
    start_ms = int(time.time() * 1000)
    with contextlib.suppress(logs.exceptions.ResourceAlreadyExistsException):
        logs.create_log_group(logGroupName=group)
    logs.create_log_stream(logGroupName=group, logStreamName=stream)
    events = [
        {
            "timestamp": start_ms + i,
            "message": text[1:] if text.startswith("!") else json.dumps({"log": text, "stream": "stdout"}),
        }
        for i, text in enumerate(lines)
    ]
    logs.put_log_events(logGroupName=group, logStreamName=stream, logEvents=events)


class CountingLogs:
    """The moto server's CloudWatch Logs ``client``, counting the calls made by name in
    ``calls`` (botocore's ``before-call`` event: a paginator's pages count too)."""

    def __init__(self) -> None:
        self.client = boto3.client("logs")
        self.calls: list[str] = []
        self.client.meta.events.register("before-call.cloudwatch-logs", self._count)

    def _count(self, model: Any, **_: Any) -> None:
        self.calls.append(xform_name(model.name))


def pod_scheduler(batch: FakeBatch, *jobs: dict[str, Any], logs: Any = None) -> AWSBatchScheduler:
    """A scheduler whose Batch is ``batch`` serving ``jobs`` and whose CloudWatch Logs is the
    moto server's (its own call budget: the credentials key is the fake's)."""
    for job in jobs:
        batch.jobs[job["jobId"]] = job
    client = logs if logs is not None else boto3.client("logs")
    return create_scheduler("eks-logs", client=batch, log_client=client, docker_client=NoCalls())


def test_an_eks_jobs_log_is_its_pods_container_insights_streams_attempt_by_attempt(queue: str) -> None:
    job = single_eks_job()  # two attempts, on two nodes of cluster "ml"
    group = f"/aws/containerinsights/ml-{uuid.uuid4().hex[:6]}/application"
    for attempt in job["eksAttempts"]:
        attempt["eksClusterArn"] = f"arn:aws:eks:us-east-1:123456789012:cluster/{group.split('/')[3]}"
    logs = boto3.client("logs")
    put_records(logs, group, pod_stream("ip-10-0-0-1.ec2.internal", "aws-batch.abc-1"), ["loading\n", "OOM soon"])
    put_records(
        logs, group, pod_stream("ip-10-0-0-2.ec2.internal", "aws-batch.abc-2"), ["resumed\n", "!plain", "bye\n"]
    )
    # another container of the same pod, and another pod on the node: never read
    put_records(logs, group, pod_stream("ip-10-0-0-2.ec2.internal", "aws-batch.abc-2", "sidecar"), ["noise\n"])
    put_records(logs, group, pod_stream("ip-10-0-0-2.ec2.internal", "aws-batch.abc-20"), ["other pod\n"])
    counting = CountingLogs()
    sched = pod_scheduler(FakeBatch(), job, logs=counting.client)
    app_id = f"gpu:{job['jobName']}"
    expected = ["loading\n", "OOM soon\n", "resumed\n", "plain\n", "bye\n"]
    assert list(sched.log_iter(app_id, "trainer", 0, should_tail=True)) == expected
    first = sched.read_log(app_id, "trainer", 0, max_lines=2)
    rest = sched.read_log(app_id, "trainer", 0, cursor=first.cursor)
    assert (first.lines, first.eof) == (expected[:2], False)
    assert (rest.lines, rest.eof) == (expected[2:], True)
    assert counting.calls.count("describe_log_streams") == 2  # each pod's stream looked up once, then kept


def test_a_multi_node_eks_jobs_replica_reads_its_own_nodes_pod(queue: str) -> None:
    job, nodes = mnp_eks_job()
    cluster = f"mnp-{uuid.uuid4().hex[:6]}"
    for child in nodes.values():
        for attempt in child["eksAttempts"]:
            attempt["eksClusterArn"] = f"arn:aws:eks:us-east-1:123456789012:cluster/{cluster}"
    group = f"/aws/containerinsights/{cluster}/application"
    logs = boto3.client("logs")
    for n in (0, 1):
        put_records(logs, group, pod_stream(f"ip-10-0-1-{n}.ec2.internal", f"aws-batch.m-{n}"), [f"node {n}\n"])
    sched = pod_scheduler(FakeBatch(), job, *nodes.values())
    app_id = f"gpu:{job['jobName']}"
    assert list(sched.log_iter(app_id, "trainer", 1)) == ["node 1\n"]
    assert list(sched.log_iter(app_id, "trainer", 0)) == ["node 0\n"]


def next_lines(sched: AWSBatchScheduler, app_id: str, cursor: str) -> LogChunk:
    """The next read of a running job's log that returns lines: a read of a running job takes
    only the calls its CloudWatch budget has now, so one may return none and lag (nothing is
    lost)."""
    deadline = time.monotonic() + 10
    while True:
        chunk = sched.read_log(app_id, "trainer", 0, cursor=cursor)
        if chunk.lines or time.monotonic() > deadline:
            return chunk
        cursor = chunk.cursor
        time.sleep(0.2)


def test_a_running_pods_log_group_comes_from_the_run_option_or_the_queues_cluster(queue: str) -> None:
    """The first attempt of a running job names no cluster yet: the log group is the run
    option's (the job's tag), else that of the queue's EKS cluster; the pod's stream appears
    when Fluent Bit ships its first lines, and the log grows while the pod runs."""
    cluster = f"live-{uuid.uuid4().hex[:6]}"
    batch = EksBatch()
    batch.cluster = f"arn:aws:eks:us-east-1:123456789012:cluster/{cluster}"
    running = single_eks_job("RUNNING")
    running.update(eksAttempts=[], jobQueue=f"arn:aws:batch:us-west-2:1:job-queue/{batch.queue}")
    tagged = {**running, "jobId": "tagged", "jobName": running["jobName"] + "-t"}
    tagged["tags"] = {**running["tags"], render.TAG_EKS_LOG_GROUP: f"/custom/{cluster}"}
    sched = pod_scheduler(batch, running, tagged)
    logs = boto3.client("logs")
    stream = pod_stream("ip-10-0-0-2.ec2.internal", "aws-batch.abc-2")
    for app_id, group in (
        (f"{batch.queue}:{running['jobName']}", f"/aws/containerinsights/{cluster}/application"),
        (f"{batch.queue}:{tagged['jobName']}", f"/custom/{cluster}"),
    ):
        logs.create_log_group(logGroupName=group)
        before = sched.read_log(app_id, "trainer", 0)
        assert (before.lines, before.eof) == ([], False)  # not shipped yet
        put_records(logs, group, stream, ["step 1\n"])
        now = next_lines(sched, app_id, before.cursor)
        assert (now.lines, now.eof) == (["step 1\n"], False)
        logs.put_log_events(
            logGroupName=group,
            logStreamName=stream,
            logEvents=[{"timestamp": int(time.time() * 1000) + 5, "message": json.dumps({"log": "step 2\n"})}],
        )
        assert next_lines(sched, app_id, now.cursor).lines == ["step 2\n"]


def test_a_finished_job_whose_log_group_does_not_exist_reads_no_lines_and_says_so(
    queue: str, caplog: pytest.LogCaptureFixture
) -> None:
    job = single_eks_job()
    cluster = f"no-fluent-bit-{uuid.uuid4().hex[:6]}"
    for attempt in job["eksAttempts"]:
        attempt["eksClusterArn"] = f"arn:aws:eks:us-east-1:123456789012:cluster/{cluster}"
    sched = pod_scheduler(FakeBatch(), job)
    with caplog.at_level(logging.WARNING):
        assert list(sched.log_iter(f"gpu:{job['jobName']}", "trainer", 0, should_tail=True)) == []
    said = [r.getMessage() for r in caplog.records if "does not exist" in r.getMessage()]
    assert said == [
        f"CloudWatch log group /aws/containerinsights/{cluster}/application does not exist (yet): no pod output to read"
    ]
