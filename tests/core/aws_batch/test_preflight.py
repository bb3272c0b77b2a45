"""The queue preflight's decision (``preflight.check``), one test per rule, on responses shaped
like real AWS (``DescribeJobQueues``, ``DescribeComputeEnvironments``,
``DescribeInstanceTypes``), with the job's needs read from the renderer's job definition; its
calls and per-process cache on fakes. The same path runs against moto in
``test_preflight_moto.py``.
"""

from __future__ import annotations

import fnmatch
import logging
import threading
from typing import Any

import pytest

from airflow_provider_torchx.core.errors import InvalidRunConfigError, JobWontFitError
from airflow_provider_torchx.core.schedulers.aws_batch import create_scheduler, preflight, render
from airflow_provider_torchx.core.schedulers.aws_batch.preflight import (
    JobNeeds,
    NodeNeeds,
    QueueCache,
    QueueView,
    allowed_types,
    check,
    instance_patterns,
    job_needs,
)
from airflow_provider_torchx.core.specs import AppDef, Resource, Role, named_resources
from tests.core.aws_batch.fakes import client_error, paginator
from tests.fixtures.clock import FakeClock

ARN = "arn:aws:batch:us-east-1:123456789012:compute-environment/"


def itype(name: str, vcpus: int, mib: int, gpus: int = 0) -> dict[str, Any]:
    """A ``DescribeInstanceTypes`` entry (the fields the check reads, as AWS nests them)."""
    out: dict[str, Any] = {
        "InstanceType": name,
        "CurrentGeneration": True,
        "VCpuInfo": {"DefaultVCpus": vcpus, "DefaultCores": max(1, vcpus // 2)},
        "MemoryInfo": {"SizeInMiB": mib},
    }
    if gpus:
        out["GpuInfo"] = {
            "Gpus": [{"Name": "A10G", "Manufacturer": "NVIDIA", "Count": gpus, "MemoryInfo": {"SizeInMiB": 24576}}],
            "TotalGpuMemoryInMiB": 24576 * gpus,
        }
    return out


TYPES = {
    t["InstanceType"]: t
    for t in (
        itype("m5.large", 2, 8192),
        itype("m5.24xlarge", 96, 393216),
        itype("c5.large", 2, 4096),
        itype("r5.24xlarge", 96, 786432),
        itype("r6i.32xlarge", 128, 1048576),
        itype("g5.xlarge", 4, 16384, 1),
        itype("g5.48xlarge", 192, 786432, 8),
        itype("p4d.24xlarge", 96, 1179648, 8),
    )
}


def ce(
    name: str,
    kind: str = "EC2",
    max_vcpus: int = 256,
    types: tuple[str, ...] = ("m5",),
    state: str = "ENABLED",
    status: str = "VALID",
) -> dict[str, Any]:
    """A ``DescribeComputeEnvironments`` entry."""
    env: dict[str, Any] = {
        "computeEnvironmentName": name,
        "computeEnvironmentArn": ARN + name,
        "state": state,
        "status": status,
        "type": "UNMANAGED" if kind == "UNMANAGED" else "MANAGED",
    }
    if kind != "UNMANAGED":
        env["computeResources"] = {"type": kind, "minvCpus": 0, "maxvCpus": max_vcpus}
        if kind in ("EC2", "SPOT"):
            env["computeResources"]["instanceTypes"] = list(types)
    return env


def view(*envs: dict[str, Any], state: str = "ENABLED", status: str = "VALID", **extra: Any) -> QueueView:
    queue = {
        "jobQueueName": "q",
        "state": state,
        "status": status,
        "priority": 1,
        "computeEnvironmentOrder": [
            {"order": i + 1, "computeEnvironment": e["computeEnvironmentArn"]} for i, e in enumerate(envs)
        ],
        **extra,
    }
    return QueueView(queue, envs, TYPES)


def needs(*roles: Role, **cfg: Any) -> JobNeeds:
    """The needs of the app of ``roles`` as the renderer writes its job definition."""
    job = render.render(
        AppDef("a", roles=list(roles)),
        {"queue": "q", **cfg},
        {},
        backend="aws_batch",
        session_name="s",
        version="0",
        images_to_push={},
    )
    return job_needs(job.job_def)


def node(cpu: int = 1, gpu: int = 0, mem: int = 1024, replicas: int = 1, resource: Resource | None = None) -> Role:
    return Role(
        "r", image="img", entrypoint="true", num_replicas=replicas, resource=resource or Resource(cpu, gpu, mem)
    )


def test_job_needs_are_the_rendered_definitions_numbers() -> None:
    assert needs(node(cpu=4, gpu=1, mem=16000)) == JobNeeds((NodeNeeds(1, 4, 16000, 1),), False, "EC2")
    p4d = named_resources["aws_p4d.24xlarge"]
    two = needs(node(replicas=1), node(replicas=3, resource=p4d), job_type="multinode")
    assert two.multinode and two.ranges[1] == NodeNeeds(3, p4d.cpu, p4d.memMB, p4d.gpu, "p4d.24xlarge")
    assert two.vcpus == 1 + 3 * p4d.cpu


@pytest.mark.parametrize(
    ("state", "status", "match"),
    [
        ("DISABLED", "VALID", r"queue 'q' is DISABLED: AWS Batch runs no jobs from it"),
        ("ENABLED", "INVALID", r"queue 'q' is INVALID \(CE gone\)"),
        ("ENABLED", "DELETING", r"queue 'q' is DELETING"),
    ],
)
def test_a_queue_not_enabled_and_valid_is_refused(state: str, status: str, match: str) -> None:
    with pytest.raises(JobWontFitError, match=match):
        check(view(ce("ok"), state=state, status=status, statusReason="CE gone"), needs(node()))


def test_a_queue_without_an_enabled_valid_environment_names_each() -> None:
    envs = (ce("off", state="DISABLED"), ce("broken", status="INVALID"))
    with pytest.raises(JobWontFitError) as err:
        check(view(*envs), needs(node()))
    assert str(err.value) == (
        "cfg: queue 'q' cannot run this job: compute environment 'off': it is DISABLED; "
        "compute environment 'broken': it is INVALID (run option check_queue=False submits without this check)"
    )
    assert isinstance(err.value, InvalidRunConfigError)
    with pytest.raises(JobWontFitError, match="it has no compute environment"):
        check(view(), needs(node()))


@pytest.mark.parametrize(
    ("state", "status", "refused"),
    [
        ("ENABLED", "VALID", None),
        ("ENABLED", "UPDATING", None),
        ("ENABLED", "INVALID", "queue 'q' is INVALID"),
        ("DISABLED", "VALID", "queue 'q' is DISABLED"),
    ],
)
def test_a_connections_test_refuses_the_queues_the_submit_time_check_refuses(
    state: str, status: str, refused: str | None
) -> None:
    """One rule for a queue (``queue_refusal``): the connection's Test (``check_settings``)
    accepts a queue exactly when the submit-time check lets a job that fits through."""
    aws = FakeAWS()
    aws.view = view(ce("ok"), state=state, status=status)
    sched = create_scheduler("conn-test", client=aws)
    cfg = sched.run_opts().resolve({"queue": "q"})
    if refused is None:
        assert sched.check_settings(cfg).startswith(f"AWS Batch job queue 'q' is {state} ({status}); ")
        check(aws.view, needs(node()))
        return
    with pytest.raises(InvalidRunConfigError, match=f"^queue: {refused}: AWS Batch runs no jobs from it"):
        sched.check_settings(cfg)
    with pytest.raises(JobWontFitError, match=f"^cfg: {refused}: AWS Batch runs no jobs from it"):
        check(aws.view, needs(node()))


def test_an_updating_environment_runs_jobs() -> None:
    check(view(ce("busy", status="UPDATING")), needs(node()))


def test_vcpus_over_max_vcpus_are_refused_counting_every_node() -> None:
    with pytest.raises(JobWontFitError, match=r"'small': the job needs 8 vCPUs, over its maxvCpus 4"):
        check(view(ce("small", max_vcpus=4)), needs(node(cpu=8)))
    with pytest.raises(JobWontFitError, match=r"the job needs 8 vCPUs \(2 nodes\), over its maxvCpus 6"):
        check(view(ce("small", max_vcpus=6)), needs(node(cpu=4, replicas=2)))
    check(view(ce("small", max_vcpus=8)), needs(node(cpu=4, replicas=2)))


def test_gpus_over_every_instance_type_name_the_types() -> None:
    with pytest.raises(JobWontFitError) as err:
        check(view(ce("cpu-only", types=("m5", "c5.large"))), needs(node(gpu=1)))
    assert (
        "compute environment 'cpu-only': the job needs 1 GPU per node, more than any of its instance types "
        "(m5, c5.large) has: at most 0 GPUs (m5.large)"
    ) in str(err.value)


def test_memory_over_every_instance_type_with_enough_gpus_is_refused() -> None:
    with pytest.raises(JobWontFitError) as err:
        check(view(ce("g5s", types=("g5",))), needs(node(gpu=8, mem=800_000)))
    assert (
        "the job needs 800000 MiB of memory per node, more than any of its instance types (g5) with enough "
        "GPUs has: at most 786432 MiB of memory (g5.48xlarge)"
    ) in str(err.value)
    with pytest.raises(JobWontFitError, match=r"needs 400000 MiB of memory .* at most 393216 MiB of memory \(m5"):
        check(view(ce("m5s")), needs(node(mem=400_000)))


def test_vcpus_per_node_over_every_instance_type_are_refused() -> None:
    with pytest.raises(JobWontFitError, match=r"needs 100 vCPUs per node, .*\(m5\) with enough GPUs and MiB"):
        check(view(ce("m5s")), needs(node(cpu=100)))


def test_a_job_that_fits_one_environment_passes() -> None:
    envs = (ce("cpu", types=("m5",)), ce("gpu", types=("g5", "p4d")))
    check(view(*envs), needs(node(cpu=8, gpu=8, mem=1_000_000)))  # p4d.24xlarge
    check(view(ce("off", state="DISABLED"), ce("on")), needs(node()))


def test_family_and_keyword_resolution() -> None:
    assert instance_patterns(["p4d", "m5.large", "default_arm64"]) == [
        "p4d.*",
        "m5.large",
        "m6g.*",
        "c6g.*",
        "r6g.*",
        "c7g.*",
    ]
    assert allowed_types(["g5", "c5.large"], TYPES) == ["c5.large", "g5.48xlarge", "g5.xlarge"]
    assert allowed_types(["optimal"], TYPES) == ["c5.large", "m5.24xlarge", "m5.large", "r5.24xlarge", "r6i.32xlarge"]
    assert set(preflight.KEYWORD_FAMILIES["optimal"]) == {
        "c4",
        "m4",
        "r4",
        "c5",
        "m5",
        "r5",
        "m6i",
        "c6i",
        "r6i",
        "c7i",
    }
    assert allowed_types(["m5", "x2iedn"], TYPES) is None  # an entry nothing described matches: unknown


def test_optimal_runs_no_gpu_job_and_its_largest_memory() -> None:
    with pytest.raises(JobWontFitError, match=r"1 GPU per node, more than any of its instance types \(optimal\)"):
        check(view(ce("opt", types=("optimal",))), needs(node(gpu=1)))
    check(view(ce("opt", types=("optimal",))), needs(node(cpu=128, mem=1_000_000)))  # r6i.32xlarge


def test_unknown_instance_types_refuse_nothing() -> None:
    check(view(ce("new", types=("x2iedn",))), needs(node(gpu=8)))
    check(QueueView(view(ce("m5s")).queue, (ce("m5s"),), None), needs(node(gpu=8)))  # DescribeInstanceTypes denied


def test_a_named_instance_type_must_be_allowed() -> None:
    p4d = named_resources["aws_p4d.24xlarge"]
    job = needs(node(resource=p4d), job_type="multinode")
    with pytest.raises(
        JobWontFitError, match=r"asks for instance type p4d.24xlarge, not among its instance types \(g5\)"
    ):
        check(view(ce("g5s", types=("g5",))), job)
    check(view(ce("p4ds", types=("p4d",))), job)
    two = needs(node(), node(resource=named_resources["aws_p4d.24xlarge"]), job_type="multinode")
    with pytest.raises(JobWontFitError, match=r"node range 1 asks for instance type p4d.24xlarge"):
        check(view(ce("g5s", types=("g5",))), two)


def test_unmanaged_environments_are_checked_for_state_only() -> None:
    check(view(ce("own", kind="UNMANAGED")), needs(node(cpu=512, gpu=64, mem=10_000_000)))
    with pytest.raises(JobWontFitError, match="'own': it is DISABLED"):
        check(view(ce("own", kind="UNMANAGED", state="DISABLED")), needs(node()))


def test_fargate_environments_are_checked_for_max_vcpus_only() -> None:
    fargate = {"platform": "FARGATE", "execution_role_arn": "arn:aws:iam::1:role/exec"}
    check(view(ce("fg", kind="FARGATE", max_vcpus=4)), needs(node(cpu=4, mem=8192), **fargate))
    with pytest.raises(JobWontFitError, match=r"'fg': the job needs 8 vCPUs, over its maxvCpus 4"):
        check(view(ce("fg", kind="FARGATE_SPOT", max_vcpus=4)), needs(node(cpu=8, mem=16384), **fargate))


def test_an_environment_of_another_kind_does_not_count() -> None:
    envs = (ce("ondemand", state="DISABLED"), ce("spot", kind="SPOT"))
    with pytest.raises(JobWontFitError) as err:
        check(view(*envs), needs(node(replicas=2)))
    assert (
        "'ondemand': it is DISABLED; compute environment 'spot': AWS Batch runs no multi-node parallel jobs on SPOT"
        in str(err.value)
    )


# --------------------------------------------------------------------------- calls and cache


class FakeAWS:
    """Batch and EC2 describes over ``envs`` and ``TYPES``, two instance types a page; records
    every call."""

    def __init__(self, *envs: dict[str, Any], deny_ec2: bool = False) -> None:
        self.view = view(*envs)
        self.deny_ec2 = deny_ec2
        self.calls: list[str] = []

    def describe_job_queues(self, jobQueues: list[str]) -> dict[str, Any]:
        self.calls.append("DescribeJobQueues")
        return {"jobQueues": [self.view.queue] if jobQueues == ["q"] else []}

    def describe_compute_environments(self, computeEnvironments: list[str]) -> dict[str, Any]:
        self.calls.append("DescribeComputeEnvironments")
        return {"computeEnvironments": [e for e in self.view.envs if e["computeEnvironmentArn"] in computeEnvironments]}

    def describe_instance_types(self, Filters: list[dict[str, Any]], NextToken: str = "0") -> dict[str, Any]:
        self.calls.append("DescribeInstanceTypes")
        if self.deny_ec2:
            raise client_error("UnauthorizedOperation", 403, "DescribeInstanceTypes")
        (flt,) = Filters
        match = [t for n, t in TYPES.items() if any(fnmatch.fnmatch(n, p) for p in flt["Values"])]
        start = int(NextToken)
        page: dict[str, Any] = {"InstanceTypes": match[start : start + 2]}
        if start + 2 < len(match):
            page["NextToken"] = str(start + 2)
        return page

    def get_paginator(self, name: str) -> Any:
        return paginator(self, "ec2" if name == "describe_instance_types" else "batch", name)


def test_describe_reads_the_queue_its_environments_and_every_page_of_their_instance_types() -> None:
    aws = FakeAWS(ce("g5s", types=("g5", "m5.large")), ce("fg", kind="FARGATE"))
    got = preflight.describe(aws, lambda: aws, "q")
    assert got is not None and got.queue["jobQueueName"] == "q" and len(got.envs) == 2
    assert sorted(got.instance_types or {}) == ["g5.48xlarge", "g5.xlarge", "m5.large"]
    assert aws.calls == [
        "DescribeJobQueues",
        "DescribeComputeEnvironments",
        "DescribeInstanceTypes",
        "DescribeInstanceTypes",
    ]
    assert preflight.describe(aws, lambda: aws, "nope") is None


def test_describe_asks_ec2_nothing_without_instance_types() -> None:
    aws = FakeAWS(ce("own", kind="UNMANAGED"), ce("fg", kind="FARGATE"))

    def no_ec2() -> Any:
        raise AssertionError("no EC2 client needed")

    got = preflight.describe(aws, no_ec2, "q")
    assert got is not None and got.instance_types == {}
    assert "DescribeInstanceTypes" not in aws.calls


def test_describe_without_permission_for_instance_types_warns_and_reads_none(caplog: pytest.LogCaptureFixture) -> None:
    aws = FakeAWS(ce("m5s"), deny_ec2=True)
    with caplog.at_level(logging.WARNING, logger=preflight.__name__):
        got = preflight.describe(aws, lambda: aws, "q")
    assert got is not None and got.instance_types is None
    assert "ec2:DescribeInstanceTypes was denied" in caplog.text


def test_the_cache_reuses_a_view_for_its_ttl_and_forgets_missing_queues() -> None:
    clock = FakeClock()
    cache = QueueCache(ttl=300, clock=clock.clock)
    fetched: list[str] = []

    def fetch(name: str) -> QueueView | None:
        fetched.append(name)
        return view(ce("m5s")) if name == "q" else None

    first = cache.get(("k", "q"), lambda: fetch("q"))
    clock.advance(299)
    assert cache.get(("k", "q"), lambda: fetch("q")) is first and fetched == ["q"]
    assert cache.get(("other-account", "q"), lambda: fetch("q")) is not first and fetched == ["q", "q"]
    clock.advance(1)
    assert cache.get(("k", "q"), lambda: fetch("q")) is not first and fetched == ["q", "q", "q"]
    assert cache.get(("k", "nope"), lambda: fetch("nope")) is None
    assert cache.get(("k", "nope"), lambda: fetch("nope")) is None and fetched[-2:] == ["nope", "nope"]


def test_the_cache_fetches_once_for_concurrent_first_readers() -> None:
    cache = QueueCache(clock=FakeClock().clock)
    fetched: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(8)

    def fetch() -> QueueView:
        with lock:
            fetched.append(1)
        return view(ce("m5s"))

    def read() -> None:
        start.wait()
        cache.get("q", fetch)

    threads = [threading.Thread(target=read) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(fetched) == 1


# ---------------------------------------------------------------------- a job blocked RUNNABLE

#: A ``jobStateTimeLimitActions`` entry, valid for botocore's model (``test_the_entries_are_awss``).
CANCEL_AFTER_10_MIN = {
    "reason": "MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT",
    "state": "RUNNABLE",
    "maxTimeSeconds": 600,
    "action": "CANCEL",
}


def test_a_queue_with_a_runnable_time_limit_says_what_batch_does() -> None:
    queue = {"jobQueueName": "q", "jobStateTimeLimitActions": [CANCEL_AFTER_10_MIN]}
    assert preflight.runnable_limit(queue) == (
        "a job blocked RUNNABLE at its head: CANCEL after 600s (MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT) "
        "(jobStateTimeLimitActions)"
    )


@pytest.mark.parametrize("queue", [{"jobQueueName": "q"}, {"jobQueueName": "q", "jobStateTimeLimitActions": []}])
def test_a_queue_without_one_says_only_start_timeout_stops_such_a_job(queue: dict[str, Any]) -> None:
    assert preflight.runnable_limit(queue) == (
        "it has no jobStateTimeLimitActions: a job blocked RUNNABLE at its head waits until a task's "
        "start_timeout stops it"
    )


def test_the_entries_are_awss() -> None:
    import botocore.session
    from botocore.validate import ParamValidator

    model = botocore.session.get_session().get_service_model("batch")
    request = {"jobQueueName": "q", "priority": 1, "computeEnvironmentOrder": []}
    report = ParamValidator().validate(
        {**request, "jobStateTimeLimitActions": [CANCEL_AFTER_10_MIN]},
        model.operation_model("CreateJobQueue").input_shape,
    )
    assert not report.has_errors(), report.generate_report()
