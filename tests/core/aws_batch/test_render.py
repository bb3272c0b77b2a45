"""The rendered job definition and submit request, field by field (no AWS: moto drops several
of these fields, so only a unit test can check them), and bad input rejected before any call."""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any

import pytest

from airflow_provider_torchx.core import checkpoints
from airflow_provider_torchx.core.errors import InvalidRunConfigError, InvalidSpecError
from airflow_provider_torchx.core.identity import TaskIdentity
from airflow_provider_torchx.core.schedulers.aws_batch import AWSBatchScheduler, BatchJob, create_scheduler
from airflow_provider_torchx.core.schedulers.aws_batch.render import (
    REPLICA_ID_EXPR,
    labels_hash,
    parse_ulimits,
    queue_name,
)
from airflow_provider_torchx.core.specs import (
    AppDef,
    BindMount,
    DeviceMount,
    Resource,
    Role,
    VolumeMount,
    named_resources,
    parse_app_handle,
)
from tests.core.aws_batch.test_eks import assert_valid_requests


class NoCalls:
    """A Batch client that fails the test on any call: dry runs and bad input never call AWS."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"unexpected AWS call {name}")


def sched() -> AWSBatchScheduler:
    return create_scheduler("sess", client=NoCalls(), log_client=NoCalls(), docker_client=NoCalls(), unknown=1)


def trainer(**kw: Any) -> Role:
    base: dict[str, Any] = {
        "name": "trainer",
        "image": "busybox:local",
        "entrypoint": "python",
        "args": ["-m", "train", "--out", "/tmp/${app_id}"],
        "env": {"FOO": "bar"},
        "num_replicas": 2,
        "resource": Resource(cpu=4, gpu=0, memMB=2048),
    }
    base.update(kw)
    return Role(**base)


def one(**kw: Any) -> Role:
    """A role of one replica: rendered as a single-node (``container``) job."""
    return trainer(num_replicas=1, **kw)


FARGATE = {"platform": "FARGATE", "execution_role_arn": "arn:aws:iam::1:role/exec"}


def dryrun(app: AppDef, cfg: dict[str, Any] | None = None, labels: dict[str, str] | None = None) -> BatchJob:
    return sched().submit_dryrun(app, {"queue": "q1", **(cfg or {})}, labels).request


def container(job: BatchJob, i: int) -> dict[str, Any]:
    return job.job_def["nodeProperties"]["nodeRangeProperties"][i]["container"]


def env(job: BatchJob, i: int) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container(job, i)["environment"]}


def test_multiple_roles_become_node_ranges_main_node_0() -> None:
    ps = Role("ps", image="img:2", entrypoint="echo", args=["ps"], resource=Resource(1, 0, 512))
    job = dryrun(AppDef("my app!", roles=[trainer(), ps]))
    props = job.job_def["nodeProperties"]
    assert props["numNodes"] == 3
    assert props["mainNode"] == 0
    assert [r["targetNodes"] for r in props["nodeRangeProperties"]] == ["0:1", "2:2"]
    assert job.job_def["type"] == "multinode"
    assert job.job_def["platformCapabilities"] == ["EC2"]
    assert "containerProperties" not in job.job_def
    assert job.job_def["jobDefinitionName"] == job.name
    assert job.name.startswith("my-app-")
    c0, c1 = container(job, 0), container(job, 1)
    assert c0["image"] == "busybox:local" and c1["image"] == "img:2"
    assert c0["command"] == ["python", "-m", "train", "--out", f"/tmp/q1:{job.name}"]
    assert c1["command"] == ["echo", "ps"]
    assert c0["resourceRequirements"] == [{"type": "VCPU", "value": "4"}, {"type": "MEMORY", "value": "2048"}]
    assert c0["logConfiguration"] == {"logDriver": "awslogs"}
    assert c0["privileged"] is False
    assert env(job, 0)["FOO"] == "bar"
    assert env(job, 0)["TORCHX_ROLE_NAME"] == "trainer" and env(job, 0)["TORCHX_ROLE_FIRST_NODE"] == "0"
    assert env(job, 1)["TORCHX_ROLE_NAME"] == "ps" and env(job, 1)["TORCHX_ROLE_FIRST_NODE"] == "2"
    assert (env(job, 0)["TORCHX_ROLE_IDX"], env(job, 1)["TORCHX_ROLE_IDX"]) == ("0", "1")
    assert "TORCHX_RANK0_HOST" not in env(job, 0)
    # /dev/shm as large as the role's memory (TorchX's sharedMemorySize)
    assert c0["linuxParameters"] == {"sharedMemorySize": 2048}
    assert c1["linuxParameters"] == {"sharedMemorySize": 512}
    assert "instanceType" not in c0


def test_app_id_and_job_id_env_is_a_parseable_handle() -> None:
    info = sched().submit_dryrun(AppDef("a", roles=[trainer()]), {"queue": "arn:aws:batch:r:1:job-queue/q1"})
    job = info.request
    assert job.queue == "q1"
    assert job.app_id == f"q1:{job.name}"
    handle = env(job, 0)["TORCHX_JOB_ID"]
    assert parse_app_handle(handle) == ("aws_batch", "sess", job.app_id)
    assert "/" not in job.app_id and ".." not in job.app_id


def test_runner_style_job_id_macro_is_substituted_in_env_and_metadata() -> None:
    role = trainer(env={"TORCHX_JOB_ID": "aws_batch://sess/${app_id}", "OUT": "s3://b/${app_id}"})
    job = dryrun(AppDef("a", roles=[role], metadata={"run": "${app_id}"}))
    assert env(job, 0)["TORCHX_JOB_ID"] == f"aws_batch://sess/{job.app_id}"
    assert env(job, 0)["OUT"] == f"s3://b/{job.app_id}"
    assert job.job_def["tags"]["run"] == job.app_id


def test_replica_id_runs_under_sh_with_node_index_arithmetic() -> None:
    role = trainer(args=["--rank=${replica_id}", "it's"], env={"RANK": "${replica_id}"})
    job = dryrun(AppDef("a", roles=[trainer(name="first", num_replicas=3), role]))
    cmd = container(job, 1)["command"]
    assert cmd[:2] == ["sh", "-c"]
    assert REPLICA_ID_EXPR in cmd[2]
    assert env(job, 1)["TORCHX_ROLE_FIRST_NODE"] == "3"
    # Run the script with a real shell as node 4 (replica 1 of the second role).
    script = cmd[2].replace("exec python", "exec echo")
    out = subprocess.run(
        ["sh", "-c", script + '; echo "$RANK"'],
        env={"AWS_BATCH_JOB_NODE_INDEX": "4", "TORCHX_ROLE_FIRST_NODE": "3", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.split("\n")[0] == "--rank=1 it's"
    script_env = cmd[2].split("exec ")[0] + 'echo "$RANK"'
    out = subprocess.run(
        ["sh", "-c", script_env],
        env={"AWS_BATCH_JOB_NODE_INDEX": "5", "TORCHX_ROLE_FIRST_NODE": "3"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == "2"


def test_gpus_and_named_resource_instance_type() -> None:
    res = named_resources["aws_p3.8xlarge"]
    job = dryrun(AppDef("a", roles=[trainer(resource=res)]))
    c = container(job, 0)
    reqs = {r["type"]: r["value"] for r in c["resourceRequirements"]}
    assert reqs == {"VCPU": "32", "MEMORY": str(res.memMB), "GPU": "4"}
    assert c["instanceType"] == "p3.8xlarge"


def test_efa_devices_from_resource() -> None:
    res = Resource(cpu=8, gpu=1, memMB=4096, devices={"vpc.amazonaws.com/efa": 2})
    job = dryrun(AppDef("a", roles=[trainer(resource=res)]))
    devices = container(job, 0)["linuxParameters"]["devices"]
    assert [d["hostPath"] for d in devices] == ["/dev/infiniband/uverbs0", "/dev/infiniband/uverbs1"]


def test_every_mount_type() -> None:
    mounts = [
        BindMount(src_path="/data", dst_path="/mnt/data", read_only=True),
        VolumeMount(src="fs-0123456789abcdef0", dst_path="/efs"),
        DeviceMount(src_path="/dev/fuse", dst_path="/dev/fuse", permissions="rw"),
    ]
    c = container(dryrun(AppDef("a", roles=[trainer(mounts=mounts)])), 0)
    assert c["volumes"] == [
        {"name": "mount_0", "host": {"sourcePath": "/data"}},
        {"name": "mount_1", "efsVolumeConfiguration": {"fileSystemId": "fs-0123456789abcdef0"}},
    ]
    assert c["mountPoints"] == [
        {"containerPath": "/mnt/data", "readOnly": True, "sourceVolume": "mount_0"},
        {"containerPath": "/efs", "readOnly": False, "sourceVolume": "mount_1"},
    ]
    assert c["linuxParameters"]["sharedMemorySize"] == 2048
    assert c["linuxParameters"]["devices"] == [
        {"hostPath": "/dev/fuse", "containerPath": "/dev/fuse", "permissions": ["READ", "WRITE"]}
    ]


def test_ulimits_privileged_roles_share_priority_retries_tags() -> None:
    cfg = {
        "ulimits": ["nofile:1024:4096", "memlock:-1:-1", "core:0:0"],
        "privileged": True,
        "job_role_arn": "arn:aws:iam::1:role/job",
        "execution_role_arn": "arn:aws:iam::1:role/exec",
        "share_id": "teamA",
        "priority": 42,
        "user": "alice",
    }
    app = AppDef("a", roles=[trainer(max_retries=2), trainer(name="b", max_retries=4)], metadata={"team": "x"})
    job = dryrun(app, cfg, labels={"airflow.dag_id": "d", "airflow.task_id": "t"})
    c = container(job, 1)
    assert c["ulimits"] == [
        {"name": "nofile", "softLimit": 1024, "hardLimit": 4096},
        {"name": "memlock", "softLimit": -1, "hardLimit": -1},
        {"name": "core", "softLimit": 0, "hardLimit": 0},
    ]
    assert c["privileged"] is True
    assert c["jobRoleArn"] == "arn:aws:iam::1:role/job"
    assert c["executionRoleArn"] == "arn:aws:iam::1:role/exec"
    assert job.job_def["retryStrategy"] == {"attempts": 5}
    assert job.share_id == "teamA" and job.priority == 42
    req = job.submit_request()
    assert req["shareIdentifier"] == "teamA"
    assert req["schedulingPriorityOverride"] == 42
    assert req["jobQueue"] == "q1" and req["jobName"] == job.name
    tags = job.job_def["tags"]
    assert tags["airflow-torchx/user"] == "alice"
    assert tags["airflow-torchx/app-name"] == "a"
    assert tags["airflow-torchx/version"]
    assert tags["team"] == "x"
    assert tags["airflow-torchx/label/airflow.dag_id"] == "d"
    assert req["tags"] == tags and req["propagateTags"] is True
    assert job.name.startswith(labels_hash({"airflow.task_id": "t", "airflow.dag_id": "d"}) + "-a-")


def test_no_share_means_no_priority_override() -> None:
    req = dryrun(AppDef("a", roles=[trainer()])).submit_request()
    assert "shareIdentifier" not in req and "schedulingPriorityOverride" not in req


def test_dryrun_shows_definition_request_and_images_to_push() -> None:
    role = trainer(image="sha256:" + "ab" * 32)
    info = sched().submit_dryrun(AppDef("a", roles=[role]), {"queue": "q1", "image_repo": "127.0.0.1:5000/ws"})
    job = info.request
    assert job.images_to_push == {"sha256:" + "ab" * 32: ("127.0.0.1:5000/ws", "ab" * 32)}
    assert container(job, 0)["image"] == "127.0.0.1:5000/ws:" + "ab" * 32
    shown = json.loads(str(info))
    assert set(shown) == {"images_to_push", "job_definition", "submit_job"}
    assert info.app.roles[0].image == role.image


def test_job_names_are_valid_and_unique() -> None:
    names = {dryrun(AppDef("x" * 200 + " é:", roles=[trainer()])).name for _ in range(20)}
    assert len(names) == 20
    for name in names:
        assert len(name) <= 128
        assert all(ch.isalnum() or ch in "-_" for ch in name)


@pytest.mark.parametrize(
    ("cfg", "app", "match"),
    [
        ({"queue": None}, AppDef("a", roles=[trainer()]), "required option 'queue'"),
        ({"queue": "bad/queue"}, AppDef("a", roles=[trainer()]), "queue='bad/queue'"),
        ({"ulimits": ["nofile:10"]}, AppDef("a", roles=[trainer()]), "ulimits entry 'nofile:10'"),
        ({"ulimits": ["nofiles:1:2"]}, AppDef("a", roles=[trainer()]), "unknown name 'nofiles'"),
        ({"ulimits": ["nofile:9:2"]}, AppDef("a", roles=[trainer()]), "softLimit <= hardLimit"),
        ({"ulimits": ["nofile:-1:2"]}, AppDef("a", roles=[trainer()]), "softLimit <= hardLimit"),
        ({"ulimits": ["nofile:-2:2"]}, AppDef("a", roles=[trainer()]), "softLimit <= hardLimit"),
        ({"ulimits": ["nofile:a:2"]}, AppDef("a", roles=[trainer()]), "integer limits"),
        ({"priority": 10000}, AppDef("a", roles=[trainer()]), "priority=10000"),
        ({}, AppDef("a", roles=[trainer(resource=Resource(0, 0, 512))]), r"resource.cpu.*>= 1"),
        ({}, AppDef("a", roles=[trainer(resource=Resource(1, 0, 2))]), r"resource.memMB.*>= 4"),
        ({}, AppDef("a", roles=[trainer()]), None),
        ({}, AppDef("a", roles=[trainer(name=f"r{i}") for i in range(6)]), "at most 5 node ranges"),
        ({}, AppDef("a", roles=[trainer(num_replicas=600), trainer(name="b", num_replicas=401)]), "at most 1000"),
        ({}, AppDef("a", roles=[trainer(max_retries=10)]), "at most 10 attempts"),
        (
            {},
            AppDef("a", roles=[trainer(mounts=[BindMount("data", "/mnt")])]),
            r"mounts\[0\]: src='data' must be an absolute path",
        ),
        ({}, AppDef("a", roles=[trainer(mounts=[VolumeMount("myvol", "/mnt")])]), "not an EFS file system id"),
        (
            {},
            AppDef(
                "a",
                roles=[
                    trainer(resource=named_resources["aws_p3.2xlarge"]),
                    trainer(name="b", resource=named_resources["aws_g5.xlarge"]),
                ],
            ),
            "same instance type",
        ),
        ({}, AppDef("a", roles=[trainer(image="sha256:" + "0" * 64)]), "image_repo is not set"),
        ({}, AppDef("a", roles=[trainer(env={"MY-RANK": "${replica_id}"})]), "env: 'MY-RANK' uses"),
        ({}, AppDef("a", roles=[trainer()], metadata={f"k{i}": "v" for i in range(48)}), "at most 50"),
        # options, and options that only apply together with another
        ({"job_type": "array"}, AppDef("a", roles=[trainer()]), r"job_type='array' is not one of: auto, container"),
        ({"platform": "GKE"}, AppDef("a", roles=[trainer()]), r"platform='GKE' is not one of: EC2, FARGATE, EKS"),
        ({"retry_on": "spot"}, AppDef("a", roles=[trainer()]), r"retry_on='spot' is not one of: any, infra"),
        ({"shm_size": -1}, AppDef("a", roles=[trainer()]), r"shm_size=-1 must be an int >= 0"),
        (
            {"attempt_timeout": 59},
            AppDef("a", roles=[one()]),
            r"attempt_timeout=59 is below its minimum: it must be an int >= 60; attempt_timeout: .*AWS Batch's minimum",
        ),
        ({"attempt_timeout": 0}, AppDef("a", roles=[trainer()]), r"attempt_timeout=0 is below its minimum"),
        ({"attempt_timeout": "-90"}, AppDef("a", roles=[one()]), r"attempt_timeout=-90 is below its minimum"),
        ({"attempt_timeout": "1h"}, AppDef("a", roles=[one()]), r"attempt_timeout='1h' is not a valid int"),
        ({"attempt_timeout": 90.5}, AppDef("a", roles=[one()]), r"attempt_timeout=90.5 has type float; expected int"),
        ({"attempt_timeout": True}, AppDef("a", roles=[one()]), r"attempt_timeout=True has type bool; expected int"),
        (
            {"job_type": "container"},
            AppDef("a", roles=[trainer()]),
            "job_type=container runs one container.*2 replicas",
        ),
        ({"job_type": "container"}, AppDef("a", roles=[one(), one(name="b")]), "2 replicas in 2 roles"),
        ({"priority": 20}, AppDef("a", roles=[trainer()]), "priority=20 needs share_id.*fair-share"),
        (
            {"assign_public_ip": True},
            AppDef("a", roles=[one()]),
            "assign_public_ip=True applies only with platform=FARGATE",
        ),
        (FARGATE, AppDef("a", roles=[trainer()]), "platform=FARGATE runs single-node jobs only.*2 replicas in 1 roles"),
        ({**FARGATE, "job_type": "multinode"}, AppDef("a", roles=[one()]), "job_type=multinode"),
        ({**FARGATE, "execution_role_arn": None}, AppDef("a", roles=[one()]), "execution_role_arn is not set"),
        (
            {**FARGATE, "privileged": True},
            AppDef("a", roles=[one()]),
            "privileged=True does not apply with platform=FARGATE",
        ),
        (
            {**FARGATE, "ulimits": ["nofile:1:2"]},
            AppDef("a", roles=[one()]),
            "ulimits=.*does not apply with platform=FARGATE",
        ),
        (
            {**FARGATE, "shm_size": 1024},
            AppDef("a", roles=[one()]),
            "shm_size=1024 does not apply with platform=FARGATE",
        ),
        (FARGATE, AppDef("a", roles=[one(resource=Resource(4, 1, 8192))]), r"resource.gpu: .*Fargate has no GPUs"),
        (FARGATE, AppDef("a", roles=[one(resource=named_resources["aws_m5.xlarge"])]), "picks no instance types"),
        (FARGATE, AppDef("a", roles=[one(mounts=[BindMount("/data", "/mnt")])]), r"mounts\[0\]: a bind mount"),
        (
            FARGATE,
            AppDef("a", roles=[one(mounts=[DeviceMount("/dev/fuse", "/dev/fuse")])]),
            r"mounts\[0\]: a device mount",
        ),
        (
            FARGATE,
            AppDef("a", roles=[one(resource=Resource(2, 0, 3000))]),
            r"cpu=2 memMB=3000, a size Fargate does not offer \(cpu=2: memMB in 4096..16384 step 1024.*"
            r"nearest valid sizes: cpu=2 memMB=4096, cpu=1 memMB=3072, cpu=4 memMB=8192",
        ),
        (
            FARGATE,
            AppDef("a", roles=[one(resource=Resource(3, 0, 4096))]),
            r"cpu=3: no such vCPU count; vCPUs: 1, 2, 4, 8, 16\); nearest valid sizes: cpu=2 memMB=4096, "
            r"cpu=4 memMB=8192",
        ),
        (
            FARGATE,
            AppDef("a", roles=[one(resource=Resource(16, 0, 200_000))]),
            "nearest valid sizes: cpu=16 memMB=122880, cpu=8 memMB=61440, cpu=4 memMB=30720",
        ),
    ],
)
def test_bad_input_is_rejected_before_any_call(cfg: dict[str, Any], app: AppDef, match: str | None) -> None:
    if match is None:  # the baseline of the table renders fine
        dryrun(app, cfg)
        return
    with pytest.raises((InvalidRunConfigError, InvalidSpecError), match=match):
        sched().submit_dryrun(app, {"queue": "q1", **cfg})
    # ``submit`` too fails before its first AWS call (the client fails the test on any call)
    with pytest.raises((InvalidRunConfigError, InvalidSpecError), match=match):
        sched().submit(app, {"queue": "q1", **cfg})


def test_workspace_without_image_repo_fails_before_building() -> None:
    with pytest.raises(InvalidRunConfigError, match=r"image_repo is not set.*workspace"):
        sched().build_workspace_image(trainer(workspace="/tmp"), {"queue": "q"})
    assert sched().build_workspace_image(trainer(), {"queue": "q"}) is None


def test_helpers() -> None:
    assert queue_name("arn:aws:batch:us-east-1:123:job-queue/my_q") == "my_q"
    assert parse_ulimits(None) == []
    assert labels_hash({"a": "1", "b": "2"}) == labels_hash({"b": "2", "a": "1"}) != labels_hash({"a": "1"})
    opts = sched().run_opts()
    assert [k for k, _ in opts] == [
        "queue",
        "region",
        "profile",
        "user",
        "image_repo",
        "privileged",
        "share_id",
        "priority",
        "job_role_arn",
        "execution_role_arn",
        "ulimits",
        "quiet",
        "job_type",
        "platform",
        "assign_public_ip",
        "retry_on",
        "shm_size",
        "attempt_timeout",
        "max_gpu_hours",
        "start_timeout",
        "check_queue",
        "namespace",
        "service_account",
        "eks_log_group",
        "consumable_resources",
    ]
    assert opts.cfg_from_str("queue=q,ulimits=nofile:1:2,core:0:0,priority=3") == {
        "queue": "q",
        "ulimits": ["nofile:1:2", "core:0:0"],
        "priority": 3,
    }


# --------------------------------------------------------------------------- single-node jobs


def test_one_role_one_replica_is_a_container_job_field_by_field() -> None:
    role = one(args=["-m", "eval", "--shard", "${replica_id}", "--master", "$$${rank0_env}"], max_retries=2)
    job = dryrun(AppDef("ev", roles=[role]), {"job_role_arn": "arn:aws:iam::1:role/job"})
    handle = f"aws_batch://sess/{job.app_id}"
    assert job.job_def == {
        "jobDefinitionName": job.name,
        "type": "container",
        "containerProperties": {
            "image": "busybox:local",
            # no shell needed: replica 0 is the only replica, ${rank0_env} names localhost's variable
            "command": ["python", "-m", "eval", "--shard", "0", "--master", "$TORCHX_RANK0_HOST"],
            "environment": [
                {"name": "FOO", "value": "bar"},
                {"name": "TORCHX_JOB_ID", "value": handle},
                {"name": "TORCHX_ROLE_NAME", "value": "trainer"},
                {"name": "TORCHX_ROLE_IDX", "value": "0"},
                {"name": "TORCHX_ROLE_FIRST_NODE", "value": "0"},
                {"name": "TORCHX_RANK0_HOST", "value": "localhost"},
            ],
            "resourceRequirements": [{"type": "VCPU", "value": "4"}, {"type": "MEMORY", "value": "2048"}],
            "logConfiguration": {"logDriver": "awslogs"},
            "volumes": [],
            "mountPoints": [],
            "privileged": False,
            "ulimits": [],
            "linuxParameters": {"sharedMemorySize": 2048},
            "jobRoleArn": "arn:aws:iam::1:role/job",
        },
        "retryStrategy": {"attempts": 3},
        "platformCapabilities": ["EC2"],
        "propagateTags": True,
        "tags": job.job_def["tags"],
    }
    assert job.submit_request() == {
        "jobName": job.name,
        "jobQueue": "q1",
        "tags": job.job_def["tags"],
        "propagateTags": True,
    }


def test_job_type_decides_the_shape() -> None:
    assert dryrun(AppDef("a", roles=[one()]), {"job_type": "Container"}).job_def["type"] == "container"
    forced = dryrun(AppDef("a", roles=[one(args=["${replica_id}"])]), {"job_type": "multinode"}).job_def
    assert forced["type"] == "multinode" and "containerProperties" not in forced
    (rng,) = forced["nodeProperties"]["nodeRangeProperties"]
    assert rng["targetNodes"] == "0:0"
    assert rng["container"]["command"][:2] == ["sh", "-c"]  # replica id from the node index
    assert dryrun(AppDef("a", roles=[one(), one(name="b")])).job_def["type"] == "multinode"


def test_named_resource_of_a_single_node_job_requests_its_sizes_not_its_instance_type() -> None:
    res = named_resources["aws_p3.2xlarge"]
    c = dryrun(AppDef("a", roles=[one(resource=res)])).job_def["containerProperties"]
    reqs = {r["type"]: r["value"] for r in c["resourceRequirements"]}
    assert reqs == {"VCPU": "8", "MEMORY": str(res.memMB), "GPU": "1"}
    assert "instanceType" not in c  # AWS takes instanceType for multi-node jobs only
    multi = dryrun(AppDef("a", roles=[one(resource=res)]), {"job_type": "multinode"})
    assert container(multi, 0)["instanceType"] == "p3.2xlarge"


@pytest.mark.parametrize(
    ("component", "args"),
    [
        ("utils.echo", ["--msg", "hi ${replica_id}"]),
        ("utils.sh", ["echo", "$$TORCHX_ROLE_IDX"]),
        ("utils.python", ["-c", "print(1)"]),
        ("dist.spmd", ["-j", "1x2", "--script", "train.py"]),
    ],
)
def test_builtin_components_render_as_single_node_jobs(component: str, args: list[str]) -> None:
    from airflow_provider_torchx.core.runner import Runner

    runner = Runner("sess", {"aws_batch": lambda name, **kw: sched()})
    job = runner.dryrun_component(component, args, "aws_batch", {"queue": "q1"}).request
    assert job.job_def["type"] == "container"
    command = " ".join(job.job_def["containerProperties"]["command"])
    # every macro is substituted (what is left is the shell's own ``${OMP_NUM_THREADS:-1}``)
    assert not re.search(r"\$\{[a-z0-9_]+\}", command) and "\x00" not in command
    if component == "dist.spmd":
        assert "--nnodes 1" in command and "--rdzv_endpoint localhost:0" in command


# --------------------------------------------------------------------------- Fargate


def test_fargate_job_field_by_field() -> None:
    cfg = {**FARGATE, "assign_public_ip": True, "shm_size": 0, "retry_on": "infra"}
    mounts = [VolumeMount(src="fs-0123456789abcdef0", dst_path="/efs")]
    job = dryrun(AppDef("fg", roles=[one(resource=Resource(2, 0, 4096), mounts=mounts)]), cfg)
    c = job.job_def["containerProperties"]
    assert job.job_def["type"] == "container"
    assert job.job_def["platformCapabilities"] == ["FARGATE"]
    assert c["networkConfiguration"] == {"assignPublicIp": "ENABLED"}
    assert c["fargatePlatformConfiguration"] == {"platformVersion": "LATEST"}
    assert c["executionRoleArn"] == "arn:aws:iam::1:role/exec"
    assert c["resourceRequirements"] == [{"type": "VCPU", "value": "2"}, {"type": "MEMORY", "value": "4096"}]
    assert c["volumes"] == [{"name": "mount_0", "efsVolumeConfiguration": {"fileSystemId": "fs-0123456789abcdef0"}}]
    # fields AWS documents as "not applicable to jobs running on Fargate resources" are absent
    assert not {"privileged", "ulimits", "linuxParameters", "instanceType"} & set(c)
    assert dryrun(AppDef("fg", roles=[one(resource=Resource(1, 0, 2048))]), FARGATE).job_def["containerProperties"][
        "networkConfiguration"
    ] == {"assignPublicIp": "DISABLED"}


def test_every_fargate_size_with_a_whole_vcpu_count_is_accepted() -> None:
    from airflow_provider_torchx.core.schedulers.aws_batch.options import FARGATE_MEMORY

    assert sum(len(v) for v in FARGATE_MEMORY.values()) == 7 + 13 + 23 + 12 + 12
    for cpu, sizes in FARGATE_MEMORY.items():
        for mem in (sizes[0], sizes[-1]):
            job = dryrun(AppDef("fg", roles=[one(resource=Resource(cpu, 0, mem))]), FARGATE)
            assert job.job_def["platformCapabilities"] == ["FARGATE"]


# --------------------------------------------------------------------------- options


def test_retry_on_infra_retries_host_terminations_only() -> None:
    app = AppDef("a", roles=[one(max_retries=3)])
    assert dryrun(app).job_def["retryStrategy"] == {"attempts": 4}
    assert dryrun(app, {"retry_on": "any"}).job_def["retryStrategy"] == {"attempts": 4}
    assert dryrun(app, {"retry_on": "INFRA"}).job_def["retryStrategy"] == {
        "attempts": 4,
        "evaluateOnExit": [
            {"onStatusReason": "Host EC2*", "action": "RETRY"},
            {"onReason": "*", "action": "EXIT"},
        ],
    }
    multi = dryrun(AppDef("a", roles=[trainer(max_retries=1)]), {"retry_on": "infra"}).job_def
    assert multi["retryStrategy"]["attempts"] == 2 and len(multi["retryStrategy"]["evaluateOnExit"]) == 2


@pytest.mark.parametrize(("shm_size", "expected"), [(None, 2048), (8192, 8192), (0, None)])
def test_shm_size(shm_size: int | None, expected: int | None) -> None:
    cfg = {} if shm_size is None else {"shm_size": shm_size}
    for job in (dryrun(AppDef("a", roles=[one()]), cfg), dryrun(AppDef("a", roles=[trainer()]), cfg)):
        c = job.job_def.get("containerProperties") or container(job, 0)
        assert (c.get("linuxParameters") or {}).get("sharedMemorySize") == expected


@pytest.mark.parametrize("app", [AppDef("a", roles=[one()]), AppDef("a", roles=[trainer()])], ids=["single", "multi"])
def test_attempt_timeout_is_the_submitted_jobs_timeout(app: AppDef) -> None:
    """SubmitJob's ``timeout``, which AWS Batch applies to each attempt (of every node of a
    multi-node job); the job definition carries none, so the submit alone decides."""
    info = sched().submit_dryrun(app, {"queue": "q1", "attempt_timeout": "60"})
    assert info.request.submit_request()["timeout"] == {"attemptDurationSeconds": 60}
    assert json.loads(str(info))["submit_job"]["timeout"] == {"attemptDurationSeconds": 60}
    assert "timeout" not in info.request.job_def
    assert "timeout" not in dryrun(app).submit_request()


#: 2 nodes of 4 GPUs and 1 of 2: the job reserves 10 GPUs.
GPU_JOB = AppDef("g", roles=[trainer(resource=Resource(4, 4, 2048)), one(name="ps", resource=Resource(1, 2, 512))])


@pytest.mark.parametrize(
    ("cfg", "app", "seconds"),
    [
        pytest.param({"max_gpu_hours": 1.0}, GPU_JOB, 360, id="budget-over-the-reserved-gpus"),
        pytest.param({"max_gpu_hours": 1.0, "attempt_timeout": 300}, GPU_JOB, 300, id="attempt-timeout-shorter"),
        pytest.param({"max_gpu_hours": 1.0, "attempt_timeout": 900}, GPU_JOB, 360, id="budget-shorter"),
        pytest.param({"max_gpu_hours": 0.01}, GPU_JOB, 60, id="never-under-batchs-minimum"),
        pytest.param({"max_gpu_hours": 1.0}, AppDef("c", roles=[trainer()]), None, id="no-gpu-no-bound"),
        pytest.param({"max_gpu_hours": 1.0, "attempt_timeout": 120}, AppDef("c", roles=[one()]), 120, id="no-gpu"),
    ],
)
def test_a_gpu_budget_bounds_each_attempts_duration(cfg: dict[str, Any], app: AppDef, seconds: int | None) -> None:
    """``attemptDurationSeconds`` = budget hours over the GPUs reserved, never longer than
    ``attempt_timeout`` (``render.attempt_seconds``): Batch stops an attempt that would spend
    the budget with nobody watching. The request passes botocore's validation."""
    job = dryrun(app, cfg)
    assert job.submit_request().get("timeout") == (None if seconds is None else {"attemptDurationSeconds": seconds})
    assert_valid_requests(job)


@pytest.mark.parametrize("value", [0, -1, "inf"])
def test_a_bad_gpu_budget_is_refused_naming_it(value: object) -> None:
    with pytest.raises(InvalidRunConfigError, match=r"cfg: max_gpu_hours: .* is not allowed: expected a number"):
        dryrun(GPU_JOB, {"max_gpu_hours": value})


def test_priority_with_share_id_and_share_id_alone() -> None:
    job = dryrun(AppDef("a", roles=[one()]), {"share_id": "teamA", "priority": 20})
    assert job.submit_request()["shareIdentifier"] == "teamA"
    assert job.submit_request()["schedulingPriorityOverride"] == 20
    job = dryrun(AppDef("a", roles=[one()]), {"share_id": "teamA"})
    assert job.submit_request()["schedulingPriorityOverride"] == 0
    assert "shareIdentifier" not in dryrun(AppDef("a", roles=[one()]), {"priority": 0}).submit_request()


# What TorchX 0.7.0's aws_batch scheduler renders for a trainer role of 2 replicas and a ps role
# of 1 (its dry run, recorded): the fields a job written for TorchX depends on.
TORCHX_070_RANGES: list[dict[str, Any]] = [
    {
        "targetNodes": "0:1",
        "env": {"TORCHX_ROLE_IDX": "0", "TORCHX_ROLE_NAME": "trainer"},
        "linuxParameters": {"sharedMemorySize": 2048, "devices": []},
        "resourceRequirements": [{"type": "VCPU", "value": "4"}, {"type": "MEMORY", "value": "2048"}],
    },
    {
        "targetNodes": "2:2",
        "env": {"TORCHX_ROLE_IDX": "1", "TORCHX_ROLE_NAME": "ps"},
        "linuxParameters": {"sharedMemorySize": 512, "devices": []},
        "resourceRequirements": [{"type": "VCPU", "value": "1"}, {"type": "MEMORY", "value": "512"}],
    },
]


def test_multinode_rendering_keeps_what_torchx_070_renders() -> None:
    ps = Role("ps", image="img", entrypoint="echo", args=["ps"], resource=Resource(1, 0, 512))
    job = dryrun(AppDef("a", roles=[trainer(), ps]))
    assert job.job_def["type"] == "multinode"
    assert job.job_def["nodeProperties"]["mainNode"] == 0
    for i, theirs in enumerate(TORCHX_070_RANGES):
        rng = job.job_def["nodeProperties"]["nodeRangeProperties"][i]
        assert rng["targetNodes"] == theirs["targetNodes"]
        assert theirs["env"].items() <= env(job, i).items()
        # an empty device list is left out; the shared memory size is the same
        assert rng["container"]["linuxParameters"]["sharedMemorySize"] == theirs["linuxParameters"]["sharedMemorySize"]
        assert rng["container"]["resourceRequirements"] == theirs["resourceRequirements"]
        assert rng["container"]["logConfiguration"] == {"logDriver": "awslogs"}


# --------------------------------------------------------------------------- queue kinds


@pytest.mark.parametrize(
    ("kinds", "cfg", "app", "match"),
    [
        ({"SPOT"}, {}, AppDef("a", roles=[trainer()]), "runs on SPOT compute environments only.*no multi-node"),
        ({"FARGATE_SPOT"}, FARGATE, AppDef("a", roles=[one(resource=Resource(1, 0, 2048))]), None),
        ({"FARGATE"}, {}, AppDef("a", roles=[one()]), "set platform=FARGATE"),
        ({"EC2", "SPOT"}, FARGATE, AppDef("a", roles=[one(resource=Resource(1, 0, 2048))]), "EC2, SPOT compute"),
        ({"EC2", "SPOT"}, {}, AppDef("a", roles=[trainer()]), None),
        ({"SPOT"}, {}, AppDef("a", roles=[one()]), None),
        ({"UNMANAGED"}, {}, AppDef("a", roles=[trainer()]), None),
        ({"EC2"}, {"share_id": "teamA"}, AppDef("a", roles=[one()]), "share_id='teamA' applies only to a queue with"),
        ({"EC2", "fair-share"}, {}, AppDef("a", roles=[one()]), "share_id is not set, but queue='q1' has a fair-share"),
        ({"EC2", "fair-share"}, {"share_id": "teamA", "priority": 9}, AppDef("a", roles=[one()]), None),
    ],
)
def test_queue_that_cannot_run_the_job_is_refused_before_registering(
    kinds: set[str], cfg: dict[str, Any], app: AppDef, match: str | None
) -> None:
    from tests.core.aws_batch.fakes import FakeBatch

    batch = FakeBatch()
    if "fair-share" in kinds:
        batch.fair_share.add("q1")
    batch.queue_kinds["q1"] = sorted(kinds - {"fair-share"})
    s = create_scheduler("sess", client=batch, log_client=NoCalls(), docker_client=NoCalls())
    if match is None:
        s.submit(app, {"queue": "q1", **cfg})
        assert batch.names()[-2:] == ["register_job_definition", "submit_job"]
        return
    with pytest.raises(InvalidRunConfigError, match=match):
        s.submit(app, {"queue": "q1", **cfg})
    assert set(batch.names()) == {"describe_job_queues", "describe_compute_environments"}


def _with_checkpoints(app: AppDef, identity: TaskIdentity, root: str | None) -> AppDef:
    location = None if root is None else checkpoints.checkpoint_dir(root, identity)
    checkpoints.place(app, location, 0, host_paths=False)
    return app


def test_checkpoint_dir_on_every_node_iff_a_root_is_configured() -> None:
    """The same location for two tries of one task instance, another for another map index;
    ``retry_on=infra`` still renders its ``evaluateOnExit``."""
    ti = TaskIdentity("dag", "train", "manual__1", 0)

    def render(identity: TaskIdentity, root: str | None) -> BatchJob:
        ps = Role("ps", image="img:2", entrypoint="echo", args=["ps"], resource=Resource(1, 0, 512))
        app = _with_checkpoints(AppDef("a", roles=[trainer(max_retries=2), ps]), identity, root)
        return dryrun(app, {"retry_on": "infra"})

    first, second = render(ti, "s3://bucket/ckpt"), render(ti, "s3://bucket/ckpt")
    other = render(ti._replace(map_index=1), "s3://bucket/ckpt")
    where = "s3://bucket/ckpt/dag/manual__1/train/0"
    for job in (first, second):
        assert [env(job, i)["TORCHX_CHECKPOINT_DIR"] for i in (0, 1)] == [where, where]
        assert [env(job, i)["TORCHX_ATTEMPT"] for i in (0, 1)] == ["0", "0"]
        assert len(job.job_def["retryStrategy"]["evaluateOnExit"]) == 2
    assert env(other, 0)["TORCHX_CHECKPOINT_DIR"] == "s3://bucket/ckpt/dag/manual__1/train/1"
    bare = render(ti, None)
    assert all("TORCHX_CHECKPOINT_DIR" not in env(bare, i) for i in (0, 1))
    assert env(bare, 0)["TORCHX_ATTEMPT"] == "0"


def test_checkpoint_dir_on_batch_must_be_a_uri_or_under_a_mount() -> None:
    ti = TaskIdentity("dag", "train", "manual__1")
    efs = VolumeMount(src="fs-01234567", dst_path="/mnt/efs")
    job = dryrun(_with_checkpoints(AppDef("a", roles=[one(mounts=[efs])]), ti, "/mnt/efs/ckpt"))
    rendered = {e["name"]: e["value"] for e in job.job_def["containerProperties"]["environment"]}
    assert rendered["TORCHX_CHECKPOINT_DIR"] == "/mnt/efs/ckpt/dag/manual__1/train"
    with pytest.raises(InvalidRunConfigError, match=r"'/tmp/ckpt/dag/manual__1/train' is a local path"):
        _with_checkpoints(AppDef("a", roles=[one()]), ti, "/tmp/ckpt")
