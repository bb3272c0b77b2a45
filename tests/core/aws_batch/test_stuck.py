"""Why a Batch job has not started (``stuck.wait_reason``), on ``DescribeJobs`` entries and
queue descriptions shaped like AWS's: its state and reason, its dependencies, the queue's and
each compute environment's state and reason, and, where the preflight can tell, why it fits
none of them (a job submitted past the preflight, or a queue changed since)."""

from __future__ import annotations

from typing import Any

from airflow_provider_torchx.core.schedulers.aws_batch.preflight import QueueView
from airflow_provider_torchx.core.schedulers.aws_batch.stuck import wait_reason
from tests.core.aws_batch.test_preflight import TYPES

ARN = "arn:aws:batch:us-east-1:123456789012:compute-environment/"


def queue(*envs: str, state: str = "ENABLED", status: str = "VALID") -> dict[str, Any]:
    order = [{"order": n, "computeEnvironment": ARN + e} for n, e in enumerate(envs, start=1)]
    return {"jobQueueName": "q", "state": state, "status": status, "computeEnvironmentOrder": order}


def env(name: str, max_vcpus: int = 256, types: tuple[str, ...] = ("m5",), **fields: Any) -> dict[str, Any]:
    return {
        "computeEnvironmentName": name,
        "computeEnvironmentArn": ARN + name,
        "type": "MANAGED",
        "state": "ENABLED",
        "status": "VALID",
        "computeResources": {"type": "EC2", "maxvCpus": max_vcpus, "instanceTypes": list(types)},
        **fields,
    }


def job(vcpus: int = 1, gpus: int = 0, **fields: Any) -> dict[str, Any]:
    needs = [{"type": "VCPU", "value": str(vcpus)}, {"type": "MEMORY", "value": "2048"}]
    if gpus:
        needs.append({"type": "GPU", "value": str(gpus)})
    container = {"image": "busybox", "command": ["true"], "resourceRequirements": needs}
    return {"jobId": "j-1", "status": "RUNNABLE", "jobQueue": "q", "container": container, **fields}


def test_a_runnable_job_that_fits_gets_its_reason_and_the_queues_states() -> None:
    view = QueueView(queue("a"), (env("a"),), TYPES)
    text = wait_reason(job(statusReason="waiting for capacity"), view)
    assert text == (
        "Batch job RUNNABLE: waiting for capacity; queue 'q' ENABLED/VALID; compute environment 'a' ENABLED/VALID"
    )


def test_a_job_over_every_environments_limits_says_why_it_fits_none() -> None:
    view = QueueView(queue("a", "b"), (env("a", max_vcpus=4), env("b", types=("m5.large", "c5.large"))), TYPES)
    text = wait_reason(job(vcpus=8, gpus=1), view)
    assert "queue 'q' cannot run this job: compute environment 'a': the job needs 8 vCPUs, over its maxvCpus 4" in text
    assert "compute environment 'b': the job needs 1 GPU per node" in text and "check_queue" not in text


def test_an_invalid_environment_and_a_dependency_are_named_with_aws_reasons() -> None:
    broken = env("a", state="ENABLED", status="INVALID", statusReason="CLIENT_ERROR - no subnet")
    text = wait_reason(job(dependsOn=[{"jobId": "j-0"}]), QueueView(queue("a"), (broken,), TYPES))
    assert "it depends on j-0" in text
    assert "compute environment 'a' ENABLED/INVALID (CLIENT_ERROR - no subnet)" in text
    assert "compute environment 'a': it is INVALID (CLIENT_ERROR - no subnet)" in text


def test_a_gone_queue_is_said() -> None:
    assert wait_reason(job(), None) == "Batch job RUNNABLE; queue 'q' was not found"
