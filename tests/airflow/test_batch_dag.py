"""AWS Batch DAGs against the moto server, with jobs run as real Docker containers: the example
(a multi-node job) and a single-node job, in the worker and deferred, and a retried task that
reattaches to its single-node job by its identity; the failure kinds moto's jobs get (a
container that exits 1, a missing image, a TerminateJob by hand, a cancel through our CLI)."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import pytest

try:
    from airflow.sdk.exceptions import TaskDeferred
except ImportError:  # Airflow 3.1
    from airflow.exceptions import TaskDeferred  # type: ignore[attr-defined,no-redef]

from airflow_provider_torchx._compat import AirflowFailException
from airflow_provider_torchx.core.failures import FailureKind
from airflow_provider_torchx.core.runner import get_runner
from airflow_provider_torchx.core.specs import AppDef, AppState, Resource, Role
from airflow_provider_torchx.failures import TorchXAppFailure, TorchXCancelled, TorchXJobFailed
from airflow_provider_torchx.operators.torchx import TorchXRunOperator
from airflow_provider_torchx.watch import task_identity
from tests.airflow.helpers import FakeTI, wait_until

pytestmark = [pytest.mark.airflow, pytest.mark.docker]

MODES = [pytest.param(False, id="worker"), pytest.param(True, id="deferred")]


@pytest.fixture
def batch_conn(aws_env: str, batch_queue: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The ``torchx_batch`` connection (queue, region) and the image variable the DAGs read."""
    extra = {"scheduler": "aws_batch", "cfg": f"queue={batch_queue}", "region_name": "us-east-1"}
    monkeypatch.setenv("AIRFLOW_CONN_TORCHX_BATCH", json.dumps({"conn_type": "torchx", "extra": extra}))
    monkeypatch.setenv("AIRFLOW_VAR_TORCHX_BATCH_IMAGE", "busybox:local")
    return batch_queue


@pytest.mark.parametrize("deferrable", MODES)
def test_batch_dag_reads_its_queue_from_the_connection(run_dag: Any, batch_conn: str, deferrable: bool) -> None:
    dag_run, out = run_dag("torchx_aws_batch", deferrable=deferrable)
    assert dag_run.state == "success", out[-5000:]
    handle = dag_run.get_task_instance("hello_batch").xcom_pull(task_ids="hello_batch")
    assert handle.startswith(f"aws_batch://torchx/{batch_conn}:"), handle
    assert "[sh/0] hello from AWS Batch node" in out  # moto: every node writes to one log stream
    ti = dag_run.get_task_instance("hello_batch")
    job_link = ti.xcom_pull(task_ids="hello_batch", key="_link_TorchXJobLink")
    assert job_link == f"/torchx/job?handle={quote(handle, safe='')}&conn_id=torchx_batch", job_link
    console = ti.xcom_pull(task_ids="hello_batch", key="_link_TorchXConsoleLink")
    assert console.startswith("https://us-east-1.console.aws.amazon.com/batch/"), console
    assert "#jobs/mnp-job/" in console
    # the usage summary, from moto's timestamps and attempts, logged and pushed in both modes
    usage = ti.xcom_pull(task_ids="hello_batch", key="usage")
    assert usage["attempts_count"] >= 1 and usage["run_time_s"] >= 0 and usage["node_seconds"] > 0
    assert "Usage:" in out and "Queue wait:" in out


@pytest.mark.parametrize("deferrable", MODES)
def test_single_node_batch_dag(run_dag: Any, batch_conn: str, deferrable: bool) -> None:
    dag_run, out = run_dag("torchx_test_batch_single", deferrable=deferrable)
    assert dag_run.state == "success", out[-5000:]
    ti = dag_run.get_task_instance("single")
    handle = ti.xcom_pull(task_ids="single")
    assert handle.startswith(f"aws_batch://torchx/{batch_conn}:"), handle
    assert "[sh/0] single-node replica 0 of role 0" in out
    native = get_runner().describe_native(handle)
    assert native is not None and native.request.job_def["type"] == "container"
    assert "#jobs/detail/" in ti.xcom_pull(task_ids="single", key="_link_TorchXConsoleLink")
    usage = ti.xcom_pull(task_ids="single", key="usage")
    assert [(a["role"], a["replica"]) for a in usage["attempts"]] == [("sh", 0)]  # moto: no exit code here


def test_retry_reattaches_to_its_single_node_job_by_identity(batch_conn: str) -> None:
    app = AppDef(
        "reattach1",
        roles=[
            Role(
                "main",
                image="busybox:local",
                entrypoint="sh",
                args=["-c", "sleep 2; echo done"],
                resource=Resource(1, 0, 64),
            )
        ],
    )
    run_id = f"reattach__{uuid.uuid4().hex[:12]}"

    def operator(deferrable: bool) -> TorchXRunOperator:
        return TorchXRunOperator(
            task_id="task",
            app=app,
            scheduler="aws_batch",
            cfg={"queue": batch_conn},
            poll_interval=0.5,
            deferrable=deferrable,
        )

    # Try 1 submits and defers (then its triggerer dies, say).
    with pytest.raises(TaskDeferred) as deferred:
        operator(True).execute({"ti": FakeTI(try_number=1, run_id=run_id)})  # type: ignore[arg-type]
    first = deferred.value.trigger.serialize()[1]["app_handle"]
    labels = task_identity({"ti": FakeTI(run_id=run_id)}).labels()  # type: ignore[typeddict-item]
    runner = get_runner()
    (found,) = runner.list("aws_batch", {"queue": batch_conn}, labels)
    assert found.app_handle == first
    # Try 2 (in the worker) finds it by its identity and adopts it instead of submitting again.
    handle = operator(False).execute({"ti": FakeTI(try_number=2, run_id=run_id)})  # type: ignore[arg-type]
    assert handle == first
    assert [a.app_handle for a in runner.list("aws_batch", {"queue": batch_conn}, labels)] == [first]
    status = runner.status(first)
    assert status is not None and status.state == AppState.SUCCEEDED
    native = runner.describe_native(first)
    assert native is not None and native.request.job_def["type"] == "container"


def busybox(name: str, script: str, image: str = "busybox:local") -> AppDef:
    return AppDef(
        name, roles=[Role("main", image=image, entrypoint="sh", args=["-c", script], resource=Resource(1, 0, 64))]
    )


def batch_operator(app: AppDef, batch_conn: str) -> TorchXRunOperator:
    return TorchXRunOperator(
        task_id="task", app=app, scheduler="aws_batch", cfg={"queue": batch_conn}, poll_interval=0.5, deferrable=False
    )


def stop_once_running(op: TorchXRunOperator, stop: Callable[[str], None]) -> None:
    """Call ``stop`` with the task's job's handle once the job runs."""
    handle = wait_until(lambda: op.app_handle, timeout=60, what="the submit")
    runner = get_runner()
    wait_until(lambda: runner.status(handle).state == AppState.RUNNING, timeout=60, what="the job to run")  # type: ignore[union-attr]
    stop(handle)


def test_a_terminatejob_by_hand_without_batchs_evidence_is_an_ordinary_failure(batch_conn: str) -> None:
    """A TerminateJob with a reason on no list: moto's server does not return
    ``isTerminated``, so there is no evidence of a cancel: the task fails as for any
    failure, retried (not ``TorchXCancelled``), naming the reason."""
    import boto3

    batch = boto3.client("batch")

    def terminate(handle: str) -> None:
        name = handle.rsplit(":", 1)[1]
        jobs = batch.list_jobs(jobQueue=batch_conn, filters=[{"name": "JOB_NAME", "values": [name]}])["jobSummaryList"]
        batch.terminate_job(jobId=jobs[0]["jobId"], reason="stopped by ops: disk full")

    op = batch_operator(busybox("byhand", "sleep 60"), batch_conn)
    thread = threading.Thread(target=stop_once_running, args=(op, terminate), daemon=True)
    thread.start()
    with pytest.raises(TorchXJobFailed, match="stopped by ops: disk full") as raised:
        op.execute({"ti": FakeTI(run_id=f"byhand__{uuid.uuid4().hex[:12]}")})  # type: ignore[arg-type]
    thread.join(5)
    assert raised.value.kind == FailureKind.INFRA, raised.value.why  # ended from outside the job's code
    assert not isinstance(raised.value, AirflowFailException | TorchXCancelled)
    status = get_runner().status(str(op.app_handle))
    assert status is not None and status.state == AppState.FAILED and "stopped by ops: disk full" in status.msg


def test_a_cancel_through_our_cli_is_cancelled_and_not_retried(batch_conn: str) -> None:
    from airflow_provider_torchx.core.cli import main

    op = batch_operator(busybox("clicancel", "sleep 60"), batch_conn)
    codes: list[int] = []
    thread = threading.Thread(target=stop_once_running, args=(op, lambda h: codes.append(main(["cancel", h]))))
    thread.start()
    with pytest.raises(TorchXCancelled, match="cancelled from outside this task") as raised:
        op.execute({"ti": FakeTI(run_id=f"clicancel__{uuid.uuid4().hex[:12]}")})  # type: ignore[arg-type]
    thread.join(5)
    assert codes == [0] and raised.value.kind == FailureKind.CANCELLED
    assert isinstance(raised.value, AirflowFailException)


def test_a_container_that_exits_1_is_an_app_failure(batch_conn: str) -> None:
    ti = FakeTI(run_id=f"exit1__{uuid.uuid4().hex[:12]}")
    with pytest.raises(TorchXAppFailure) as raised:
        batch_operator(busybox("exit1", "echo bad input >&2; exit 1"), batch_conn).execute({"ti": ti})  # type: ignore[arg-type]
    assert (raised.value.kind, raised.value.why) == (FailureKind.APP, "exit code 1 on main/0")
    assert ti.xcoms["usage"]["failure_kind"] == "app"


def test_an_image_that_does_not_exist_on_moto(batch_conn: str) -> None:
    """moto's server marks such a job FAILED with neither a ``statusReason`` nor an exit code
    (it does not model ECS's ``CannotPullContainerError``, which real AWS gives and the
    decision table reads as ``config``: ``tests/core/test_failures.py``); with nothing to go
    on, the table's last row says ``infra``, and never ``cancelled``."""
    app = busybox("noimage", "true", image=f"busybox:missing-{uuid.uuid4().hex[:8]}")
    with pytest.raises(TorchXJobFailed) as raised:
        batch_operator(app, batch_conn).execute({"ti": FakeTI(run_id=f"noimage__{uuid.uuid4().hex[:12]}")})  # type: ignore[arg-type]
    desc = get_runner().describe_app(str(raised.value.app_handle))
    assert desc is not None and desc.state == AppState.FAILED and desc.cancel_reason is None
    assert raised.value.kind == FailureKind.INFRA and not isinstance(raised.value, AirflowFailException)


def test_every_node_of_a_submitted_job_gets_the_task_instances_checkpoint_dir(batch_conn: str) -> None:
    """Two tries of one task instance submit jobs with the same location (the second try's
    job at attempt 1), another map index gets another; read back from the registered job
    definition."""
    app = AppDef(
        "ckpt",
        roles=[Role("w", image="busybox:local", entrypoint="true", num_replicas=2, resource=Resource(1, 0, 64))],
    )
    run_id = f"ckpt__{uuid.uuid4().hex[:12]}"
    runner, handles = get_runner(), []

    def submitted(try_number: int, map_index: int) -> list[tuple[str, str]]:
        op = TorchXRunOperator(
            task_id="task",
            app=app,
            scheduler="aws_batch",
            cfg={"queue": batch_conn, "retry_on": "infra"},
            checkpoint_root="s3://bucket/ckpt",
            wait_for_completion=False,
            reattach_on_retry=False,
        )
        ti = FakeTI(try_number=try_number, map_index=map_index, run_id=run_id)
        handle = op.execute({"ti": ti})  # type: ignore[arg-type]
        assert ti.xcoms["checkpoint_dir"] == op.checkpoint_dir
        handles.append(handle)
        desc = runner.describe_app(handle)  # describe reads it back from the job
        assert desc is not None and desc.checkpoint_dir == op.checkpoint_dir
        native = runner.describe_native(handle)
        assert native is not None
        envs = [
            {e["name"]: e["value"] for e in node["container"]["environment"]}
            for node in native.request.job_def["nodeProperties"]["nodeRangeProperties"]
        ]
        return [(env["TORCHX_CHECKPOINT_DIR"], env["TORCHX_ATTEMPT"]) for env in envs]

    where = f"s3://bucket/ckpt/dag/{quote(run_id, safe='')}/task/0"
    try:
        assert submitted(1, 0) == [(where, "0")]
        assert submitted(2, 0) == [(where, "1")]
        assert submitted(1, 1) == [(where[:-1] + "1", "0")]
    finally:
        for handle in handles:
            runner.cancel(handle)
