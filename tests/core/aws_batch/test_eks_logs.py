"""Reading EKS jobs' logs, without AWS: Container Insights' stream names from a pod's node,
name, namespace and container; Fluent Bit's JSON records unwrapped to lines; which log group a
job's pods write to (run option, attempt's cluster, queue's cluster); which pods' streams a
reader may read, in order, and when the log is over; the run option ``eks_log_group``; and a
job whose log group nobody knows reads no lines, says so once and never hangs.

The stream and record formats are those of Container Insights' Fluent Bit set-up (AWS's
``fluent-bit.yaml``: ``log_stream_prefix ${HOST_NAME}-``, tail tag ``application.*`` on
``/var/log/containers/*.log``; Fluent Bit's ``cloudwatch_logs`` sends the whole record as JSON
unless ``log_key`` is set). The moto-server read of such streams is in ``test_eks_moto.py``.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from airflow_provider_torchx.core.errors import InvalidRunConfigError
from airflow_provider_torchx.core.schedulers.aws_batch import create_scheduler, eks_logs, render
from airflow_provider_torchx.core.schedulers.aws_batch.eks_logs import SHIP_GRACE, PodRef
from airflow_provider_torchx.core.schedulers.aws_batch.logs import LogBudget, list_streams
from airflow_provider_torchx.core.specs import AppDef
from airflow_provider_torchx.operators import checks
from tests.core.aws_batch.fakes import FakeBatch, paginator
from tests.core.aws_batch.test_eks import CLUSTER, EKS, NoCalls, dryrun, role, single_eks_job
from tests.fixtures.clock import FakeClock

NODE = "ip-10-0-0-2.ec2.internal"
CONTAINER_ID = "3f1a" * 16
REF = PodRef("aws-batch.abc-2", NODE, "training", "main", None)


def test_a_pods_stream_name_is_container_insights_fluent_bit_name() -> None:
    prefix = eks_logs.stream_prefix(REF)
    assert prefix == f"{NODE}-application.var.log.containers.aws-batch.abc-2_training_main-"
    assert eks_logs.matches(REF, f"{prefix}{CONTAINER_ID}.log")


@pytest.mark.parametrize(
    ("namespace", "name", "expected"),
    [
        pytest.param("training", f"aws-batch.abc-2_training_main-{CONTAINER_ID}.log", True, id="exact"),
        pytest.param("training", f"aws-batch.abc-2_training_sidecar-{CONTAINER_ID}.log", False, id="other-container"),
        pytest.param("training", f"aws-batch.abc-2_training_main-{CONTAINER_ID}.txt", False, id="not-a-log-file"),
        pytest.param("training", f"aws-batch.abc-20_training_main-{CONTAINER_ID}.log", False, id="other-pod"),
        pytest.param(None, f"aws-batch.abc-2_ml_main-{CONTAINER_ID}.log", True, id="namespace-unknown"),
        pytest.param(None, f"aws-batch.abc-2_ml_sidecar-{CONTAINER_ID}.log", False, id="ns-unknown-other-container"),
    ],
)
def test_only_the_pods_own_container_stream_matches(namespace: str | None, name: str, expected: bool) -> None:
    ref = PodRef("aws-batch.abc-2", NODE, namespace)
    assert eks_logs.matches(ref, f"{NODE}-application.var.log.containers.{name}") is expected


@pytest.mark.parametrize(
    ("message", "line"),
    [
        pytest.param('{"log":"epoch 1 loss 0.5\\n","stream":"stdout","time":"t"}', "epoch 1 loss 0.5\n", id="docker"),
        pytest.param('{"log":"Traceback","stream":"stderr","logtag":"F"}', "Traceback\n", id="cri-no-newline"),
        pytest.param('{"log":"{\\"a\\": 1}","log_processed":{"a":1}}', '{"a": 1}\n', id="json-app-line"),
        pytest.param("plain text", "plain text\n", id="not-json"),
        pytest.param('{"msg":"no log field"}', '{"msg":"no log field"}\n', id="json-without-log"),
        pytest.param('{"log": 3}', '{"log": 3}\n', id="log-not-a-string"),
        pytest.param("{broken", "{broken\n", id="broken-json"),
        pytest.param("", "\n", id="empty"),
    ],
)
def test_a_fluent_bit_record_reads_as_its_log_field(message: str, line: str) -> None:
    assert eks_logs.line({"message": message, "timestamp": 1}) == line


def test_a_jobs_pods_are_its_attempts_in_order_then_the_running_pod_once() -> None:
    ended = single_eks_job()  # two attempts; the job's pod is the second attempt's
    assert [(r.pod, r.node, r.namespace, r.container, r.stopped_at) for r in eks_logs.pods(ended)] == [
        ("aws-batch.abc-1", "ip-10-0-0-1.ec2.internal", "training", "main", 1100.0),
        ("aws-batch.abc-2", NODE, "training", "main", 1200.0),
    ]
    running = {**single_eks_job("RUNNING"), "eksAttempts": single_eks_job()["eksAttempts"][:1]}
    running["eksProperties"]["podProperties"]["podName"] = "aws-batch.abc-3"
    assert [(r.pod, r.stopped_at) for r in eks_logs.pods(running)] == [
        ("aws-batch.abc-1", 1100.0),
        ("aws-batch.abc-3", None),
    ]
    assert eks_logs.pods({**running, "eksAttempts": [], "eksProperties": {"podProperties": {}}}) == []


def test_the_log_group_is_the_run_options_else_the_attempts_cluster_else_none() -> None:
    job = single_eks_job()
    assert eks_logs.job_log_group(job["tags"], job) == "/aws/containerinsights/ml/application"
    tagged = {**job["tags"], render.TAG_EKS_LOG_GROUP: "/custom/pods"}
    assert eks_logs.job_log_group(tagged, job) == "/custom/pods"
    assert eks_logs.job_log_group(job["tags"], {**job, "eksAttempts": []}) is None


def test_a_queues_log_group_is_its_single_eks_clusters() -> None:
    env = {"computeEnvironmentName": "a", "eksConfiguration": {"eksClusterArn": CLUSTER}}
    other = {"computeEnvironmentName": "b", "eksConfiguration": {"eksClusterArn": CLUSTER.replace("/ml", "/cv")}}
    assert eks_logs.queue_log_group(eks_logs.queue_clusters([env, env])) == (
        "/aws/containerinsights/ml/application",
        "",
    )
    assert eks_logs.queue_log_group(eks_logs.queue_clusters([{"computeEnvironmentName": "ecs"}])) == (
        None,
        "its queue's compute environments name no EKS cluster",
    )
    assert eks_logs.queue_log_group(eks_logs.queue_clusters([env, other])) == (
        None,
        "its queue's compute environments are on several EKS clusters (cv, ml)",
    )


NOW = 10_000.0
OLD = PodRef("p1", "n1", "ns", stopped_at=NOW - SHIP_GRACE)
RECENT = PodRef("p2", "n2", "ns", stopped_at=NOW - 1)
RUNNING = PodRef("p3", "n3", "ns")


@pytest.mark.parametrize(
    ("refs", "found", "expected"),
    [
        pytest.param([OLD, RUNNING], {"p1": ["s1"], "p3": ["s3"]}, (["s1", "s3"], True), id="all-found"),
        pytest.param([OLD, RUNNING], {"p1": [], "p3": ["s3"]}, (["s3"], True), id="old-pod-without-stream-passed"),
        pytest.param([RECENT, RUNNING], {"p2": [], "p3": ["s3"]}, ([], False), id="recent-pod-waited-for"),
        pytest.param([OLD, RUNNING], {"p1": ["s1"], "p3": []}, (["s1"], False), id="running-pod-not-shipped-yet"),
        pytest.param([OLD, RUNNING], {"p1": None, "p3": ["s3"]}, ([], False), id="budget-refused-stops-there"),
        pytest.param([OLD, RECENT], {"p1": ["s1"], "p2": ["s1", "s2"]}, (["s1", "s2"], True), id="each-stream-once"),
        pytest.param([], {}, ([], True), id="no-pod-yet"),
    ],
)
def test_which_streams_a_reader_reads_and_whether_all_pods_are_accounted_for(
    refs: list[PodRef], found: dict[str, list[str] | None], expected: tuple[list[str], bool]
) -> None:
    asked: list[str] = []

    def lookup(ref: PodRef) -> list[str] | None:
        asked.append(ref.pod)
        return found[ref.pod]

    assert eks_logs.streams_in_order(refs, lookup, NOW) == expected
    stop = next((i for i, r in enumerate(refs) if found[r.pod] is None), len(refs) - 1)
    assert len(asked) <= stop + 1  # nothing is looked up past a refused look-up


def test_eks_log_group_is_an_eks_run_option_kept_in_the_jobs_tags() -> None:
    job = dryrun(AppDef("fit", roles=[role(num_replicas=1)]), {"eks_log_group": "/custom/pods"})
    assert job.on_eks
    assert job.submit_request()["tags"][render.TAG_EKS_LOG_GROUP] == "/custom/pods"
    assert render.TAG_EKS_LOG_GROUP not in dryrun(AppDef("fit", roles=[role(num_replicas=1)]), EKS).job_def["tags"]


@pytest.mark.parametrize(
    ("cfg", "match"),
    [
        ({"eks_log_group": "/aws/ci/#1"}, r"eks_log_group='/aws/ci/#1' is not a log group name"),
        ({"eks_log_group": "x" * 257}, r"eks_log_group='x+' is not a log group name"),
        ({"eks_log_group": "/g", "platform": "EC2"}, r"eks_log_group='/g' applies only with platform=EKS"),
    ],
)
def test_a_bad_eks_log_group_is_refused_naming_the_value(cfg: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidRunConfigError, match=match):
        dryrun(AppDef("fit", roles=[role(num_replicas=1)]), cfg)


def test_a_literal_bad_eks_log_group_fails_when_the_dag_is_parsed() -> None:
    with pytest.raises(InvalidRunConfigError, match=r"eks_log_group='a#b'"):
        checks.check_cfg("aws_batch", {"queue": "q", "eks_log_group": "a#b"})


def test_without_a_known_log_group_an_eks_job_reads_no_lines_says_why_once_and_never_hangs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    batch = FakeBatch()  # queue q1: an ECS environment, so no cluster to derive a group from
    job = {**single_eks_job(), "jobQueue": "arn:aws:batch:us-west-2:1:job-queue/q1"}
    for attempt in job["eksAttempts"]:
        del attempt["eksClusterArn"]
    batch.jobs[job["jobId"]] = job
    sched = create_scheduler("s", client=batch, log_client=NoCalls(), docker_client=NoCalls())
    app_id = f"q1:{job['jobName']}"
    with caplog.at_level(logging.WARNING):
        assert list(sched.log_iter(app_id, "trainer", 0, should_tail=True)) == []
        chunk = sched.read_log(app_id, "trainer", 0)
    assert chunk.lines == [] and chunk.eof
    said = [r.getMessage() for r in caplog.records if "no log lines for EKS job" in r.getMessage()]
    assert len(said) == 1, said
    assert app_id in said[0] and "its queue's compute environments name no EKS cluster" in said[0]
    assert "eks_log_group=/aws/containerinsights/CLUSTER/application" in said[0]


class PagedStreams:
    """A CloudWatch Logs stand-in whose DescribeLogStreams answers in pages of one stream."""

    def __init__(self, streams: list[dict[str, Any]]) -> None:
        self.streams = streams
        self.calls: list[dict[str, Any]] = []

    def describe_log_streams(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(kwargs)
        at = int(kwargs.get("nextToken") or 0)
        match = [s for s in self.streams if s["logStreamName"].startswith(kwargs["logStreamNamePrefix"])]
        page: dict[str, Any] = {"logStreams": match[at : at + 1]}
        if at + 1 < len(match):
            page["nextToken"] = str(at + 1)
        return page

    def get_paginator(self, name: str) -> Any:
        return paginator(self, "logs", name)


def test_a_pods_streams_are_listed_page_by_page_oldest_first_within_the_budget() -> None:
    client = PagedStreams(
        [
            {"logStreamName": "n-application.var.log.containers.p_ns_main-b.log", "creationTime": 20},
            {"logStreamName": "n-application.var.log.containers.p_ns_main-a.log", "creationTime": 10},
            {"logStreamName": "other", "creationTime": 5},
        ]
    )
    budget = LogBudget(rate=1.0, burst=2, clock=FakeClock(0.0).clock)
    prefix = "n-application.var.log.containers.p_ns_main-"
    assert list_streams(client, budget, "k", "/g", prefix, wait=False) == [
        "n-application.var.log.containers.p_ns_main-a.log",
        "n-application.var.log.containers.p_ns_main-b.log",
    ]
    assert [c.get("nextToken") for c in client.calls] == [None, "1"]
    assert list_streams(client, budget, "k", "/g", prefix, wait=False) is None  # the budget's 2 calls are spent
