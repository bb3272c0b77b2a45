"""The plugin's conversions between TorchX's types and the core's, both ways, field by field;
and what a TorchX app's macros become in the rendered Batch request (no AWS call)."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest
from torchx import specs as tx
from torchx.schedulers import api as tx_api
from torchx.specs.named_resources_aws import K8S_ITYPE

from airflow_provider_torchx.core import specs as ours
from airflow_provider_torchx.core.errors import InvalidSpecError
from airflow_provider_torchx.core.schedulers import api as ours_api
from airflow_provider_torchx.core.schedulers.aws_batch import render
from airflow_provider_torchx.core.schedulers.aws_batch.run_options import run_opts
from airflow_provider_torchx.torchx_plugin import convert
from airflow_provider_torchx.torchx_plugin.scheduler import create_scheduler

EFA = "vpc.amazonaws.com/efa"


def test_every_resource_field_goes_in_and_comes_back() -> None:
    res = tx.Resource(
        cpu=8,
        gpu=1,
        memMB=62464,
        capabilities={K8S_ITYPE: "p3.2xlarge", "custom": 1},
        devices={EFA: 2},
        tags={"torchx/named_resources.name": "aws_p3.2xlarge"},
    )
    mine = convert.resource_in(res)
    assert mine == ours.Resource(
        cpu=8, gpu=1, memMB=62464, capabilities={ours.INSTANCE_TYPE: "p3.2xlarge", "custom": 1}, devices={EFA: 2}
    )
    back = convert.resource_out(mine)
    assert {f.name for f in fields(tx.Resource)} == {"cpu", "gpu", "memMB", "capabilities", "devices", "tags"}
    assert back == tx.Resource(
        cpu=8, gpu=1, memMB=62464, capabilities={K8S_ITYPE: "p3.2xlarge", "custom": 1}, devices={EFA: 2}
    )
    assert back.tags == {}  # tags are read by no scheduler: they do not go in


def test_torchx_named_aws_resource_pins_the_instance_type_of_a_multinode_job() -> None:
    app = tx.AppDef(
        "big",
        roles=[tx.Role("trainer", "img", entrypoint="train", num_replicas=2, resource=tx.resource(h="aws_p3.2xlarge"))],
    )
    job = create_scheduler("t").submit_dryrun(app, {"queue": "q", "job_type": "multinode"}).request
    container = job.job_def["nodeProperties"]["nodeRangeProperties"][0]["container"]
    assert container["instanceType"] == "p3.2xlarge"


def test_two_different_instance_types_in_one_resource_are_refused_naming_the_field() -> None:
    res = tx.Resource(cpu=1, gpu=0, memMB=64, capabilities={K8S_ITYPE: "p3.2xlarge", "instanceType": "g5.xlarge"})
    with pytest.raises(InvalidSpecError, match=r"roles\[0\]\.resource\.capabilities: .*p3\.2xlarge.*g5\.xlarge"):
        convert.resource_in(res, "roles[0].resource")


@pytest.mark.parametrize(
    ("theirs", "mine"),
    [
        (tx.BindMount("/data", "/mnt/data", read_only=True), ours.BindMount("/data", "/mnt/data", read_only=True)),
        (tx.VolumeMount("fs-0123abcd", "/efs"), ours.VolumeMount("fs-0123abcd", "/efs")),
        (tx.DeviceMount("/dev/fuse", "/dev/fuse", "rw"), ours.DeviceMount("/dev/fuse", "/dev/fuse", "rw")),
    ],
)
def test_each_kind_of_mount_goes_in_and_comes_back(
    theirs: tx.BindMount | tx.VolumeMount | tx.DeviceMount, mine: ours.Mount
) -> None:
    assert convert.mount_in(theirs, "roles[0].mounts[0]") == mine
    assert convert.mount_out(mine) == theirs


@pytest.mark.parametrize("policy", list(tx.RetryPolicy))
def test_every_retry_policy_goes_in_and_comes_back(policy: tx.RetryPolicy) -> None:
    role = tx.Role("r", "img", entrypoint="x", max_retries=3, retry_policy=policy)
    mine = convert.role_in(role, 0)
    assert (mine.retry_policy.value, mine.max_retries) == (policy.value, 3)
    assert convert.role_out(mine).retry_policy is policy


def test_every_role_field_goes_in_and_comes_back() -> None:
    role = tx.Role(
        "trainer",
        "img:1",
        entrypoint="python",
        args=["-m", "train", f"--id={tx.macros.app_id}"],
        env={"A": "1"},
        num_replicas=4,
        min_replicas=2,
        max_retries=2,
        retry_policy=tx.RetryPolicy.REPLICA,
        resource=tx.Resource(cpu=2, gpu=0, memMB=2048, devices={EFA: 1}),
        port_map={"tensorboard": 6006, "c10d": 29500},
        metadata={"team": "ml"},
        mounts=[tx.BindMount("/a", "/b")],
    )
    mine = convert.role_in(role, 0)
    assert mine == ours.Role(
        name="trainer",
        image="img:1",
        entrypoint="python",
        args=["-m", "train", "--id=${app_id}"],
        env={"A": "1"},
        num_replicas=4,
        min_replicas=2,
        max_retries=2,
        retry_policy=ours.RetryPolicy.REPLICA,
        resource=ours.Resource(cpu=2, gpu=0, memMB=2048, devices={EFA: 1}),
        port_map={"tensorboard": 6006, "c10d": 29500},
        metadata={"team": "ml"},
        mounts=[ours.BindMount("/a", "/b")],
    )
    assert convert.role_out(mine) == role
    assert convert.role_out(ours.Role("r")).entrypoint == tx.MISSING
    assert convert.role_in(tx.Role("r", "img"), 0).entrypoint == ""  # the core then names the field


def test_the_macros_are_the_same_strings_on_both_sides() -> None:
    for name in ("img_root", "app_id", "replica_id", "rank0_env"):
        assert getattr(tx.macros, name) == getattr(ours.macros, name)


def test_macros_are_substituted_in_a_multinode_request() -> None:
    rank0 = f"$${{{tx.macros.rank0_env}}}"
    app = tx.AppDef(
        "m",
        roles=[
            tx.Role(
                "trainer",
                "img",
                entrypoint="echo",
                args=[tx.macros.app_id, tx.macros.replica_id, rank0, f"[{tx.macros.img_root}]"],
                env={"REPLICA": tx.macros.replica_id},
                num_replicas=2,
                resource=tx.Resource(cpu=1, gpu=0, memMB=64),
                metadata={"where": tx.macros.app_id},
            )
        ],
        metadata={"app": tx.macros.app_id},
    )
    job = create_scheduler("t").submit_dryrun(app, {"queue": "q"}).request
    container = job.job_def["nodeProperties"]["nodeRangeProperties"][0]["container"]
    expr = render.REPLICA_ID_EXPR
    script = container["command"][2]
    assert container["command"][:2] == ["sh", "-c"]
    assert f'export REPLICA="{expr}"; exec echo q:{job.name} "{expr}"' in script
    assert f"${{{render.RANK0_ENV}}}" in script and "'[]'" in script  # img_root: none on Batch
    assert job.job_def["tags"]["app"] == job.app_id


def test_a_single_node_request_has_replica_0_and_localhost_as_rank0() -> None:
    role = tx.Role(
        "main",
        "img",
        entrypoint="echo",
        args=[tx.macros.replica_id, f"$${{{tx.macros.rank0_env}}}"],
        resource=tx.Resource(cpu=1, gpu=0, memMB=64),
    )
    job = create_scheduler("t").submit_dryrun(tx.AppDef("s", roles=[role]), {"queue": "q"}).request
    props = job.job_def["containerProperties"]
    assert props["command"] == ["echo", "0", f"${{{render.RANK0_HOST_ENV}}}"]
    assert {"name": render.RANK0_HOST_ENV, "value": "localhost"} in props["environment"]


@pytest.mark.parametrize(
    ("cfg", "platform", "retry"),
    [
        ({"platform": "FARGATE", "execution_role_arn": "arn:aws:iam::1:role/x"}, "FARGATE", {"attempts": 2}),
        (
            {"retry_on": "infra"},
            "EC2",
            {
                "attempts": 2,
                "evaluateOnExit": [
                    {"onStatusReason": "Host EC2*", "action": "RETRY"},
                    {"onReason": "*", "action": "EXIT"},
                ],
            },
        ),
    ],
)
def test_a_single_replica_is_a_single_node_job_for_fargate_and_spot_queues(
    cfg: dict[str, str], platform: str, retry: dict[str, object]
) -> None:
    role = tx.Role("main", "img", entrypoint="echo", max_retries=1, resource=tx.Resource(cpu=1, gpu=0, memMB=2048))
    job = create_scheduler("t").submit_dryrun(tx.AppDef("s", roles=[role]), {"queue": "q", **cfg}).request
    assert (job.job_def["type"], job.job_def["platformCapabilities"]) == ("container", [platform])
    assert job.job_def["retryStrategy"] == retry


def test_run_options_come_out_with_their_types_defaults_help_and_required() -> None:
    mine = run_opts()
    theirs = convert.runopts_out(mine)
    types = {str: str, int: int, float: float, bool: bool, list: list[str], dict: dict[str, str]}
    assert [k for k, _ in theirs] == [k for k, _ in mine]
    for key, opt in mine:
        out = theirs.get(key)
        assert out is not None
        assert (out.opt_type, out.default, out.is_required, out.help) == (
            types[opt.opt_type],
            opt.default,
            opt.is_required,
            opt.help,
        )
    assert theirs.resolve({"queue": "q", "ulimits": ["nofile:1:2"]})["ulimits"] == ["nofile:1:2"]


def test_a_description_goes_out_with_states_replicas_roles_and_labels() -> None:
    desc = ours_api.DescribeAppResponse(
        app_id="q:job-1",
        state=ours.AppState.FAILED,
        num_restarts=1,
        msg="trainer[1] exited 3",
        ui_url="https://console/#jobs/detail/1",
        roles_statuses=[
            ours.RoleStatus(
                "trainer",
                [
                    ours.ReplicaStatus(0, ours.AppState.SUCCEEDED, "trainer", hostname="10.0.0.1", exit_code=0),
                    ours.ReplicaStatus(1, ours.AppState.FAILED, "trainer", structured_error_msg='{"m": 1}'),
                ],
            )
        ],
        roles=[ours.Role("trainer", image="img", entrypoint="sh", num_replicas=2)],
        labels={"dag": "d"},
    )
    out = convert.describe_out(desc)
    assert isinstance(out, tx_api.DescribeAppResponse)
    assert (out.app_id, out.state, out.num_restarts, out.msg, out.ui_url, out.metadata) == (
        "q:job-1",
        tx.AppState.FAILED,
        1,
        "trainer[1] exited 3",
        "https://console/#jobs/detail/1",
        {"dag": "d"},
    )
    assert out.structured_error_msg == tx.NONE  # TorchX's "unset"
    assert [(r.id, r.state, r.role, r.hostname, r.structured_error_msg) for r in out.roles_statuses[0].replicas] == [
        (0, tx.AppState.SUCCEEDED, "trainer", "10.0.0.1", tx.NONE),
        (1, tx.AppState.FAILED, "trainer", "", '{"m": 1}'),
    ]
    assert [(r.name, r.num_replicas, r.entrypoint) for r in out.roles] == [("trainer", 2, "sh")]


@pytest.mark.parametrize("state", list(ours.AppState))
def test_every_state_keeps_its_name_and_number(state: ours.AppState) -> None:
    out = convert.state_out(state)
    assert (out.name, out.value) == (state.name, state.value)
    listed = convert.list_out(ours_api.ListAppResponse("q:j", state, name="j"))
    assert (listed.app_id, listed.state, listed.name) == ("q:j", out, "j")


def test_streams_go_in_by_name() -> None:
    assert [convert.stream_in(s) for s in tx_api.Stream] == list(ours_api.Stream)
    assert convert.stream_in(None) is None


def test_a_dry_run_is_the_cores_batch_job_shown_as_json() -> None:
    role = tx.Role("main", "img", entrypoint="echo", resource=tx.Resource(cpu=1, gpu=0, memMB=64))
    info = create_scheduler("t").submit_dryrun(tx.AppDef("s", roles=[role]), {"queue": "q"})
    assert isinstance(info.request, render.BatchJob)
    assert json.loads(repr(info))["submit_job"]["jobQueue"] == "q"


@pytest.mark.parametrize(
    ("msg", "shown"),
    [
        ("airflow-torchx: cancel requested through aws_batch: TorchX", "cancelled by TorchX"),
        (
            "airflow-torchx: cancel requested by reaper through aws_batch: the orphaned-jobs rule",
            "cancelled by the orphaned-jobs rule",
        ),
        ("airflow-torchx: cancel requested through aws_batch", "cancelled"),
        ("Essential container in task exited; exit code 1", "Essential container in task exited; exit code 1"),
    ],
)
def test_a_cancel_is_said_in_torchx_terms(msg: str, shown: str) -> None:
    """TorchX shows who cancelled, not the reason the core gives Batch (which names this package)."""
    assert convert.msg_out(msg) == shown
