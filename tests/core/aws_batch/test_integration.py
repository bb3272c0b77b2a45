"""The AWS Batch scheduler end to end: a real moto server over HTTP on loopback, running every
node as a real container on a real Docker engine, output read back from CloudWatch Logs.

Asserts only what moto models: submit, state progression, terminate with a reason,
tags, ``nodeProperties``, output in CloudWatch after the container exits, one log stream for
all nodes; single-node (``container``) jobs, whose exit code moto gives in ListJobs only, also
on Fargate and Spot queues (moto runs them as plain containers: no placement, sizes or
reclaims). Exit codes of multi-node jobs, child jobs, ListJobs pages, CancelJob before start,
attempts and Spot reclaims are covered on AWS-shaped responses in ``test_status.py``.
"""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from airflow_provider_torchx.core.errorfile import find_root_cause
from airflow_provider_torchx.core.errors import InvalidRunConfigError, UnknownQueueError
from airflow_provider_torchx.core.runner import get_runner
from airflow_provider_torchx.core.schedulers.aws_batch import AWSBatchScheduler, BatchJob, create_scheduler
from airflow_provider_torchx.core.schedulers.aws_batch.poller import StatusPoller
from airflow_provider_torchx.core.schedulers.aws_batch.sweep import sweep_plan
from airflow_provider_torchx.core.specs import AppDef, AppState, Resource, Role, parse_app_handle
from tests.fixtures.aws import FlakyProxy, add_job_queue, create_job_queue

pytestmark = [pytest.mark.docker, pytest.mark.timeout(120)]

IMAGE = "busybox:local"


def role(name: str, script: str, replicas: int = 1) -> Role:
    return Role(
        name,
        image=IMAGE,
        entrypoint="sh",
        args=["-c", script],
        num_replicas=replicas,
        resource=Resource(cpu=1, gpu=0, memMB=64),
    )


@pytest.fixture
def sched(batch_queue: str) -> Iterator[AWSBatchScheduler]:
    s = create_scheduler("itest")
    s.poller.min_interval = 0.2  # the shared moto poller: rounds 0.2 s apart in tests
    yield s
    s.close()


def wait_state(
    s: AWSBatchScheduler, app_id: str, reached: Callable[[AppState], bool], timeout: float = 60.0
) -> tuple[Any, set[AppState]]:
    """Poll until the job's state is ``reached``; its description then and every state seen."""
    seen: set[AppState] = set()
    deadline = time.monotonic() + timeout
    while True:
        desc = s.describe(app_id)
        assert desc is not None
        seen.add(desc.state)
        if reached(desc.state):
            return desc, seen
        assert time.monotonic() < deadline, f"{app_id} still {desc.state} after {timeout}s"
        time.sleep(0.2)


def wait_terminal(s: AWSBatchScheduler, app_id: str, timeout: float = 60.0) -> tuple[Any, set[AppState]]:
    return wait_state(s, app_id, AppState.is_terminal, timeout)


def wait_running(s: AWSBatchScheduler, app_id: str, timeout: float = 30.0) -> None:
    wait_state(s, app_id, lambda state: state == AppState.RUNNING, timeout)


def test_two_roles_run_to_success_with_every_nodes_output(batch_queue: str) -> None:
    app = AppDef(
        "hello",
        roles=[
            role("trainer", 'sleep 1; echo "trainer says $TORCHX_JOB_ID"', replicas=2),
            role("ps", "echo ps-ready; sleep 1"),
        ],
    )
    with get_runner("itest") as runner:
        handle = runner.run(app, "aws_batch", cfg={"queue": batch_queue})
        sched_name, session, app_id = parse_app_handle(handle)
        assert (sched_name, session) == ("aws_batch", "itest")
        assert app_id.startswith(f"{batch_queue}:hello-")
        seen = set()
        while True:
            status = runner.status(handle)
            assert status is not None
            seen.add(status.state)
            if status.is_terminal():
                break
            time.sleep(0.2)
        assert AppState.RUNNING in seen
        assert status.state == AppState.SUCCEEDED, status
        assert [len(r.replicas) for r in status.roles] == [2, 1]
        # usage from moto's createdAt/startedAt/stoppedAt and attempts: each node ran while
        # the job ran (moto has no child jobs), at least the 1 s every node sleeps
        usage = status.usage
        assert usage is not None and usage.queue_wait_s is not None and usage.run_time_s is not None
        assert usage.queue_wait_s >= 0 and usage.run_time_s >= 1.0
        assert [(a.role, a.replica, a.number) for a in usage.attempts] == [
            ("trainer", 0, 1),
            ("trainer", 1, 1),
            ("ps", 0, 1),
        ]
        trainer, ps = usage.roles
        assert trainer.node_seconds == pytest.approx(2 * ps.node_seconds) and ps.node_seconds >= 1.0
        assert trainer.vcpu_hours == pytest.approx(trainer.node_seconds / 3600)
        assert ps.memory_gb_hours == pytest.approx(64 / 1024 * ps.node_seconds / 3600)
        # moto: every node writes into one stream, so each role's log holds all nodes' output
        lines = list(runner.log_lines(handle, "trainer", 1))
        assert lines.count(f"trainer says {handle}\n") == 2
        assert "ps-ready\n" in lines
        chunk = runner.read_log(handle, "ps", 0, max_lines=1)
        rest = runner.read_log(handle, "ps", 0, cursor=chunk.cursor)
        assert chunk.lines + rest.lines == lines and rest.eof


def test_failing_command_ends_failed(sched: AWSBatchScheduler, batch_queue: str) -> None:
    app = AppDef("fails", roles=[role("main", "echo about to fail; exit 3")])
    app_id = sched.submit(app, {"queue": batch_queue, "job_type": "multinode"})
    # tailing from the submit on blocks until the job ended and its log is drained
    assert list(sched.log_iter(app_id, "main", 0, should_tail=True)) == ["about to fail\n"]
    desc = sched.describe(app_id)
    assert desc is not None
    assert desc.state == AppState.FAILED
    assert [r.state for r in desc.roles_statuses[0].replicas] == [AppState.FAILED]
    assert not desc.cancel_requested
    assert list(sched.log_iter(app_id, "main", 0)) == ["about to fail\n"]


def test_cancel_ends_cancelled_and_stops_the_containers(
    sched: AWSBatchScheduler, batch_queue: str, docker_engine: str
) -> None:
    app = AppDef("sleeper", roles=[role("main", "echo started; sleep 60", replicas=2)])
    app_id = sched.submit(app, {"queue": batch_queue})
    wait_running(sched, app_id)
    sched.cancel(app_id)
    desc, _ = wait_terminal(sched, app_id, timeout=30)
    assert desc.state == AppState.CANCELLED
    assert desc.cancel_requested
    assert "cancel requested" in desc.msg
    sched.cancel(app_id)  # idempotent on a terminal job
    job_id = sched.poller.job_id(app_id)
    assert job_id and _containers_left(docker_engine, job_id) == []


def _containers_left(docker_engine: str, job_id: str, timeout: float = 15.0) -> list[str]:
    """The job's containers still there after up to ``timeout`` s (moto reports the job FAILED
    a moment before it removes the killed containers). Names come from one listing call: the
    high-level listing inspects each container after listing it, and one removed in between
    raised ``NotFound``."""
    import docker

    client = docker.DockerClient(base_url=docker_engine)
    deadline = time.monotonic() + timeout
    try:
        while (
            left := [name for c in client.api.containers(all=True) for name in c["Names"] if job_id in name]
        ) and time.monotonic() < deadline:
            time.sleep(0.2)
        return left
    finally:
        client.close()


def test_single_node_job_runs_to_success_with_its_output(batch_queue: str) -> None:
    script = 'echo "replica ${replica_id} of role $TORCHX_ROLE_IDX"; echo "job $TORCHX_JOB_ID"'
    app = AppDef("single", roles=[role("main", script)])
    with get_runner("itest") as runner:
        handle = runner.run(app, "aws_batch", cfg={"queue": batch_queue})
        native = runner.describe_native(handle)
        assert native is not None and native.request.job_def["type"] == "container"
        assert "nodeProperties" not in native.request.job_def
        seen = set()
        while not (status := runner.status(handle)).is_terminal():  # type: ignore[union-attr]
            seen.add(status.state)  # type: ignore[union-attr]
            time.sleep(0.2)
        assert status is not None and status.state == AppState.SUCCEEDED, status
        assert AppState.RUNNING in seen or AppState.PENDING in seen
        assert [[(r.id, r.state) for r in rs.replicas] for rs in status.roles] == [[(0, AppState.SUCCEEDED)]]
        assert "#jobs/detail/" in status.ui_url
        usage = status.usage  # a container job: its one replica is the job (1 vCPU, 64 MiB)
        # (moto leaves a succeeded container job's exit code out)
        assert usage is not None and [(a.role, a.replica) for a in usage.attempts] == [("main", 0)]
        (main,) = usage.roles
        assert main.node_seconds == usage.attempts[0].seconds and main.vcpu_hours == main.node_seconds / 3600
        expected = ["replica 0 of role 0\n", f"job {handle}\n"]
        assert list(runner.log_lines(handle, "main", 0)) == expected
        first = runner.read_log(handle, "main", 0, max_lines=1)
        rest = runner.read_log(handle, "main", 0, cursor=first.cursor)
        assert (first.lines, rest.lines, rest.eof) == (expected[:1], expected[1:], True)
        desc = runner.describe(handle)
        assert desc is not None
        assert [(r.name, r.num_replicas, r.entrypoint) for r in desc.roles] == [("main", 1, "sh")]


def test_single_node_failing_job_ends_failed_with_its_exit_code(sched: AWSBatchScheduler, batch_queue: str) -> None:
    app_id = sched.submit(AppDef("fails1", roles=[role("main", "echo about to fail; exit 3")]), {"queue": batch_queue})
    assert list(sched.log_iter(app_id, "main", 0, should_tail=True)) == ["about to fail\n"]
    desc, _ = wait_terminal(sched, app_id)
    assert desc.state == AppState.FAILED
    (replica,) = desc.roles_statuses[0].replicas
    assert (replica.state, replica.exit_code) == (AppState.FAILED, 3)
    assert "role 'main' replica 0 exited with code 3" in desc.msg
    assert desc.usage is not None and [a.exit_code for a in desc.usage.attempts] == [3]
    batch = boto3.client("batch")
    arn = batch.describe_jobs(jobs=[sched.poller.job_id(app_id)])["jobs"][0]["jobDefinition"]
    sched.delete(app_id)
    assert batch.describe_job_definitions(jobDefinitions=[arn])["jobDefinitions"][0]["status"] == "INACTIVE"


def test_single_node_cancel_ends_cancelled_and_leaves_no_container(
    sched: AWSBatchScheduler, batch_queue: str, docker_engine: str
) -> None:
    app_id = sched.submit(AppDef("sleeper1", roles=[role("main", "echo started; sleep 60")]), {"queue": batch_queue})
    wait_running(sched, app_id)
    sched.cancel(app_id, reason="airflow-torchx cancel by alice@box")
    desc, _ = wait_terminal(sched, app_id, timeout=30)
    assert desc.state == AppState.CANCELLED and desc.cancel_requested
    assert desc.cancel_reason == "airflow-torchx cancel by alice@box" and "by alice@box" in desc.msg
    job_id = sched.poller.job_id(app_id)
    assert job_id and _containers_left(docker_engine, job_id) == []


@pytest.fixture(scope="module")
def managed_queues(aws_env: str) -> dict[str, str]:
    """Queues on moto's MANAGED compute environments, by kind (``FARGATE``, ``SPOT``), and the
    execution role: moto runs their jobs as containers too (it models no placement)."""
    ec2, iam, batch = (boto3.client(name) for name in ("ec2", "iam", "batch"))
    vpc = ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.9.0.0/24")["Subnet"]["SubnetId"]
    group = ec2.create_security_group(GroupName="torchx-test", Description="tests", VpcId=vpc)["GroupId"]
    role = iam.create_role(RoleName="torchx-test-managed", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    profile = iam.create_instance_profile(InstanceProfileName="torchx-test")["InstanceProfile"]["Arn"]
    queues = {"execution_role": role}
    for kind in ("FARGATE", "SPOT"):
        resources: dict[str, Any] = {"type": kind, "maxvCpus": 16, "subnets": [subnet], "securityGroupIds": [group]}
        if kind == "SPOT":
            resources.update(minvCpus=0, desiredvCpus=0, instanceTypes=["optimal"], instanceRole=profile)
        env = batch.create_compute_environment(
            computeEnvironmentName=f"torchx-test-{kind.lower()}",
            type="MANAGED",
            state="ENABLED",
            serviceRole=role,
            computeResources=resources,
        )["computeEnvironmentArn"]
        queues[kind] = add_job_queue(batch, f"torchx-test-{kind.lower()}", env)
    return queues


def test_single_node_jobs_run_on_fargate_and_spot_queues_and_multinode_is_refused_there(
    sched: AWSBatchScheduler, managed_queues: dict[str, str]
) -> None:
    app = AppDef("managed", roles=[role("main", "echo on $TORCHX_ROLE_NAME")])
    app.roles[0].resource = Resource(cpu=1, gpu=0, memMB=2048)  # a Fargate size
    fargate = {"platform": "FARGATE", "execution_role_arn": managed_queues["execution_role"]}
    runs = [
        sched.submit(app, {"queue": managed_queues["FARGATE"], **fargate}),
        sched.submit(app, {"queue": managed_queues["SPOT"], "retry_on": "infra"}),
    ]
    for app_id in runs:
        desc, _ = wait_terminal(sched, app_id)
        assert desc.state == AppState.SUCCEEDED, desc
        assert list(sched.log_iter(app_id, "main", 0)) == ["on main\n"]
    batch = boto3.client("batch")
    arn = batch.describe_jobs(jobs=[sched.poller.job_id(runs[0])])["jobs"][0]["jobDefinition"]
    (registered,) = batch.describe_job_definitions(jobDefinitions=[arn])["jobDefinitions"]
    assert (registered["type"], registered["platformCapabilities"]) == ("container", ["FARGATE"])
    assert registered["containerProperties"]["networkConfiguration"] == {"assignPublicIp": "DISABLED"}
    defs_before = len(batch.describe_job_definitions()["jobDefinitions"])
    two = AppDef("managed2", roles=[role("main", "true", replicas=2)])
    with pytest.raises(InvalidRunConfigError, match="runs on SPOT compute environments only"):
        sched.submit(two, {"queue": managed_queues["SPOT"]})
    with pytest.raises(
        InvalidRunConfigError, match=r"queue='torchx-test-fargate' runs on FARGATE.*set platform=FARGATE"
    ):
        sched.submit(app, {"queue": managed_queues["FARGATE"]})
    with pytest.raises(InvalidRunConfigError, match="platform=FARGATE, but queue='torchx-test-spot' runs on SPOT"):
        sched.submit(app, {"queue": managed_queues["SPOT"], **fargate})
    assert len(batch.describe_job_definitions()["jobDefinitions"]) == defs_before


def test_list_live_lists_the_jobs_that_have_not_ended(sched: AWSBatchScheduler, batch_queue: str) -> None:
    """What the orphaned-jobs reaper lists each round: live jobs, with their labels; ended
    ones are left out (Batch keeps them for days)."""
    labels = {"airflow.dag_id": "d", "airflow.task_id": "t", "airflow.run_id": "live", "airflow.map_index": "-1"}
    cfg = {"queue": batch_queue}
    ended = sched.submit(
        AppDef("ended", roles=[role("main", "echo done")]), cfg, labels={**labels, "airflow.run_id": "x"}
    )
    wait_terminal(sched, ended)
    live = sched.submit(AppDef("live", roles=[role("main", "sleep 60")]), cfg, labels=labels)
    try:
        listed = {a.app_id: a for a in create_scheduler("elsewhere").list_live(cfg)}
        assert live in listed and ended not in listed, listed
        assert listed[live].labels == labels and not listed[live].state.is_terminal()
        assert all(not a.state.is_terminal() for a in listed.values())
    finally:
        sched.cancel(live)


def sweep_note(poller: StatusPoller) -> str:
    """What the change sweep had planned when a look it should have answered did not come: the
    groups of scheduled jobs (their sizes), its plan, its next listings and its thread."""
    sweep = poller.sweep
    sizes = sweep.sizes(poller._sweep_groups())
    plan = sweep_plan(sizes)
    thread = sweep._thread is not None and sweep._thread.is_alive()
    now = time.monotonic()
    due = {g: round(at - now, 1) for g, at in sweep._next.items()}
    alive = f"calls {sweep.calls}, thread alive {thread}"
    return f"no answer: groups {sizes}, plan {plan}, next listing in {due} s, {alive}"


def test_the_change_sweep_answers_a_scheduled_look_once_the_job_leaves_its_status(
    sched: AWSBatchScheduler, aws_env: str
) -> None:
    """Three PENDING jobs (a dependency that never finishes) looked at on a 60 s schedule: once
    one is terminated, the change sweep's ``ListJobs(PENDING)`` (every 15 s: four times a
    period) misses it and the next round describes it, long before its scheduled look; the two
    still listed wait for theirs. The jobs have a queue and a poller of their own: by design
    the sweep leaves a group to its scheduled looks when its listing is mostly other jobs, or
    when larger groups take the listing budget, and the shared queue and the process's poller
    hold whatever other tests left there."""
    queue = create_job_queue(f"torchx-sweep-{uuid.uuid4().hex[:8]}")
    batch = boto3.client("batch")
    poller = StatusPoller(batch, min_interval=0.2)
    app = AppDef("sweep", roles=[role("main", "true")])
    ids: list[str] = []
    definition = None
    for _ in range(3):
        job = sched.submit_dryrun(app, {"queue": queue}).request
        definition = definition or batch.register_job_definition(**job.job_def)["jobDefinitionArn"]
        never = [{"jobId": "never-finishes"}]
        ids.append(batch.submit_job(jobDefinition=definition, dependsOn=never, **job.submit_request())["jobId"])
    try:
        for job_id in ids:  # the sweep groups jobs by the Batch status last described
            deadline = time.monotonic() + 60
            while (got := poller.get([job_id]).get(job_id)) is None or got["status"] != "PENDING":
                assert time.monotonic() < deadline, got
                time.sleep(0.2)
        futures = {job_id: poller.request([job_id], period=60.0) for job_id in ids}
        listed = poller.sweep.calls
        first, *others = ids
        batch.terminate_job(jobId=first, reason="test: ended before its scheduled look")
        try:
            jobs = futures[first].result(timeout=50)  # the scheduled look comes 60 s after the last one
        except TimeoutError:
            raise AssertionError(sweep_note(poller)) from None
        assert (jobs[first] or {}).get("status") == "FAILED", jobs
        assert poller.sweep.calls > listed
        assert not any(futures[job_id].done() for job_id in others)
    finally:
        for job_id in ids:
            batch.terminate_job(jobId=job_id, reason="test: done")


def test_list_describe_describe_native_delete(sched: AWSBatchScheduler, batch_queue: str) -> None:
    labels = {
        "airflow.dag_id": "dag",
        "airflow.task_id": "task",
        "airflow.run_id": "manual__1",
        "airflow.map_index": "-1",
    }
    app = AppDef("listed", roles=[role("main", "echo listed")], metadata={"team": "ml"})
    cfg = {"queue": batch_queue, "job_type": "multinode"}
    app_id = sched.submit(app, {**cfg, "user": "alice"}, labels=labels)
    other = sched.submit(app, cfg)
    # another scheduler instance (another task, same process) finds it by its labels
    found = create_scheduler("elsewhere").list({"queue": batch_queue}, labels)
    assert [(a.app_id, a.labels) for a in found] == [(app_id, labels)]
    assert found[0].created is not None and abs(found[0].created - time.time()) < 300  # the submit time
    assert {app_id, other} <= {a.app_id for a in sched.list()}
    newest = sched.list({"queue": batch_queue}, limit=2)  # the two submitted last, oldest first
    assert {a.app_id for a in newest} == {app_id, other}
    assert newest[0].created is not None and newest[1].created is not None
    assert newest[0].created <= newest[1].created
    assert create_scheduler("x").list({"queue": batch_queue}, {**labels, "airflow.map_index": "0"}) == []
    desc, _ = wait_terminal(sched, app_id)
    assert desc.state == AppState.SUCCEEDED
    assert desc.labels == labels
    assert desc.started is not None and desc.ended is not None and desc.started <= desc.ended
    (main,) = desc.roles
    assert (main.name, main.image, main.entrypoint, main.args) == ("main", IMAGE, "sh", ["-c", "echo listed"])
    assert main.resource.memMB == 64
    native = sched.describe_native(app_id)
    assert native is not None and isinstance(native.request, BatchJob)
    assert native.request.app_id == app_id
    assert native.request.job_def["nodeProperties"]["numNodes"] == 1
    assert native.request.job_def["tags"]["airflow-torchx/user"] == "alice"
    assert native.request.job_def["tags"]["team"] == "ml"
    batch = boto3.client("batch")
    arn = batch.describe_jobs(jobs=[sched.poller.job_id(app_id)])["jobs"][0]["jobDefinition"]
    assert batch.describe_job_definitions(jobDefinitions=[arn])["jobDefinitions"][0]["status"] == "ACTIVE"
    sched.delete(app_id)
    assert batch.describe_job_definitions(jobDefinitions=[arn])["jobDefinitions"][0]["status"] == "INACTIVE"
    sched.delete(app_id)  # idempotent
    assert sched.describe(f"{batch_queue}:no-such-job") is None
    with pytest.raises(UnknownQueueError, match="queue='no-such-queue' does not exist"):  # a setup error
        sched.describe("no-such-queue:job")
    wait_terminal(sched, other)


def test_missing_queue_registers_and_submits_nothing(sched: AWSBatchScheduler) -> None:
    batch = boto3.client("batch")
    defs_before = len(batch.describe_job_definitions()["jobDefinitions"])
    app = AppDef("noqueue", roles=[role("main", "echo x")])
    with pytest.raises(InvalidRunConfigError, match=r"queue='no-such-queue' does not exist.*torchx-test-queue"):
        sched.submit(app, {"queue": "no-such-queue"})
    assert len(batch.describe_job_definitions()["jobDefinitions"]) == defs_before


def _registry_tags(registry: str, repo: str) -> list[str]:
    with urllib.request.urlopen(f"http://{registry}/v2/{repo}/tags/list", timeout=10) as resp:
        return list(json.load(resp).get("tags") or [])


def test_workspace_is_built_pushed_and_run(batch_queue: str, image_registry: str, tmp_path: Path) -> None:
    (tmp_path / "hello.txt").write_text("hello from the workspace\n")
    repo = "torchx-ws-test"
    app = AppDef(
        "ws",
        roles=[
            Role(
                "main",
                image=IMAGE,
                entrypoint="cat",
                args=["/hello.txt"],
                workspace=str(tmp_path),
                resource=Resource(1, 0, 64),
            )
        ],
    )
    cfg = {"queue": batch_queue, "image_repo": f"{image_registry}/{repo}", "quiet": True}
    import docker

    client = docker.from_env()
    with get_runner("itest") as runner:
        built = runner.build_workspace(app, "aws_batch", cfg)
        assert isinstance(built, dict) and list(built) == [(IMAGE, str(tmp_path))]
        info = runner.dryrun(app, "aws_batch", cfg)
        assert info.app.roles[0].image == built[(IMAGE, str(tmp_path))]  # same files, same image
        local_image = info.app.roles[0].image
        assert local_image.startswith("sha256:")
        tag = local_image.removeprefix("sha256:")
        try:
            assert info.request.images_to_push == {local_image: (f"{image_registry}/{repo}", tag)}
            handle = runner.schedule(info)
            assert tag in _registry_tags(image_registry, repo)
            status = runner.wait(handle, wait_interval=0.5, timeout=60)
            assert status is not None and status.state == AppState.SUCCEEDED, status
            assert list(runner.log_lines(handle, "main", 0)) == ["hello from the workspace\n"]
        finally:
            client.images.remove(f"{image_registry}/{repo}:{tag}", force=True)
            client.close()


def test_throttling_and_5xx_are_retried_and_jobs_are_watched_to_the_end(
    batch_queue: str, flaky_aws_endpoint: FlakyProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", flaky_aws_endpoint.url)
    s = create_scheduler("flaky")  # its own clients: botocore's retries (clients.client_config)
    s.poller.min_interval = 0.2
    app = AppDef("flaky", roles=[role("main", "echo survived", replicas=2)])
    ids = [s.submit(app, {"queue": batch_queue}) for _ in range(2)]
    for app_id in ids:
        desc, _ = wait_terminal(s, app_id)
        assert desc.state == AppState.SUCCEEDED
        assert list(s.log_iter(app_id, "main", 1)) == ["survived\n", "survived\n"]
    assert flaky_aws_endpoint.counts["throttled"] >= 3
    assert flaky_aws_endpoint.counts["unavailable"] >= 3


def test_root_cause_from_torchruns_summary_in_the_log(batch_queue: str) -> None:
    """On Batch the error file stays in the container: the root cause comes from the summary
    torchrun prints in the node's log (here printed by the command, in torchrun's format)."""
    summary = [
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
        "=" * 40,
        "Root Cause (first observed failure):",
        "[0]:",
        "  rank      : 1 (local_rank: 1)",
        "  exitcode  : 1 (pid: 42)",
        "  traceback : Traceback (most recent call last):",
        '    File "/app/train.py", line 9, in main',
        "      step()",
        "  RuntimeError: boom on rank 1",
        "=" * 40,
    ]
    script = "printf '%s\\n' " + " ".join(f"'{line}'" for line in summary) + " >&2; exit 1"
    with get_runner() as runner:
        handle = runner.run(AppDef("ddp", roles=[role("trainer", script)]), "aws_batch", {"queue": batch_queue})
        status = runner.wait(handle, wait_interval=0.5, timeout=60, cancel_on_signal=False)
        assert status is not None and status.state == AppState.FAILED
        cause = find_root_cause(runner, handle, status)
        logged = list(runner.log_lines(handle, "trainer", 0))
    assert cause is not None, logged
    assert (cause.error, cause.rank, cause.replica, cause.exit_code) == (
        "RuntimeError: boom on rank 1",
        1,
        "trainer/0",
        1,
    )
    assert cause.frames == ('File "/app/train.py", line 9, in main', "  step()"), logged
