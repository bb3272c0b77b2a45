"""Status, describe, list, cancel and logs on responses shaped like real AWS (``fakes``).

These are the paths moto does not model: exit codes of multi-node jobs, child jobs
``jobId#N`` and their per-node log streams, several attempts, ListJobs pagination and
CancelJob of a job that has not started; single-node jobs through Spot reclaims and attempts,
and as AWS describes Fargate jobs. The same code runs against moto in
``test_integration.py`` for what moto does model.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import json
import threading
import time
from typing import Any

import pytest

from airflow_provider_torchx.core.errors import InvalidRunConfigError, UnknownAppError
from airflow_provider_torchx.core.schedulers.api import CancelledBy, Stream, settle_on_loop
from airflow_provider_torchx.core.schedulers.aws_batch import create_scheduler
from airflow_provider_torchx.core.schedulers.aws_batch.scheduler import AWSBatchScheduler
from airflow_provider_torchx.core.schedulers.aws_batch.status import (
    CANCEL_REASON,
    app_state,
    describe_response,
    has_ended,
    num_restarts,
)
from airflow_provider_torchx.core.specs import AppDef, AppState, Resource, Role
from tests.core.aws_batch.fakes import (
    SPOT_RECLAIMED,
    FakeBatch,
    FakeLogs,
    attempt,
    child_job,
    container_job,
    mnp_job,
)


@pytest.fixture(autouse=True)
def generous_log_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each fake's CloudWatch budget (``test_log_budget.py`` tests it) never refuses a read here."""
    monkeypatch.setenv("AIRFLOW_TORCHX_CLOUDWATCH_RPS", "1000")


def make(batch: FakeBatch, logs: FakeLogs | None = None) -> AWSBatchScheduler:
    sched = create_scheduler("s", client=batch, log_client=logs or FakeLogs())
    sched.poller.min_interval = 0.01  # rounds as fast as the test goes (default: 1 s apart)
    return sched


@pytest.mark.parametrize(
    ("status", "state"),
    [
        ("SUBMITTED", AppState.PENDING),
        ("PENDING", AppState.PENDING),
        ("RUNNABLE", AppState.PENDING),
        ("STARTING", AppState.PENDING),
        ("RUNNING", AppState.RUNNING),
        ("SUCCEEDED", AppState.SUCCEEDED),
        ("FAILED", AppState.FAILED),
        ("SOMETHING_NEW", AppState.UNKNOWN),
    ],
)
def test_state_map(status: str, state: AppState) -> None:
    assert app_state({"status": status}) == state


def test_cancelled_through_us_is_cancelled_not_failed() -> None:
    by_reason = mnp_job(status="FAILED", statusReason=f"{CANCEL_REASON} through aws_batch")
    by_tag = mnp_job(status="FAILED", statusReason="Terminated", tags={"airflow-torchx/cancel-requested": "true"})
    by_someone_else = mnp_job(status="FAILED", statusReason="Terminated by admin in the console")
    assert describe_response("q1:a", by_reason, {}, "r").state == AppState.CANCELLED
    got = describe_response("q1:a", by_tag, {}, "r")
    assert got.state == AppState.CANCELLED and got.cancel_requested
    got = describe_response("q1:a", by_someone_else, {}, "r")
    assert got.state == AppState.FAILED and not got.cancel_requested
    assert got.msg == "Terminated by admin in the console"


def test_failed_node_exit_code_and_replicas_from_child_jobs() -> None:
    job = mnp_job(status="FAILED", statusReason="Essential container in task exited")
    nodes = {
        0: child_job("j1", 0, "FAILED", 137, statusReason="Job terminated: main node failed"),
        1: child_job("j1", 1, "FAILED", 3, statusReason="Essential container in task exited"),
        2: child_job("j1", 2, "SUCCEEDED", 0),
    }
    # node 0 was killed (137) after node 1 failed: the first failing node in node order is
    # reported, with its code and reason.
    got = describe_response("q1:app-1", job, nodes, "us-west-2")
    assert got.state == AppState.FAILED
    assert got.msg.startswith("Essential container in task exited; role 'trainer' replica 0 (node 0)")
    assert "exited with code 137" in got.msg
    trainer, ps = got.roles_statuses
    assert [(r.id, r.state, r.exit_code, r.hostname) for r in trainer.replicas] == [
        (0, AppState.FAILED, 137, "10.0.0.1"),
        (1, AppState.FAILED, 3, "10.0.0.2"),
    ]
    assert [(r.id, r.state, r.exit_code) for r in ps.replicas] == [(0, AppState.SUCCEEDED, 0)]
    assert got.ui_url == "https://us-west-2.console.aws.amazon.com/batch/home?region=us-west-2#jobs/mnp-job/j1"


def test_without_node_details_replicas_take_the_job_state_and_attempt_exit_code() -> None:
    job = mnp_job(
        status="FAILED",
        statusReason="Essential container in task exited",
        attempts=[{"container": {"exitCode": 2}, "startedAt": 1, "stoppedAt": 2}],
    )
    got = describe_response("q1:app-1", job, {}, "r")
    assert got.msg == "Essential container in task exited; exit code 2"
    assert {r.state for rs in got.roles_statuses for r in rs.replicas} == {AppState.FAILED}
    assert [(r.name, r.num_replicas, r.resource.cpu, r.resource.memMB) for r in got.roles] == [
        ("trainer", 2, 2, 1024),
        ("ps", 1, 2, 1024),
    ]
    assert got.roles[0].resource.capabilities == {"instanceType": "p3.2xlarge"}
    assert got.roles[0].env == {}


def test_num_restarts_from_attempts() -> None:
    ended = {"startedAt": 1, "stoppedAt": 2}
    assert num_restarts({"status": "RUNNING", "attempts": []}) == 0
    assert num_restarts({"status": "RUNNING", "attempts": [{"startedAt": 1}]}) == 0  # moto lists the live one
    assert num_restarts({"status": "RUNNING", "attempts": [ended]}) == 1  # AWS: one ended, another runs
    assert num_restarts({"status": "FAILED", "attempts": [ended, ended, ended]}) == 2


def test_labels_from_tags() -> None:
    job = mnp_job(tags={"airflow-torchx/label/airflow.dag_id": "d", "team": "x"})
    assert describe_response("q1:a", job, {}, "r").labels == {"airflow.dag_id": "d"}


def test_describe_finds_job_by_name_across_listjobs_pages_and_fetches_nodes_once_terminal() -> None:
    batch = FakeBatch(page_size=2)
    for i in range(5):
        batch.jobs[f"other{i}"] = mnp_job(job_id=f"other{i}", name=f"app-1x{i}")
    batch.jobs["j1"] = mnp_job(status="RUNNING")
    sched = make(batch)
    got = sched.describe("q1:app-1")
    assert got is not None and got.state == AppState.RUNNING
    assert batch.names().count("list_jobs") == 1  # JOB_NAME filter: exact name, one page
    assert not any("#" in j for n, kw in batch.calls if n == "describe_jobs" for j in kw["jobs"])
    batch.jobs["j1"] = mnp_job(status="FAILED", statusReason="Essential container in task exited")
    for n in range(3):
        batch.jobs[f"j1#{n}"] = child_job("j1", n, "FAILED" if n == 2 else "SUCCEEDED", 1 if n == 2 else 0)
    sched.poller.invalidate("j1")
    got = sched.describe("q1:app-1")
    assert got is not None and "role 'ps' replica 0 (node 2) exited with code 1" in got.msg
    calls = len(batch.calls)
    assert sched.describe("q1:app-1") is not None  # terminal: answered from cache
    assert len(batch.calls) == calls
    assert sched.describe("q1:nope") is None
    assert sched.describe("not-an-app-id") is None


def test_list_pages_through_all_queues_and_filters_on_our_tags_and_labels() -> None:
    batch = FakeBatch(page_size=2)
    batch.queues = ["q1", "q2"]
    labels = {"airflow.dag_id": "d", "airflow.task_id": "t"}
    from airflow_provider_torchx.core.schedulers.aws_batch.render import labels_hash

    prefix = labels_hash(labels)
    for i in range(5):
        batch.jobs[f"a{i}"] = mnp_job(job_id=f"a{i}", name=f"plain-{i}")
    batch.jobs["theirs"] = mnp_job(job_id="theirs", name="theirs")
    del batch.jobs["theirs"]["tags"]["airflow-torchx/version"]
    tagged = {f"airflow-torchx/label/{k}": v for k, v in labels.items()}
    batch.jobs["l1"] = mnp_job(job_id="l1", name=f"{prefix}-x-1", status="SUCCEEDED", tags=tagged)
    batch.jobs["l2"] = mnp_job(job_id="l2", name=f"{prefix}-x-2", tags=tagged)
    batch.jobs["q2job"] = mnp_job(job_id="q2job", name="elsewhere", jobQueue="arn:aws:batch:r:1:job-queue/q2")
    sched = make(batch)
    everything = sched.list()
    assert sorted(a.app_id for a in everything) == sorted(
        [f"q1:plain-{i}" for i in range(5)] + [f"q1:{prefix}-x-1", f"q1:{prefix}-x-2", "q2:elsewhere"]
    )
    assert batch.names().count("list_jobs") >= 5  # pages of 2, two queues: no cap
    mine = sched.list({"queue": "q1"}, labels)
    assert sorted((a.app_id, a.state) for a in mine) == [
        (f"q1:{prefix}-x-1", AppState.SUCCEEDED),
        (f"q1:{prefix}-x-2", AppState.RUNNING),
    ]
    assert all(a.labels == labels for a in mine)
    name_filters = [kw["filters"][0] for n, kw in batch.calls if n == "list_jobs"][-1]
    assert name_filters == {"name": "JOB_NAME", "values": [prefix + "-*"]}
    assert sched.list({"queue": "q1"}, {"airflow.dag_id": "other"}) == []


def test_list_limit_describes_the_newest_only() -> None:
    """``limit``: the newest jobs by ``createdAt``, oldest first, read with one DescribeJobs
    batch of 100 instead of one per 100 jobs of the queue."""
    batch = FakeBatch(page_size=100)
    for i in range(250):  # job ids in the reverse of submission order
        batch.jobs[f"j{999 - i}"] = mnp_job(job_id=f"j{999 - i}", name=f"app-{i}", createdAt=1_700_000_000_000 + i)
    sched = make(batch)
    everything = sched.list({"queue": "q1"})
    assert [a.name for a in everything] == [f"app-{i}" for i in range(250)]
    assert batch.names().count("describe_jobs") == 3
    batch.calls.clear()
    newest = sched.list({"queue": "q1"}, limit=3)
    assert [a.name for a in newest] == ["app-247", "app-248", "app-249"]
    assert batch.names().count("describe_jobs") == 1
    assert sched.list({"queue": "q1"}, limit=0) == []


@pytest.mark.parametrize(("status", "expected"), [("RUNNABLE", "cancel_job"), ("RUNNING", "terminate_job")])
def test_cancel_uses_canceljob_before_start_and_terminatejob_after(status: str, expected: str) -> None:
    batch = FakeBatch()
    batch.jobs["j1"] = mnp_job(status=status)
    make(batch).cancel("q1:app-1", reason="airflow-torchx cancel by alice")
    acted = [(n, kw) for n, kw in batch.calls if n in ("cancel_job", "terminate_job")]
    assert [n for n, _ in acted] == [expected]
    assert acted[0][1]["reason"] == f"{CANCEL_REASON} through aws_batch: airflow-torchx cancel by alice"
    assert batch.jobs["j1"]["tags"]["airflow-torchx/cancel-requested"] == "true"
    got = make(batch).describe("q1:app-1")
    assert got is not None and got.cancel_requested and got.cancelled_by is None


@pytest.mark.parametrize("by", list(CancelledBy))
def test_who_cancelled_is_the_cancel_tags_value(by: CancelledBy) -> None:
    batch = FakeBatch()
    batch.jobs["j1"] = mnp_job(status="RUNNING")
    make(batch).cancel("q1:app-1", reason="why", by=by)
    assert batch.jobs["j1"]["tags"]["airflow-torchx/cancel-requested"] == by.value
    (terminate,) = [kw for n, kw in batch.calls if n == "terminate_job"]
    assert terminate["reason"] == f"{CANCEL_REASON} through aws_batch: why"  # the tag says who
    got = make(batch).describe("q1:app-1")
    assert got is not None and got.cancel_requested and got.cancelled_by == by


def test_who_cancelled_rides_in_our_reason_when_the_tag_could_not_be_set() -> None:
    batch = FakeBatch()
    batch.jobs["j1"] = mnp_job(status="RUNNING")

    def refused(**kwargs: Any) -> dict[str, Any]:
        raise PermissionError("batch:TagResource denied")

    batch.tag_resource = refused  # type: ignore[method-assign]
    make(batch).cancel("q1:app-1", reason="task d.t of run r was killed", by=CancelledBy.TASK)
    (terminate,) = [kw for n, kw in batch.calls if n == "terminate_job"]
    assert terminate["reason"] == f"{CANCEL_REASON} by task through aws_batch: task d.t of run r was killed"
    ended = mnp_job(status="FAILED", statusReason=terminate["reason"])  # as Batch applies it, untagged
    got = describe_response("q1:app-1", ended, {}, "us-east-1")
    assert (got.state, got.cancelled_by, got.cancel_reason) == (
        AppState.CANCELLED,
        CancelledBy.TASK,
        "task d.t of run r was killed",
    )
    unknown = mnp_job(status="FAILED", statusReason=f"{CANCEL_REASON} by someone through aws_batch: x")
    assert describe_response("q1:app-1", unknown, {}, "us-east-1").cancelled_by is None


def test_the_cancel_reason_ours_or_given_to_a_terminate_by_hand_but_not_batchs_own() -> None:
    """An outside cancel needs Batch's evidence (``isTerminated``/``isCancelled``): a reason
    never seen without it is an ordinary failure; Batch's own reasons never are a cancel."""
    ours = mnp_job(status="FAILED", statusReason=f"{CANCEL_REASON} through aws_batch: the UI: bob")
    bare = mnp_job(status="FAILED", statusReason=f"{CANCEL_REASON} through aws_batch")
    by_hand = mnp_job(status="FAILED", statusReason="stopped by ops: disk full", isTerminated=True)
    cancelled = mnp_job(status="FAILED", statusReason="not needed", isCancelled=True)
    unseen = mnp_job(status="FAILED", statusReason="A reason AWS adds tomorrow")
    batchs = [
        mnp_job(status="FAILED", statusReason=reason, isTerminated=True)
        for reason in ("Job attempt duration exceeded timeout", "Host EC2 (instance i-0ab) terminated.")
    ] + [mnp_job(status="FAILED", statusReason=reason) for reason in ("Essential container in task exited", "")]
    running = mnp_job(status="RUNNING", statusReason="stopped by ops")
    jobs = (ours, bare, by_hand, cancelled, unseen, *batchs, running)
    got = [describe_response("q1:app-1", job, {}, "us-east-1") for job in jobs]
    outside = "a CancelJob/TerminateJob on AWS Batch outside airflow-torchx"
    assert [(d.state, d.cancel_reason) for d in got] == [
        (AppState.CANCELLED, "the UI: bob"),
        (AppState.CANCELLED, None),
        (AppState.FAILED, f"{outside}: stopped by ops: disk full"),
        (AppState.FAILED, f"{outside}: not needed"),
        (AppState.FAILED, None),
        (AppState.FAILED, None),
        (AppState.FAILED, None),
        (AppState.FAILED, None),
        (AppState.FAILED, None),
        (AppState.RUNNING, None),
    ]
    assert "the UI: bob" in got[0].msg


def test_cancel_that_races_the_start_terminates_and_terminal_jobs_are_left_alone() -> None:
    batch = FakeBatch()
    batch.jobs["j1"] = mnp_job(status="RUNNABLE")
    sched = make(batch)
    real_cancel = batch.cancel_job

    def cancel_then_start(jobId: str, reason: str) -> dict[str, str]:
        batch.jobs["j1"]["status"] = "STARTING"
        return real_cancel(jobId=jobId, reason=reason)

    batch.cancel_job = cancel_then_start  # type: ignore[method-assign]
    sched.cancel("q1:app-1")
    assert [n for n in batch.names() if n.endswith("_job")] == ["cancel_job", "terminate_job"]
    batch.jobs["j1"]["status"] = "SUCCEEDED"
    sched.poller.invalidate("j1")
    before = len(batch.calls)
    sched.cancel("q1:app-1")
    assert "terminate_job" not in batch.names()[before:] and "cancel_job" not in batch.names()[before:]


def test_delete_cancels_and_deregisters_the_job_definition() -> None:
    batch = FakeBatch()
    batch.jobs["j1"] = mnp_job(status="RUNNING")
    sched = make(batch)
    sched.delete("q1:app-1")
    assert "terminate_job" in batch.names()
    dereg = [kw for n, kw in batch.calls if n == "deregister_job_definition"]
    assert dereg == [{"jobDefinition": batch.jobs["j1"]["jobDefinition"]}]
    sched.delete("q1:missing")  # idempotent: nothing to do


def test_job_not_visible_right_after_submit_is_pending_not_missing() -> None:
    batch = FakeBatch()
    sched = make(batch)
    app = AppDef("app", roles=[Role("r", image="img", entrypoint="echo", resource=Resource(1, 0, 64))])
    app_id = sched.submit(app, {"queue": "q1"})
    batch.invisible_rounds = 2  # eventual consistency: DescribeJobs does not show it yet
    first = sched.describe(app_id)
    assert first is not None and first.state == AppState.PENDING and "not yet visible" in first.msg
    batch.jobs["new-job"] = mnp_job(job_id="new-job", name=app_id.split(":")[1], status="RUNNABLE")
    batch.invisible_rounds = 0
    sched.poller.invalidate("new-job")
    second = sched.describe(app_id)
    assert second is not None and second.state == AppState.PENDING and second.roles
    assert "list_jobs" not in batch.names()  # the submit remembered the job id


def test_missing_queue_is_an_error_before_anything_is_registered() -> None:
    batch = FakeBatch()
    sched = make(batch)
    app = AppDef("app", roles=[Role("r", image="img", entrypoint="echo", resource=Resource(1, 0, 64))])
    with pytest.raises(InvalidRunConfigError, match=r"queue='nope' does not exist in us-west-2; existing queues: q1"):
        sched.submit(app, {"queue": "nope"})
    assert set(batch.names()) == {"describe_job_queues"}


def test_logs_per_node_and_attempt_with_a_resumable_cursor() -> None:
    batch, logs = FakeBatch(), FakeLogs(page=2)
    batch.jobs["j1"] = mnp_job(status="RUNNING")
    # node 1 (trainer replica 1) failed its first attempt and runs a second one.
    batch.jobs["j1#1"] = child_job(
        "j1", 1, "RUNNING", attempts=[{"container": {"logStreamName": "jd/default/att1"}, "stoppedAt": 1}]
    )
    batch.jobs["j1#1"]["container"]["logStreamName"] = "jd/default/att2"
    logs.add("jd/default/att1", "a1", "a2", "a3")
    sched = make(batch, logs)
    chunk = sched.read_log("q1:app-1", "trainer", 1, max_lines=2)
    assert chunk.lines == ["a1\n", "a2\n"] and not chunk.eof
    # the second attempt's stream does not exist yet: no lines yet, not an error
    chunk = sched.read_log("q1:app-1", "trainer", 1, cursor=chunk.cursor)
    assert chunk.lines == ["a3\n"] and not chunk.eof
    saved = chunk.cursor
    logs.add("jd/default/att2", "b1", "b2", "b3", "b4", "b5")
    chunk = sched.read_log("q1:app-1", "trainer", 1, cursor=saved, max_lines=3)
    assert chunk.lines == ["b1\n", "b2\n", "b3\n"]
    restarted = sched.read_log("q1:app-1", "trainer", 1, cursor=chunk.cursor)
    assert restarted.lines == ["b4\n", "b5\n"] and not restarted.eof
    assert sched.read_log("q1:app-1", "trainer", 1, cursor=restarted.cursor).lines == []
    logs.add("jd/default/att2", "b6", start=10_000)
    batch.jobs["j1"]["status"] = "SUCCEEDED"
    batch.jobs["j1#1"]["status"] = "SUCCEEDED"
    sched.poller.invalidate("j1")
    sched.poller.invalidate("j1#1")
    last = sched.read_log("q1:app-1", "trainer", 1, cursor=restarted.cursor)
    assert last.lines == ["b6\n"] and last.eof
    assert json.loads(last.cursor)["i"] == 1
    # log_iter: the whole log, regex and since/until on event timestamps
    assert list(sched.log_iter("q1:app-1", "trainer", 1, regex="^b[12]")) == ["b1\n", "b2\n"]
    from datetime import datetime, timezone

    since = datetime.fromtimestamp(1700000002, tz=timezone.utc)
    until = datetime.fromtimestamp(1700000004, tz=timezone.utc)
    got = list(sched.log_iter("q1:app-1", "trainer", 1, since=since, until=until))
    assert got == ["a3\n", "b3\n", "b4\n", "b5\n"]


def test_log_errors() -> None:
    batch = FakeBatch()
    batch.jobs["j1"] = mnp_job(status="RUNNING")
    sched = make(batch)
    with pytest.raises(UnknownAppError, match="q1:missing"):
        sched.read_log("q1:missing", "trainer")
    with pytest.raises(UnknownAppError):
        sched.log_iter("q1:missing", "trainer")
    with pytest.raises(ValueError, match=r"role_name: 'nope'.*roles: trainer, ps"):
        sched.read_log("q1:app-1", "nope")
    with pytest.raises(ValueError, match=r"k: role 'ps' of q1:app-1 has replicas 0..0, not 1"):
        sched.read_log("q1:app-1", "ps", 1)
    with pytest.raises(ValueError, match="streams"):
        sched.read_log("q1:app-1", "ps", 0, streams=Stream.STDERR)
    with pytest.raises(ValueError, match="cursor"):
        sched.read_log("q1:app-1", "ps", 0, cursor="garbage")
    with pytest.raises(ValueError, match=r"cursor: .*\(6000 characters\) is not a cursor.*nested too deep"):
        sched.read_log("q1:app-1", "ps", 0, cursor="[" * 3000 + "]" * 3000)


# ---------------------------------------------------------------------- single-node jobs


def test_container_job_is_its_own_replica() -> None:
    job = container_job(status="SUCCEEDED")
    job["container"]["exitCode"] = 0
    got = describe_response("q1:app-1", job, {}, "us-west-2")
    assert got.state == AppState.SUCCEEDED and got.num_restarts == 0
    (main,) = got.roles_statuses
    assert [(r.id, r.role, r.state, r.exit_code, r.hostname) for r in main.replicas] == [
        (0, "main", AppState.SUCCEEDED, 0, "10.0.1.7")
    ]
    (role,) = got.roles
    assert (role.name, role.num_replicas, role.entrypoint, role.args) == ("main", 1, "python", ["-m", "eval"])
    assert (role.resource.cpu, role.resource.memMB) == (1, 2048)
    assert role.env == {"FOO": "bar"}  # our own variables are left out
    assert got.ui_url == "https://us-west-2.console.aws.amazon.com/batch/home?region=us-west-2#jobs/detail/c1"


def test_container_job_failure_names_the_exit_code_and_reason() -> None:
    job = container_job(status="FAILED", statusReason="Essential container in task exited")
    job["container"].update(exitCode=3, reason="Essential container in task exited")
    got = describe_response("q1:app-1", job, {}, "r")
    assert got.state == AppState.FAILED
    assert got.msg == "Essential container in task exited; role 'main' replica 0 exited with code 3"
    assert got.roles_statuses[0].replicas[0].exit_code == 3


def test_spot_reclaim_then_retried_attempt_running() -> None:
    # AWS lists attempts as they end: the reclaimed one; the second runs.
    job = container_job(status="RUNNING", attempts_allowed=3, attempts=[attempt(SPOT_RECLAIMED)])
    got = describe_response("q1:app-1", job, {}, "r")
    assert got.state == AppState.RUNNING and got.num_restarts == 1
    assert got.msg == f"attempt 2 of 3 running; attempt 1 of 3 ended: {SPOT_RECLAIMED}"
    job["status"] = "RUNNABLE"  # waiting for a new Spot instance
    assert describe_response("q1:app-1", job, {}, "r").msg.startswith("attempt 2 of 3 waiting; attempt 1 of 3")


def test_spot_reclaim_then_application_failure_under_retry_on_infra() -> None:
    job = container_job(
        status="FAILED",
        statusReason="Essential container in task exited",
        attempts_allowed=3,
        attempts=[
            attempt(SPOT_RECLAIMED, n=1),
            attempt("Essential container in task exited", exit_code=3, n=2),
        ],
        retryStrategy={
            "attempts": 3,
            "evaluateOnExit": [
                {"onStatusReason": "Host EC2*", "action": "RETRY"},
                {"onReason": "*", "action": "EXIT"},
            ],
        },
    )
    got = describe_response("q1:app-1", job, {}, "r")
    assert got.state == AppState.FAILED and got.num_restarts == 1
    assert got.msg == (
        "Essential container in task exited; role 'main' replica 0 exited with code 3; "
        "attempt 2 of 3 failed: Essential container in task exited (exit code 3); "
        "not retried (the job's retry strategy exits on this reason); "
        f"attempt 1 of 3 ended: {SPOT_RECLAIMED}"
    )


def test_every_attempt_reclaimed_and_success_after_a_reclaim() -> None:
    reclaimed = [attempt(SPOT_RECLAIMED, n=n) for n in (1, 2)]
    job = container_job(status="FAILED", statusReason=SPOT_RECLAIMED, attempts_allowed=2, attempts=reclaimed)
    got = describe_response("q1:app-1", job, {}, "r")
    assert (
        got.msg == f"{SPOT_RECLAIMED}; attempt 2 of 2 failed: {SPOT_RECLAIMED}; attempt 1 of 2 ended: {SPOT_RECLAIMED}"
    )
    ok = container_job(status="SUCCEEDED", attempts_allowed=2, attempts=[reclaimed[0], attempt("", 0, n=2)])
    got = describe_response("q1:app-1", ok, {}, "r")
    assert got.state == AppState.SUCCEEDED and got.num_restarts == 1
    assert got.msg.startswith("attempt 2 of 2 succeeded: no reason given (exit code 0); attempt 1 of 2 ended: Host")
    cancel = f"{CANCEL_REASON} through aws_batch"
    stopped = container_job(status="FAILED", statusReason=cancel, attempts_allowed=2, attempts=[attempt(cancel)])
    got = describe_response("q1:app-1", stopped, {}, "r")
    assert got.state == AppState.CANCELLED
    assert got.msg == f"{cancel}; attempt 1 of 2 was cancelled: {cancel}"


def test_fargate_job_as_aws_describes_it() -> None:
    job = container_job(status="RUNNING", platformCapabilities=["FARGATE"])
    job["container"].update(
        networkConfiguration={"assignPublicIp": "DISABLED"},
        fargatePlatformConfiguration={"platformVersion": "1.4.0"},
        executionRoleArn="arn:aws:iam::1:role/exec",
        networkInterfaces=[{"attachmentId": "a1", "privateIpv4Address": "172.31.5.9"}],
    )
    del job["container"]["containerInstanceArn"]  # Fargate tasks run on no container instance
    batch = FakeBatch()
    batch.jobs["c1"] = job
    sched = make(batch)
    got = sched.describe("q1:app-1")
    assert got is not None and got.state == AppState.RUNNING
    assert got.roles_statuses[0].replicas[0].hostname == "172.31.5.9"
    native = sched.describe_native("q1:app-1")
    assert native is not None
    props = native.request.job_def["containerProperties"]
    assert native.request.job_def["type"] == "container" and "nodeProperties" not in native.request.job_def
    assert native.request.job_def["platformCapabilities"] == ["FARGATE"]
    assert props["networkConfiguration"] == {"assignPublicIp": "DISABLED"}
    assert not {"logStreamName", "networkInterfaces", "taskArn", "exitCode"} & set(props)


def test_container_job_logs_read_every_attempts_stream_without_child_jobs() -> None:
    batch, logs = FakeBatch(), FakeLogs(page=2)
    job = container_job(status="RUNNING", attempts_allowed=2, attempts=[attempt(SPOT_RECLAIMED, stream="s/att1")])
    job["container"]["logStreamName"] = "s/att2"
    batch.jobs["c1"] = job
    logs.add("s/att1", "loading", "epoch 1")
    logs.add("s/att2", "loading", "epoch 1", "epoch 2", start=10_000)
    sched = make(batch, logs)
    chunk = sched.read_log("q1:app-1", "main", 0, max_lines=3)
    assert chunk.lines == ["loading\n", "epoch 1\n", "loading\n"] and not chunk.eof
    rest = sched.read_log("q1:app-1", "main", 0, cursor=chunk.cursor)
    assert rest.lines == ["epoch 1\n", "epoch 2\n"] and not rest.eof
    job["status"] = "SUCCEEDED"
    sched.poller.invalidate("c1")
    assert sched.read_log("q1:app-1", "main", 0, cursor=rest.cursor).eof
    assert list(sched.log_iter("q1:app-1", "main", 0, regex="epoch")) == ["epoch 1\n", "epoch 1\n", "epoch 2\n"]
    assert not any("#" in j for n, kw in batch.calls if n == "describe_jobs" for j in kw["jobs"])
    with pytest.raises(ValueError, match=r"k: role 'main' of q1:app-1 has replicas 0..0, not 1"):
        sched.read_log("q1:app-1", "main", 1)


def test_failed_container_job_without_an_exit_code_reads_it_from_the_summary_once() -> None:
    batch = FakeBatch()
    job = container_job(status="FAILED", statusReason="Essential container in task exited", startedAt=1700000001000)
    batch.jobs["c1"] = job
    batch.summary_containers["c1"] = {"exitCode": 7, "reason": "Essential container in task exited"}
    sched = make(batch)
    sched.poller.remember("q1:app-1", "c1")
    for _ in range(2):
        got = sched.describe("q1:app-1")
        assert got is not None and got.roles_statuses[0].replicas[0].exit_code == 7
        assert "role 'main' replica 0 exited with code 7" in got.msg
    assert batch.names().count("list_jobs") == 1
    # a job terminated before it started has no exit code to look up: no ListJobs per such job
    batch.jobs["c2"] = container_job(job_id="c2", status="FAILED", statusReason="Terminated before it started")
    sched.poller.remember("q1:app-2", "c2")
    got = sched.describe("q1:app-2")
    assert got is not None and got.state == AppState.FAILED
    assert batch.names().count("list_jobs") == 1


@pytest.mark.parametrize(("status", "expected"), [("RUNNABLE", "cancel_job"), ("RUNNING", "terminate_job")])
def test_cancel_and_delete_a_container_job(status: str, expected: str) -> None:
    batch = FakeBatch()
    batch.jobs["c1"] = container_job(status=status)
    sched = make(batch)
    sched.cancel("q1:app-1")
    assert [n for n in batch.names() if n in ("cancel_job", "terminate_job")] == [expected]
    batch.jobs["c1"].update(status="FAILED", statusReason=f"{CANCEL_REASON} through aws_batch")
    sched.poller.invalidate("c1")
    got = sched.describe("q1:app-1")
    assert got is not None and got.state == AppState.CANCELLED and got.cancel_requested
    sched.delete("q1:app-1")
    assert [kw for n, kw in batch.calls if n == "deregister_job_definition"] == [
        {"jobDefinition": batch.jobs["c1"]["jobDefinition"]}
    ]


def test_list_finds_a_container_job_by_its_identity_labels() -> None:
    from airflow_provider_torchx.core.schedulers.aws_batch.render import labels_hash

    labels = {"airflow.dag_id": "d", "airflow.task_id": "t", "airflow.run_id": "r", "airflow.map_index": "-1"}
    tagged = {f"airflow-torchx/label/{k}": v for k, v in labels.items()}
    batch = FakeBatch()
    batch.jobs["c1"] = container_job(name=f"{labels_hash(labels)}-ev-1", tags=tagged)
    batch.jobs["m1"] = mnp_job(job_id="m1", name="other")
    (found,) = make(batch).list({"queue": "q1"}, labels)
    assert (found.app_id, found.state, found.labels) == (f"q1:{labels_hash(labels)}-ev-1", AppState.RUNNING, labels)


def test_start_and_end_times_in_epoch_seconds() -> None:
    got = describe_response(
        "q1:a", mnp_job(status="SUCCEEDED", startedAt=1700000001500, stoppedAt=1700000061500), {}, "r"
    )
    assert (got.started, got.ended) == (1700000001.5, 1700000061.5)
    running = describe_response("q1:a", mnp_job(status="RUNNING", startedAt=1700000001000), {}, "r")
    assert (running.started, running.ended) == (1700000001.0, None)


def test_a_log_read_finds_streams_from_the_pollers_recent_entry_without_a_new_round() -> None:
    """A watcher reads a job's status (a poller round), then its log: the log read takes the
    job's streams from that entry (up to ``LOG_STREAMS_MAX_AGE`` old) instead of waiting on a
    watch-pool thread for the next round, which takes seconds with thousands of jobs."""
    batch, logs = FakeBatch(), FakeLogs()
    job = container_job(status="RUNNING")
    job["container"]["logStreamName"] = "s/att1"
    batch.jobs["c1"] = job
    logs.add("s/att1", "epoch 1")
    sched = make(batch, logs)
    assert sched.describe("q1:app-1") is not None
    rounds = sum(1 for name, _ in batch.calls if name == "describe_jobs")
    time.sleep(0.05)  # past the poller's min_interval: a plain describe would ask again
    assert sched.read_log("q1:app-1", "main", 0).lines == ["epoch 1\n"]
    assert sum(1 for name, _ in batch.calls if name == "describe_jobs") == rounds


def test_a_look_on_an_event_loop_is_resolved_there_by_the_pollers_thread() -> None:
    """``describe_on_loop_as``: ``then`` maps the answer on the poller's thread and the loop's
    own future gets it; an ended multi-node job's answer carries its nodes' exit codes (a
    second request, for the child jobs); a look the caller cancelled is dropped by the next
    round; an app whose job id is unknown gets None (describe it blocking)."""
    batch = FakeBatch()
    batch.jobs["j1"] = mnp_job(status="FAILED", statusReason="Essential container in task exited")
    for n in range(3):
        batch.jobs[f"j1#{n}"] = child_job("j1", n, "FAILED" if n == 2 else "SUCCEEDED", 1 if n == 2 else 0)
    batch.jobs["j2"] = mnp_job(job_id="j2", name="app-2", status="RUNNING")
    sched = make(batch)
    sched.adopt_native_id("q1:app-1", "j1")
    sched.adopt_native_id("q1:app-2", "j2")
    mapped_on: list[str] = []

    def then(described: Any) -> Any:
        mapped_on.append(threading.current_thread().name)
        return described

    async def looks() -> tuple[Any, Any]:
        loop = asyncio.get_running_loop()
        assert sched.describe_on_loop_as("q1:app-9", then, loop) is None
        cancelled = sched.describe_on_loop_as("q1:app-2", then, loop, period=3600.0)
        ended = sched.describe_on_loop_as("q1:app-1", then, loop)
        assert cancelled is not None and ended is not None
        cancelled.cancel()
        return await asyncio.wait_for(ended, 10), sched.poller._waiters

    got, waiters = asyncio.run(looks())
    assert got is not None and "role 'ps' replica 0 (node 2) exited with code 1" in got.msg
    assert mapped_on == ["aws-batch-status-poller"]  # the cancelled look was never mapped
    assert [w.ids for w in waiters] in ([], [("j2",)])  # dropped at the latest by j2's round
    described = [j for n, kw in batch.calls if n == "describe_jobs" for j in kw["jobs"]]
    assert sorted(j for j in described if "#" in j) == ["j1#0", "j1#1", "j1#2"]


def test_settling_on_a_loop_from_a_thread_and_on_a_closed_loop() -> None:
    """``settle_on_loop``: the result or error computed on another thread is set on the loop;
    a future its waiter cancelled is not computed; a closed loop (nobody waits) is no error
    for the poller's thread."""
    computed: list[str] = []

    def compute(value: str) -> str:
        computed.append(value)
        if value == "boom":
            raise RuntimeError(value)
        return value

    async def answers() -> list[Any]:
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in range(3)]
        futures[2].cancel()
        for future, value in zip(futures, ["ok", "boom", "never"], strict=True):
            threading.Thread(target=settle_on_loop, args=(loop, future, functools.partial(compute, value))).start()
        return await asyncio.gather(*futures[:2], return_exceptions=True)

    ok, boom = asyncio.run(answers())
    assert ok == "ok" and isinstance(boom, RuntimeError) and sorted(computed) == ["boom", "ok"]
    closed = asyncio.new_event_loop()
    future = closed.create_future()
    closed.close()
    settle_on_loop(closed, future, lambda: "late")
    assert not future.done()


def test_a_scheduled_look_waiting_on_a_loop_holds_four_tracked_objects() -> None:
    """A scheduled look waits a whole poll, so what it holds outlives the garbage collector's
    young generations; in a triggerer watching thousands of jobs those objects bring on the
    full collections that hold its loop. A waiting look holds its future, the poller's
    waiter, the waiter's set of ids and one ``looks.Look``: four objects the collector tracks."""
    batch = FakeBatch()
    jobs = [f"j{n}" for n in range(1000)]
    for n, job_id in enumerate(jobs):
        batch.jobs[job_id] = container_job(job_id=job_id, name=f"app-{n}", status="RUNNABLE")
    sched = make(batch)
    for n, job_id in enumerate(jobs):
        sched.adopt_native_id(f"q1:app-{n}", job_id)
    assert sched.describe("q1:app-0") is not None  # every job described once: in the cache
    sched.poller.get(jobs, max_age=3600.0)

    async def waiting() -> int:
        loop = asyncio.get_running_loop()
        gc.collect()
        kept = gc.get_objects()  # held, so that no new object gets the id of one of them
        old = {id(o) for o in kept}
        looks = [sched.describe_on_loop_as(f"q1:app-{n}", _status_of, loop, period=3600.0) for n in range(len(jobs))]
        gc.collect()
        # What the looks hold: the new tracked objects reachable from the poller's waiters
        # (other tests' threads may make objects meanwhile; those are not counted).
        seen: set[int] = set()
        todo: list[Any] = list(sched.poller._waiters)
        while todo:
            obj = todo.pop()
            if id(obj) in seen or id(obj) in old or not gc.is_tracked(obj):
                continue
            seen.add(id(obj))
            todo.extend(gc.get_referents(obj))
        for look in looks:
            assert look is not None
            look.cancel()
        del kept
        return len(seen)

    held = asyncio.run(waiting())
    assert len(jobs) * 4 <= held <= len(jobs) * 4 + 5, held / len(jobs)


def _status_of(described: Any) -> Any:
    return described


def test_a_watcher_given_the_job_id_makes_no_look_up() -> None:
    """A fresh process (a restarted triggerer) told the job id (``adopt_native_id``, from the
    trigger's kwargs) describes the job through the poller's future without ListJobs; without
    it the job is found by name, as before, and ``native_id`` says what to carry."""
    batch = FakeBatch()
    batch.jobs["j1"] = mnp_job(job_id="j1", name="app-1", status="RUNNING")
    batch.jobs["j1"]["nodeProperties"]["nodeRangeProperties"][0]["container"]["environment"].append(
        {"name": "HF_TOKEN", "value": "s3cret"}
    )
    sched = make(batch)
    assert sched.describe_future("q1:app-1") is None  # job id unknown: describe it blocking
    sched.adopt_native_id("q1:app-1", "j1")
    future = sched.describe_future("q1:app-1")
    assert future is not None
    described = future.result(timeout=10)
    assert described is not None and described.state == AppState.RUNNING
    assert described.roles and described.roles[0].env["HF_TOKEN"] == "s3cret"  # what masking reads
    assert "list_jobs" not in batch.names()
    with pytest.raises(ValueError, match="native_id: '' is not a Batch job id of q1:app-1"):
        sched.adopt_native_id("q1:app-1", "")

    other = make(FakeBatch())
    other.client.jobs["j2"] = mnp_job(job_id="j2", name="app-2")
    assert other.native_id("q1:app-2") == "j2"  # found by name once (ListJobs) ...
    assert other.client.names().count("list_jobs") == 1
    assert other.native_id("q1:app-2") == "j2"  # ... then remembered
    assert other.client.names().count("list_jobs") == 1


@pytest.mark.parametrize(
    ("batch_status", "ended"),
    [
        ("SUCCEEDED", True),
        ("FAILED", True),
        ("RUNNING", False),
        ("RUNNABLE", False),
        ("SUBMITTED", False),
        (None, False),
    ],
)
def test_a_job_has_ended_once_it_succeeded_or_failed(batch_status: str | None, ended: bool) -> None:
    assert has_ended({"status": batch_status}) is ended
