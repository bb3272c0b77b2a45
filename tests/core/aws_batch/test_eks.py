"""Batch on EKS and consumable resources, without AWS: every rendered request (ECS and EKS,
single and multi-node, GPUs, shm, mounts, consumables) validated against botocore's own model
of the Batch API; the pod rendering field by field; bad options refused (at parse time too);
and ``describe``/usage of EKS jobs on ``DescribeJobs`` entries built from the API's documented
fields (``EksAttemptDetail``, ``EksPropertiesDetail``), themselves checked against botocore's
output shape: moto runs no pods, so what a running or ended pod looks like is only tested here.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import botocore.session
import pytest
from botocore.validate import ParamValidator

from airflow_provider_torchx.core import identity
from airflow_provider_torchx.core.errors import InvalidRunConfigError, InvalidSpecError
from airflow_provider_torchx.core.masking import mask_tree
from airflow_provider_torchx.core.schedulers.aws_batch import create_scheduler, eks, options, preflight, render
from airflow_provider_torchx.core.schedulers.aws_batch.scheduler import AWSBatchScheduler
from airflow_provider_torchx.core.schedulers.aws_batch.status import describe_response
from airflow_provider_torchx.core.schedulers.aws_batch.usage import batch_usage
from airflow_provider_torchx.core.specs import (
    AppDef,
    AppState,
    BindMount,
    DeviceMount,
    Resource,
    Role,
    VolumeMount,
    named_resources,
)
from airflow_provider_torchx.operators import checks
from tests.core.aws_batch.fakes import FakeBatch

BATCH = botocore.session.get_session().get_service_model("batch")
JOB_DEF_ARN = "arn:aws:batch:us-east-1:123456789012:job-definition/j:1"
IDENTITY = identity.TaskIdentity("train_dag", "fit", "manual__2026-12-02T10:47:16.123456+00:00", 3).labels()
K8S_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")


def problems(shape_name: str, params: dict[str, Any]) -> str:
    """botocore's own validation report of ``params`` against a Batch model shape ("" if valid)."""
    report = ParamValidator().validate(params, BATCH.shape_for(shape_name))
    return report.generate_report() if report.has_errors() else ""


def assert_valid_requests(job: render.BatchJob) -> None:
    """The job's RegisterJobDefinition and SubmitJob requests pass botocore's validation."""
    assert problems("RegisterJobDefinitionRequest", job.job_def) == ""
    assert problems("SubmitJobRequest", {"jobDefinition": JOB_DEF_ARN, **job.submit_request()}) == ""


class NoCalls:
    """A client that fails the test on any call: dry runs make none."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"unexpected AWS call {name}")


def sched() -> AWSBatchScheduler:
    return create_scheduler("sess", client=NoCalls(), log_client=NoCalls(), docker_client=NoCalls())


def dryrun(app: AppDef, cfg: dict[str, Any] | None = None, labels: dict[str, str] | None = None) -> render.BatchJob:
    return sched().submit_dryrun(app, {"queue": "q1", **(cfg or {})}, labels).request


def role(**kw: Any) -> Role:
    base: dict[str, Any] = {
        "name": "trainer",
        "image": "ghcr.io/me/train:1",
        "entrypoint": "torchrun",
        "args": ["--nnodes", "2", "--node_rank", "${replica_id}", "--rdzv_endpoint", "${rank0_env}:29500", "t.py"],
        "env": {"HF_TOKEN": "hf_secret_value_123", "FOO": "bar"},
        "num_replicas": 2,
        "resource": Resource(cpu=8, gpu=4, memMB=65536),
    }
    base.update(kw)
    return Role(**base)


EKS = {"platform": "EKS", "namespace": "training", "service_account": "trainer-sa"}
ECS_MOUNTS = [
    BindMount("/data", "/data", True),
    VolumeMount("fs-12345678", "/efs"),
    DeviceMount("/dev/fuse", "/dev/fuse"),
]
EFA = Resource(cpu=8, gpu=8, memMB=1024, devices={"vpc.amazonaws.com/efa": 4})
EKS_MOUNTS = [BindMount("/data", "/data", True), VolumeMount("checkpoints-pvc", "/ckpt")]


@pytest.mark.parametrize(
    ("app", "cfg"),
    [
        pytest.param(AppDef("a", roles=[role(num_replicas=1)]), {}, id="ecs-single-gpu"),
        pytest.param(
            AppDef("a", roles=[role(num_replicas=1, mounts=ECS_MOUNTS)]),
            {"shm_size": 2048, "consumable_resources": ["matlab:2", "db-slots:1"], "ulimits": ["nofile:1024:4096"]},
            id="ecs-single-shm-mounts-consumables",
        ),
        pytest.param(
            AppDef("a", roles=[role(resource=named_resources["aws_p4d.24xlarge"], mounts=ECS_MOUNTS)]),
            {"consumable_resources": ["arn:aws:batch:us-east-1:123456789012:consumable-resource/lic:3"]},
            id="ecs-multi-gpu-mounts-consumables",
        ),
        pytest.param(
            AppDef("a", roles=[role(num_replicas=1, resource=Resource(cpu=2, gpu=0, memMB=4096))]),
            {"platform": "FARGATE", "execution_role_arn": "arn:aws:iam::1:role/exec", "consumable_resources": ["l:1"]},
            id="fargate-single-consumables",
        ),
        pytest.param(AppDef("a", roles=[role(num_replicas=1)]), EKS, id="eks-single-gpu"),
        pytest.param(
            AppDef("a", roles=[role(num_replicas=1, mounts=EKS_MOUNTS)]),
            {**EKS, "shm_size": 2048, "privileged": True, "consumable_resources": ["matlab:2"]},
            id="eks-single-shm-mounts-consumables",
        ),
        pytest.param(
            AppDef(
                "a",
                roles=[
                    role(resource=named_resources["aws_p4d.24xlarge"], mounts=EKS_MOUNTS),
                    role(name="evaluator", num_replicas=1, resource=named_resources["aws_p4d.24xlarge"]),
                ],
            ),
            {**EKS, "consumable_resources": ["lic:3"], "attempt_timeout": 3600},
            id="eks-multi-gpu-mounts-consumables",
        ),
        pytest.param(AppDef("a", roles=[role()]), {"platform": "EKS", "shm_size": 0}, id="eks-multi-no-shm"),
    ],
)
def test_every_rendered_request_passes_botocores_validation_of_the_batch_model(
    app: AppDef, cfg: dict[str, Any]
) -> None:
    job = dryrun(app, cfg, IDENTITY)
    assert_valid_requests(job)
    assert (cfg.get("platform") == "EKS") == job.on_eks == ("eksProperties" in job.format())


def test_the_validation_itself_refuses_a_request_off_the_model() -> None:
    bad = {"jobDefinitionName": "j", "type": "container", "eksProperties": {"podProperties": {"containers": [{}]}}}
    assert "Missing required parameter" in problems("RegisterJobDefinitionRequest", bad)
    bad = {"jobName": "j", "jobQueue": "q", "jobDefinition": "d", "consumableResourcePropertiesOverride": 3}
    assert "Invalid type" in problems("SubmitJobRequest", bad)


def pod(job: render.BatchJob, node_range: int | None = None) -> dict[str, Any]:
    if node_range is None:
        return job.job_def["eksProperties"]["podProperties"]
    return job.job_def["nodeProperties"]["nodeRangeProperties"][node_range]["eksProperties"]["podProperties"]


def test_a_single_node_eks_job_is_one_pod_with_requests_equal_to_limits_and_shm_in_memory() -> None:
    job = dryrun(AppDef("fit", roles=[role(num_replicas=1, mounts=EKS_MOUNTS)]), EKS, IDENTITY)
    assert job.job_def["type"] == "container"
    assert "platformCapabilities" not in job.job_def and "propagateTags" not in job.job_def
    assert "propagateTags" not in job.submit_request()
    spec = pod(job)
    (c,) = spec["containers"]
    want = {"cpu": "8", "memory": "65536Mi", "nvidia.com/gpu": "4"}
    assert c["resources"] == {"requests": want, "limits": want}
    assert spec["serviceAccountName"] == "trainer-sa"
    assert spec["metadata"]["namespace"] == "training"
    assert spec["volumes"] == [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "65536Mi"}},
        {"name": "mount-0", "hostPath": {"path": "/data"}},
        {"name": "mount-1", "persistentVolumeClaim": {"claimName": "checkpoints-pvc", "readOnly": False}},
    ]
    assert c["volumeMounts"] == [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "mount-0", "mountPath": "/data", "readOnly": True},
        {"name": "mount-1", "mountPath": "/ckpt", "readOnly": False},
    ]
    assert c["command"] == ["torchrun"] and c["args"][:3] == ["--nnodes", "2", "--node_rank"]
    assert "securityContext" not in c


def test_shm_size_sizes_the_pods_shm_and_0_leaves_it_out() -> None:
    app = AppDef("fit", roles=[role(num_replicas=1)])
    assert pod(dryrun(app, {**EKS, "shm_size": 1024}))["volumes"][0]["emptyDir"]["sizeLimit"] == "1024Mi"
    assert pod(dryrun(app, {**EKS, "shm_size": 0}))["volumes"] == []


@pytest.mark.parametrize("num_replicas", [1, 2])
def test_the_torchx_env_and_command_are_the_ecs_renderings_exactly(num_replicas: int) -> None:
    """The rendezvous (``${rank0_env}``, ``${replica_id}`` under ``sh -c``) and replica env
    come from the same functions on both platforms."""
    app = AppDef("fit", roles=[role(num_replicas=num_replicas)])
    ecs_job = dryrun(app, {}, IDENTITY)
    eks_job = dryrun(app, EKS, IDENTITY)
    if num_replicas == 1:
        ecs_c, eks_c = ecs_job.job_def["containerProperties"], pod(eks_job)["containers"][0]
    else:
        ecs_c = ecs_job.job_def["nodeProperties"]["nodeRangeProperties"][0]["container"]
        eks_c = pod(eks_job, 0)["containers"][0]
        assert ecs_c["command"][:2] == ["sh", "-c"]  # ${replica_id} is computed per node
    ecs_env = {e["name"]: e["value"] for e in ecs_c["environment"]}
    eks_env = {e["name"]: e["value"] for e in eks_c["env"]}
    assert {k: v for k, v in eks_env.items() if k != "TORCHX_JOB_ID"} == {
        k: v for k, v in ecs_env.items() if k != "TORCHX_JOB_ID"
    }  # the job id names the job, whose random name differs between the two dry runs
    assert [*eks_c["command"], *eks_c["args"]] == [re.sub(ecs_job.name, eks_job.name, a) for a in ecs_c["command"]]


def test_a_multi_node_eks_job_puts_each_roles_pod_in_its_node_range() -> None:
    app = AppDef(
        "fit",
        roles=[role(resource=named_resources["aws_p4d.24xlarge"]), role(name="evaluator", num_replicas=1)],
    )
    job = dryrun(app, EKS, IDENTITY)
    props = job.job_def["nodeProperties"]
    assert props["numNodes"] == 3 and props["mainNode"] == 0
    first, second = props["nodeRangeProperties"]
    assert first["targetNodes"] == "0:1" and first["instanceTypes"] == ["p4d.24xlarge"]
    assert second["targetNodes"] == "2:2" and "instanceTypes" not in second
    assert "container" not in first
    env = {e["name"]: e["value"] for e in pod(job, 1)["containers"][0]["env"]}
    assert env["TORCHX_ROLE_NAME"] == "evaluator" and env["TORCHX_ROLE_FIRST_NODE"] == "2"
    assert pod(job, 0)["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"


def test_pod_labels_carry_the_jobs_identity_as_valid_kubernetes_label_values() -> None:
    labels = pod(dryrun(AppDef("my app: fit!", roles=[role(num_replicas=1)]), EKS, IDENTITY))["metadata"]["labels"]
    assert labels == {
        "torchx-app-name": "my_app_fit",
        "airflow-dag-id": "train_dag",
        "airflow-task-id": "fit",
        "airflow-run-id": "manual__2026-12-02T10_47_16.123456_00_00",
        "airflow-map-index": "3",
    }
    assert all(K8S_LABEL_VALUE.fullmatch(v) for v in labels.values())


@pytest.mark.parametrize(
    "text",
    ["x" * 200, "-a-", "a" * 62 + "!" + "b" * 10, "scheduled__2026-01-01T00:00:00+00:00", "::", "ok"],
)
def test_label_values_are_valid_and_long_ones_stay_distinct(text: str) -> None:
    value = eks.label_value(text)
    assert K8S_LABEL_VALUE.fullmatch(value) and len(value) <= 63
    assert eks.label_value(text + "z") != value or len(text) < 63


def test_consumable_resources_are_the_job_definitions_and_the_submit_keeps_them() -> None:
    job = dryrun(AppDef("fit", roles=[role()]), {"consumable_resources": "matlab:2, db-slots:1"})
    assert job.job_def["consumableResourceProperties"] == {
        "consumableResourceList": [
            {"consumableResource": "matlab", "quantity": 2},
            {"consumableResource": "db-slots", "quantity": 1},
        ]
    }
    assert "consumableResourceProperties" not in dryrun(AppDef("fit", roles=[role()])).job_def


def test_the_eks_dry_run_masks_secret_env_like_the_ecs_one() -> None:
    info = sched().submit_dryrun(AppDef("fit", roles=[role()]), {"queue": "q1", **EKS}, IDENTITY)
    shown = str(mask_tree(info.request).format())
    assert "hf_secret_value_123" in info.request.format()
    assert "hf_secret_value_123" not in shown and '"value": "***"' in shown
    assert '"eksProperties"' in shown and '"serviceAccountName": "trainer-sa"' in shown


@pytest.mark.parametrize(
    ("cfg", "app", "match"),
    [
        ({"namespace": "Training"}, None, r"namespace='Training' is not a namespace"),
        ({"namespace": "default"}, None, r"namespace='default' is not"),
        ({"namespace": "kube-jobs"}, None, r"namespace='kube-jobs' is not"),
        ({"service_account": "Trainer_SA"}, None, r"service_account='Trainer_SA' is not a Kubernetes service"),
        ({"consumable_resources": ["matlab"]}, None, r"entry 'matlab' is not name:quantity"),
        ({"consumable_resources": ["matlab:0"]}, None, r"entry 'matlab:0' asks for quantity '0'"),
        ({"consumable_resources": ["matlab:two"]}, None, r"entry 'matlab:two' asks for quantity 'two'"),
        ({"consumable_resources": ["mat lab:1"]}, None, r"names 'mat lab', which is not a consumable"),
        ({"consumable_resources": ["a:1", "a:2"]}, None, r"names 'a' twice"),
        ({"platform": "GKE"}, None, r"platform='GKE' is not one of: EC2, FARGATE, EKS"),
        ({"platform": "EC2", "namespace": "training"}, None, r"namespace='training' applies only with platform=EKS"),
        ({**EKS, "job_role_arn": "arn:aws:iam::1:role/r"}, None, r"job_role_arn=.*does not apply with platform=EKS"),
        ({**EKS, "ulimits": ["nofile:1:2"]}, None, r"ulimits=.*does not apply with platform=EKS"),
        (EKS, AppDef("a", roles=[role(mounts=[DeviceMount("/dev/fuse", "/dev/fuse")])]), r"mounts\[0\]: a device"),
        (EKS, AppDef("a", roles=[role(resource=EFA)]), r"resource.devices: .*no host devices for pods"),
        (EKS, AppDef("a", roles=[role(mounts=[VolumeMount("fs-12345678x/", "/d")])]), r"persistent volume claim"),
        (EKS, AppDef("a", roles=[role(mounts=[VolumeMount("fs-12345678", "/d")])]), r"is an EFS file system id"),
    ],
)
def test_bad_eks_and_consumable_options_are_refused_naming_the_value(
    cfg: dict[str, Any], app: AppDef | None, match: str
) -> None:
    with pytest.raises((InvalidRunConfigError, InvalidSpecError), match=match):
        dryrun(app or AppDef("a", roles=[role()]), cfg)


@pytest.mark.parametrize(
    ("cfg", "match"),
    [
        ({"consumable_resources": "matlab:0"}, r"consumable_resources entry 'matlab:0'"),
        ({"consumable_resources": ["x y:1"]}, r"names 'x y'"),
        ({"namespace": "kube-system"}, r"namespace='kube-system'"),
        ({"service_account": "A"}, r"service_account='A'"),
        ({"platform": "k8s"}, r"platform='k8s'"),
    ],
)
def test_literal_bad_values_fail_when_the_dag_is_parsed(cfg: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidRunConfigError, match=match):
        checks.check_cfg("aws_batch", cfg)
    checks.check_cfg("aws_batch", {"consumable_resources": "matlab:2,db:1", "namespace": "ml", "platform": "eks"})


# --------------------------------------------------------------------------- the queue decides


def test_platform_follows_the_queue_unless_given() -> None:
    app = AppDef("a", roles=[role()])
    assert options.resolve(app, {}).follows_queue
    assert options.resolve(app, {}).platform == "EC2"
    assert not options.resolve(app, {"platform": "EC2"}).follows_queue
    assert options.resolve(app, {"namespace": "ml"}).platform == "EKS"  # pod options mean pods
    assert not options.resolve(app, {"namespace": "ml"}).follows_queue


EKS_ENV = {
    "computeEnvironmentName": "eks-gpu",
    "computeEnvironmentArn": "arn:aws:batch:us-east-1:123456789012:compute-environment/eks-gpu",
    "type": "MANAGED",
    "state": "ENABLED",
    "status": "VALID",
    "containerOrchestrationType": "EKS",
    "eksConfiguration": {"eksClusterArn": "arn:aws:eks:us-east-1:123456789012:cluster/ml", "kubernetesNamespace": "ml"},
    "computeResources": {"type": "EC2", "maxvCpus": 512, "instanceTypes": ["p4d.24xlarge"]},
}
ECS_ENV = {**EKS_ENV, "computeEnvironmentName": "ecs", "computeEnvironmentArn": "arn:ce/ecs"}
del ECS_ENV["containerOrchestrationType"], ECS_ENV["eksConfiguration"]


def view(env: dict[str, Any]) -> preflight.QueueView:
    queue = {
        "jobQueueName": "gpu",
        "state": "ENABLED",
        "status": "VALID",
        "computeEnvironmentOrder": [{"order": 1, "computeEnvironment": env["computeEnvironmentArn"]}],
    }
    return preflight.QueueView(queue, (env,), None)


class Queued(AWSBatchScheduler):
    """A scheduler whose queue descriptions are given, and whose writes are recorded."""

    def __init__(self, env: dict[str, Any]) -> None:
        super().__init__("s", client=NoCalls(), log_client=NoCalls(), docker_client=NoCalls())
        self.env, self.described = env, 0
        self.registered: list[dict[str, Any]] = []

    def _queue_view(self, queue: str) -> preflight.QueueView:
        self.described += 1
        return view(self.env)


def test_a_job_without_a_platform_is_rendered_for_eks_on_an_eks_queue_under_the_same_name() -> None:
    sched = Queued(EKS_ENV)
    info = sched.submit_dryrun(AppDef("fit", roles=[role()]), {"queue": "gpu"}, IDENTITY)
    assert not info.request.on_eks  # the dry run made no call: rendered for ECS
    job = sched._for_queue(info)
    assert job.on_eks and job.name == info.request.name
    assert_valid_requests(job)
    sched._check_queue(job)  # the EKS queue runs it
    assert not Queued(ECS_ENV)._for_queue(info).on_eks
    given = sched.submit_dryrun(AppDef("fit", roles=[role()]), {"queue": "gpu", "platform": "EC2"})
    calls = sched.described
    assert sched._for_queue(given) is given.request and sched.described == calls  # no look-up


@pytest.mark.parametrize(
    ("env", "cfg", "match"),
    [
        (EKS_ENV, {"platform": "EC2"}, r"'eks-gpu': it runs pods on EKS, and the job is platform=EC2"),
        (ECS_ENV, EKS, r"'ecs': it runs ECS containers, and the job is platform=EKS"),
    ],
)
def test_the_queue_check_refuses_pods_for_ecs_and_containers_for_eks(
    env: dict[str, Any], cfg: dict[str, Any], match: str
) -> None:
    sched = Queued(env)
    job = sched.submit_dryrun(AppDef("fit", roles=[role()]), {"queue": "gpu", **cfg}).request
    with pytest.raises(InvalidRunConfigError, match=match):
        sched._check_queue(job)


def test_the_queue_check_reads_a_pods_gpus() -> None:
    small = {**EKS_ENV, "computeResources": {"type": "EC2", "maxvCpus": 512, "instanceTypes": ["g5.xlarge"]}}
    types = {"g5.xlarge": {"InstanceType": "g5.xlarge", "GpuInfo": {"Gpus": [{"Count": 1}]}}}
    job = dryrun(AppDef("fit", roles=[role()]), EKS)
    with pytest.raises(InvalidRunConfigError, match=r"needs 4 GPUs per node"):
        preflight.check(preflight.QueueView(view(small).queue, (small,), types), preflight.job_needs(job.job_def))


# --------------------------------------------------------------------------- reading EKS jobs back

CLUSTER = "arn:aws:eks:us-east-1:123456789012:cluster/ml"


def eks_attempt(start_s: int, stop_s: int, code: int, pod: str, node: str, reason: str = "") -> dict[str, Any]:
    """An ``EksAttemptDetail`` as the API reference documents it."""
    container = {"name": "main", "containerID": "c0ffee", "exitCode": code}
    if reason:
        container["reason"] = reason
    return {
        "containers": [container],
        "eksClusterArn": CLUSTER,
        "podName": pod,
        "podNamespace": "training",
        "nodeName": node,
        "startedAt": start_s * 1000,
        "stoppedAt": stop_s * 1000,
        "statusReason": reason or "Essential container in task exited",
    }


def single_eks_job(status: str = "FAILED") -> dict[str, Any]:
    """A ``DescribeJobs`` entry of a single-node EKS job that failed on its second attempt."""
    job = dryrun(AppDef("fit", roles=[role(num_replicas=1, max_retries=1)]), EKS, IDENTITY)
    pod_props = {
        **job.job_def["eksProperties"]["podProperties"],
        "podName": "aws-batch.abc-2",
        "nodeName": "ip-10-0-0-2.ec2.internal",
    }
    pod_props["containers"] = [{**pod_props["containers"][0], "exitCode": 3, "reason": "Error"}]
    return {
        "jobArn": "arn:aws:batch:us-east-1:123456789012:job/abc",
        "jobName": job.name,
        "jobId": "abc",
        "jobQueue": "arn:aws:batch:us-east-1:123456789012:job-queue/gpu",
        "status": status,
        "statusReason": "Essential container in task exited",
        "createdAt": 1_000_000,
        "startedAt": 1_010_000,
        "stoppedAt": 1_200_000,
        "jobDefinition": JOB_DEF_ARN,
        "retryStrategy": job.job_def["retryStrategy"],
        "tags": job.job_def["tags"],
        "eksProperties": {"podProperties": pod_props},
        "eksAttempts": [
            eks_attempt(1010, 1100, 137, "aws-batch.abc-1", "ip-10-0-0-1.ec2.internal", "OOMKilled"),
            eks_attempt(1110, 1200, 3, "aws-batch.abc-2", "ip-10-0-0-2.ec2.internal"),
        ],
    }


def test_the_fake_describe_entries_are_shaped_like_the_api() -> None:
    job = single_eks_job()
    assert problems("DescribeJobsResponse", {"jobs": [job]}) == ""
    mnp, nodes = mnp_eks_job()
    assert problems("DescribeJobsResponse", {"jobs": [mnp, *nodes.values()]}) == ""


def test_a_single_node_eks_job_maps_its_pod_onto_the_replica() -> None:
    resp = describe_response("gpu:fit", single_eks_job(), {}, "us-east-1")
    assert resp.state == AppState.FAILED
    (replica,) = resp.roles_statuses[0].replicas
    assert replica.exit_code == 3
    assert replica.hostname == "ip-10-0-0-2.ec2.internal"
    assert "pod training/aws-batch.abc-2" in replica.msg
    assert resp.num_restarts == 1
    assert "attempt 1 of 2 ended: OOMKilled (exit code 137)" in resp.msg
    assert resp.roles[0].resource.gpu == 4 and resp.roles[0].resource.memMB == 65536
    assert resp.roles[0].entrypoint == "torchrun"
    assert resp.labels == IDENTITY


def mnp_eks_job() -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
    """A multi-node EKS job (2 trainer nodes) that failed on node 1, and its child jobs."""
    job = dryrun(AppDef("fit", roles=[role()]), EKS, IDENTITY)
    base = {
        "jobArn": "arn:aws:batch:us-east-1:123456789012:job/m",
        "jobName": job.name,
        "jobId": "m",
        "jobQueue": "arn:aws:batch:us-east-1:123456789012:job-queue/gpu",
        "status": "FAILED",
        "createdAt": 1_000_000,
        "startedAt": 1_010_000,
        "stoppedAt": 1_100_000,
        "jobDefinition": JOB_DEF_ARN,
        "tags": job.job_def["tags"],
        "nodeProperties": job.job_def["nodeProperties"],
    }
    nodes = {}
    for n, code in ((0, 0), (1, 1)):
        nodes[n] = {
            **{k: v for k, v in base.items() if k != "nodeProperties"},
            "jobId": f"m#{n}",
            "jobArn": f"arn:aws:batch:us-east-1:123456789012:job/m#{n}",
            "status": "SUCCEEDED" if code == 0 else "FAILED",
            "nodeDetails": {"nodeIndex": n, "isMainNode": n == 0},
            "eksAttempts": [eks_attempt(1010, 1100, code, f"aws-batch.m-{n}", f"ip-10-0-1-{n}.ec2.internal")],
        }
    return base, nodes


def test_a_multi_node_eks_jobs_nodes_map_onto_replicas_and_usage_counts_their_attempts() -> None:
    job, nodes = mnp_eks_job()
    resp = describe_response("gpu:fit", job, nodes, "us-east-1")
    r0, r1 = resp.roles_statuses[0].replicas
    assert (r0.state, r0.exit_code, r0.hostname) == (AppState.SUCCEEDED, 0, "ip-10-0-1-0.ec2.internal")
    assert (r1.state, r1.exit_code) == (AppState.FAILED, 1)
    assert "pod training/aws-batch.m-1" in r1.msg
    assert "role 'trainer' replica 1 (node 1) exited with code 1" in resp.msg
    usage = batch_usage(job, nodes, resp.roles)
    assert len(usage.attempts) == 2
    assert {a.exit_code for a in usage.attempts} == {0, 1}
    assert usage.gpu_hours == pytest.approx(2 * 4 * 90 / 3600)


def test_usage_of_a_single_node_eks_job_counts_every_eks_attempt() -> None:
    job = single_eks_job()
    resp = describe_response("gpu:fit", job, {}, "us-east-1")
    usage = batch_usage(job, {}, resp.roles)
    assert [(a.number, a.exit_code, a.reason) for a in usage.attempts] == [
        (1, 137, "OOMKilled"),
        (2, 3, "Essential container in task exited"),
    ]


class EksBatch(FakeBatch):
    """A fake Batch whose queue ``eks-<id>`` runs on one EKS compute environment (of cluster
    ``cluster``)."""

    def __init__(self) -> None:
        super().__init__()
        self.queue = f"eks-{uuid.uuid4().hex[:8]}"
        self.queues.append(self.queue)
        self.queue_kinds[self.queue] = ["EC2"]
        self.cluster = CLUSTER

    def describe_compute_environments(self, computeEnvironments: list[str]) -> dict[str, Any]:
        envs = super().describe_compute_environments(computeEnvironments)["computeEnvironments"]
        eks_config = {"eksClusterArn": self.cluster, "kubernetesNamespace": "ml"}
        return {
            "computeEnvironments": [
                {**e, "containerOrchestrationType": "EKS", "eksConfiguration": eks_config} for e in envs
            ]
        }


def test_submits_without_a_platform_follow_an_eks_queue_with_one_look_up_per_queue() -> None:
    batch = EksBatch()
    sched = create_scheduler("s", client=batch, log_client=NoCalls(), docker_client=NoCalls())
    for _ in range(3):
        sched.submit(AppDef("fit", roles=[role()]), {"queue": batch.queue}, IDENTITY)
    registered = [kw for name, kw in batch.calls if name == "register_job_definition"]
    assert len(registered) == 3
    assert all("eksProperties" in r["nodeProperties"]["nodeRangeProperties"][0] for r in registered)
    assert batch.names().count("describe_job_queues") == 1
    assert batch.names().count("describe_compute_environments") == 1
    submitted = [kw for name, kw in batch.calls if name == "submit_job"]
    assert [s["jobName"] for s in submitted] == [r["jobDefinitionName"] for r in registered]
    assert all("propagateTags" not in s for s in submitted)


def test_a_job_following_an_eks_queue_with_an_ecs_only_option_is_refused_before_any_write() -> None:
    batch = EksBatch()
    sched = create_scheduler("s", client=batch, log_client=NoCalls(), docker_client=NoCalls())
    cfg = {"queue": batch.queue, "job_role_arn": "arn:aws:iam::1:role/r"}
    with pytest.raises(InvalidRunConfigError, match=r"job_role_arn=.*does not apply with platform=EKS"):
        sched.submit(AppDef("fit", roles=[role()]), cfg)
    assert not {"register_job_definition", "submit_job"} & set(batch.names())
