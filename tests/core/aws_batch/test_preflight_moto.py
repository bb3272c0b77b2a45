"""The queue preflight against a moto server over HTTP (no Docker: its Batch jobs never run):
MANAGED compute environments made here, every AWS call counted with botocore's ``before-call``
event on the scheduler's session. Nothing is registered or submitted for a job the queue
cannot run; a second submission to a queue reuses the process's descriptions; ``check_queue``
False and a dry run make no describe call.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import botocore.session
import pytest

from airflow_provider_torchx.core import cli
from airflow_provider_torchx.core.errors import JobWontFitError
from airflow_provider_torchx.core.schedulers.aws_batch import AWSBatchScheduler, create_scheduler
from airflow_provider_torchx.core.specs import AppDef, Resource, Role
from tests.fixtures.aws import REGION, MotoServer, add_job_queue, moto_settings

pytestmark = pytest.mark.timeout(60)

DESCRIBES = {"DescribeJobQueues", "DescribeComputeEnvironments", "DescribeInstanceTypes"}
WRITES = {"RegisterJobDefinition", "SubmitJob"}


@pytest.fixture(scope="module")
def moto_env(moto_without_docker: MotoServer) -> Iterator[dict[str, str]]:
    """The network, roles and instance profile a MANAGED compute environment needs; the AWS
    settings of the moto server exported for the module."""
    with moto_settings(moto_without_docker):
        ec2, iam = boto3.client("ec2"), boto3.client("iam")
        vpc = ec2.create_vpc(CidrBlock="10.7.0.0/16")["Vpc"]["VpcId"]
        tag = uuid.uuid4().hex[:8]
        yield {
            "subnet": ec2.create_subnet(VpcId=vpc, CidrBlock="10.7.0.0/24")["Subnet"]["SubnetId"],
            "group": ec2.create_security_group(GroupName=f"preflight-{tag}", Description="t", VpcId=vpc)["GroupId"],
            "role": iam.create_role(RoleName=f"preflight-{tag}", AssumeRolePolicyDocument="{}")["Role"]["Arn"],
            "profile": iam.create_instance_profile(InstanceProfileName=f"preflight-{tag}")["InstanceProfile"]["Arn"],
        }


def managed_queue(env: dict[str, str], max_vcpus: int, instance_types: list[str]) -> tuple[str, str]:
    """A new queue on one MANAGED EC2 compute environment of its own: ``(queue, environment)``."""
    name = f"preflight-{uuid.uuid4().hex[:8]}"
    batch = boto3.client("batch")
    arn = batch.create_compute_environment(
        computeEnvironmentName=f"{name}-ce",
        type="MANAGED",
        state="ENABLED",
        serviceRole=env["role"],
        computeResources={
            "type": "EC2",
            "minvCpus": 0,
            "maxvCpus": max_vcpus,
            "instanceTypes": instance_types,
            "subnets": [env["subnet"]],
            "securityGroupIds": [env["group"]],
            "instanceRole": env["profile"],
        },
    )["computeEnvironmentArn"]
    return add_job_queue(batch, name, arn), f"{name}-ce"


class Counted:
    """A scheduler whose every AWS call (Batch, EC2, CloudWatch Logs) is appended to ``calls``:
    its session's botocore ``before-call`` event, which every client of the session inherits."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        core = botocore.session.Session()
        core.register("before-call", self._called)
        session = boto3.Session(botocore_session=core, region_name=REGION)
        self.sched: AWSBatchScheduler = create_scheduler("preflight", session=session, session_key="preflight-test")

    def _called(self, model: Any, **_: Any) -> None:
        self.calls.append(model.name)

    def take(self) -> list[str]:
        """The calls made since the last ``take``."""
        out, self.calls = self.calls, []
        return out


def app(cpu: int = 1, gpu: int = 0, mem: int = 1024) -> AppDef:
    return AppDef("fit", roles=[Role("main", image="busybox", entrypoint="true", resource=Resource(cpu, gpu, mem))])


def test_a_job_over_max_vcpus_is_refused_before_anything_is_registered(moto_env: dict[str, str]) -> None:
    queue, env = managed_queue(moto_env, max_vcpus=4, instance_types=["m5"])
    counted = Counted()
    with pytest.raises(JobWontFitError) as err:
        counted.sched.submit(app(cpu=8), {"queue": queue})
    assert (
        f"queue {queue!r} cannot run this job: compute environment {env!r}: the job needs 8 vCPUs, over its maxvCpus 4"
        in str(err.value)
    )
    calls = counted.take()
    assert {"DescribeJobQueues", "DescribeComputeEnvironments"} <= set(calls) and not WRITES & set(calls), calls


def test_a_gpu_job_is_refused_by_instance_types_without_gpus_naming_them(moto_env: dict[str, str]) -> None:
    queue, env = managed_queue(moto_env, max_vcpus=256, instance_types=["m5.large", "c5"])
    counted = Counted()
    with pytest.raises(JobWontFitError) as err:
        counted.sched.submit(app(gpu=1), {"queue": queue})
    assert (
        f"compute environment {env!r}: the job needs 1 GPU per node, more than any of its instance types "
        "(m5.large, c5) has: at most 0 GPUs" in str(err.value)
    )
    calls = counted.take()
    assert "DescribeInstanceTypes" in calls and not WRITES & set(calls), calls


def test_a_gpu_job_fits_a_gpu_family(moto_env: dict[str, str]) -> None:
    queue, _ = managed_queue(moto_env, max_vcpus=256, instance_types=["m5", "g5"])
    counted = Counted()
    counted.sched.submit(app(cpu=8, gpu=4, mem=60000), {"queue": queue})  # g5.12xlarge: 48 vCPUs, 4 GPUs, 192 GiB
    assert counted.take()[-2:] == ["RegisterJobDefinition", "SubmitJob"]


def test_a_second_submission_to_the_queue_costs_no_describe_call(moto_env: dict[str, str]) -> None:
    queue, _ = managed_queue(moto_env, max_vcpus=16, instance_types=["optimal"])
    first, second = Counted(), Counted()  # two schedulers of one process, as two tasks' would be
    first.sched.submit(app(), {"queue": queue})
    assert set(first.take()) >= DESCRIBES
    second.sched.submit(app(), {"queue": queue})
    with pytest.raises(JobWontFitError, match="maxvCpus 16"):
        second.sched.submit(app(cpu=32), {"queue": queue})
    assert second.take() == ["RegisterJobDefinition", "SubmitJob"]


def test_check_queue_false_submits_without_describing(moto_env: dict[str, str]) -> None:
    queue, _ = managed_queue(moto_env, max_vcpus=4, instance_types=["m5"])
    counted = Counted()
    counted.sched.submit(app(cpu=8), {"queue": queue, "check_queue": False})
    assert counted.take() == ["RegisterJobDefinition", "SubmitJob"]


def test_a_dry_run_makes_no_aws_call(moto_env: dict[str, str]) -> None:
    queue, _ = managed_queue(moto_env, max_vcpus=4, instance_types=["m5"])
    counted = Counted()
    info = counted.sched.submit_dryrun(app(cpu=8), {"queue": queue})
    assert info.request.queue == queue and counted.take() == []


def test_the_cli_exits_2_with_one_line(moto_env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    queue, env = managed_queue(moto_env, max_vcpus=4, instance_types=["m5"])
    code = cli.main(["run", "-s", "aws_batch", "-cfg", f"queue={queue}", "utils.sh", "--cpu", "8", "true"])
    err = capsys.readouterr().err.strip()
    assert code == cli.EXIT_USAGE, err
    assert err.count("\n") == 0 and err.startswith("airflow-torchx: error: cfg: queue"), err
    assert f"compute environment {env!r}: the job needs 8 vCPUs, over its maxvCpus 4" in err


def test_the_connection_test_says_whether_the_queue_stops_a_job_blocked_runnable(moto_env: dict[str, str]) -> None:
    """moto keeps no ``jobStateTimeLimitActions``: the queue has none, and the Test says so."""
    queue, _ = managed_queue(moto_env, 64, ["m5"])
    said = Counted().sched.check_settings({"queue": queue})
    assert said.startswith(f"AWS Batch job queue {queue!r} is ENABLED")
    assert said.endswith(
        "; it has no jobStateTimeLimitActions: a job blocked RUNNABLE at its head waits until a task's "
        "start_timeout stops it"
    )
