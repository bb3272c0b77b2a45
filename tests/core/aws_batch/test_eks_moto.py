"""Batch on EKS against a moto server over HTTP (no Docker): an EKS job definition registers,
the job submits, and ``describe`` of the job moto returns maps onto replicas.

What moto does not model, and where it is tested instead (``test_eks.py``, on entries built
from the API's documented fields): moto runs no pods, so its EKS jobs have no ``eksAttempts``,
pod or node names or exit codes; its ``DescribeComputeEnvironments`` leaves out
``containerOrchestrationType`` and ``eksConfiguration``, so a queue here never reads as EKS
(jobs are submitted with ``check_queue=False``, and the platform that follows the queue is
tested on described queues); it keeps no consumable resources.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import boto3
import pytest

from airflow_provider_torchx.core.schedulers.api import DescribeAppResponse
from airflow_provider_torchx.core.schedulers.aws_batch import AWSBatchScheduler, create_scheduler
from airflow_provider_torchx.core.specs import AppDef, AppState, Resource, Role
from tests.fixtures.aws import FAKE_CREDS, REGION, MotoServer, create_job_queue

pytestmark = pytest.mark.timeout(60)

EKS = {"platform": "EKS", "namespace": "training", "service_account": "trainer-sa", "check_queue": False}


@pytest.fixture(scope="module")
def queue(moto_without_docker: MotoServer) -> Iterator[str]:
    """A job queue of the moto server, its AWS settings exported for the module."""
    with pytest.MonkeyPatch.context() as mp:
        for key, value in {**FAKE_CREDS, "AWS_DEFAULT_REGION": REGION}.items():
            mp.setenv(key, value)
        mp.setenv("AWS_ENDPOINT_URL", moto_without_docker.url)
        for key in ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
            mp.delenv(key, raising=False)
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
