"""Guardrails on AWS Batch against the moto server over HTTP (the Docker-backed one).

``start_timeout``: moto keeps a job PENDING while it depends on a job that never finishes; the
guard trips in the worker's wait and in the trigger, the job is terminated, and the message gives
AWS's account (the job's state, its dependency, the queue's and its compute environment's
states). Why a job does not fit a managed environment: ``tests/core/aws_batch/test_stuck.py``.

``max_cost`` without rates: a running job's attempt priced at AWS's prices (moto's EC2 instance
and ECS container instance, the Price List through botocore's ``Stubber``; what moto lacks, the
attempt's container instance, set on its ``DescribeJobs`` entries' attempts, each validated
against Batch's ``AttemptDetail``): the task fails without retry naming the guard, the budget and the cost
seen, in the worker and through the real trigger; an attempt AWS cannot price trips nothing.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import botocore.session
import pytest
from botocore.validate import validate_parameters

from airflow_provider_torchx._compat import AirflowFailException
from airflow_provider_torchx.core.guards import Guards
from airflow_provider_torchx.core.runner import Runner, get_runner
from airflow_provider_torchx.core.schedulers.aws_batch import create_scheduler
from airflow_provider_torchx.core.specs import AppDef, AppState, Resource, Role
from airflow_provider_torchx.hooks.torchx import TorchXHook
from airflow_provider_torchx.operators.torchx import TorchXRunOperator
from airflow_provider_torchx.outcome import End
from airflow_provider_torchx.triggers.torchx import TorchXJobTrigger
from airflow_provider_torchx.watch import TaskWatcher
from tests.airflow.helpers import FakeTI, run_deferred, wait_until
from tests.airflow.test_guardrails import Counter, guard_lines
from tests.core.aws_batch.test_pricing import Calls, container_instances, pricer, stubbed_pricing

try:
    from airflow.sdk.exceptions import TaskDeferred
except ImportError:  # Airflow 3.1
    from airflow.exceptions import TaskDeferred  # type: ignore[attr-defined,no-redef]

pytestmark = [pytest.mark.timeout(90), pytest.mark.docker]


def submit_pending(queue: str, cpu: int = 1) -> tuple[str, str]:
    """A job of ``cpu`` vCPUs on ``queue`` that depends on a job id that never finishes (moto
    keeps it PENDING), submitted past the preflight: ``(handle, job id)``."""
    batch = boto3.client("batch")
    sched = create_scheduler("torchx", client=batch)
    role = Role("main", image="busybox:local", entrypoint="true", resource=Resource(cpu, 0, 512))
    app = AppDef("stuck", roles=[role])
    job = sched.submit_dryrun(app, {"queue": queue}).request
    arn = batch.register_job_definition(**job.job_def)["jobDefinitionArn"]
    never = [{"jobId": "never-finishes"}]
    job_id = batch.submit_job(jobDefinition=arn, dependsOn=never, **job.submit_request())["jobId"]
    return f"aws_batch://torchx/{queue}:{job.name}", job_id


def terminated(job_id: str) -> dict[str, str]:
    """The job once AWS ended it (a terminated job ends FAILED, with the reason given)."""
    batch = boto3.client("batch")

    def ended() -> dict[str, str] | None:
        job = batch.describe_jobs(jobs=[job_id])["jobs"][0]
        return job if job["status"] in ("FAILED", "SUCCEEDED") else None

    return wait_until(ended, timeout=30, what=f"{job_id} to end")


def test_a_batch_job_pending_on_a_dependency_trips_start_timeout_in_the_worker_and_is_terminated(
    aws_env: str, batch_queue: str
) -> None:
    handle, job_id = submit_pending(batch_queue)
    runner: Runner = get_runner()
    watcher = TaskWatcher(
        runner, handle, logging.getLogger("test"), stream_logs=False, guards=Guards(start_timeout=2.0)
    )
    began = time.time()
    outcome = watcher.wait_for_outcome(0.5, None, began)
    assert outcome.end is End.GUARDRAIL and outcome.guard == "start_timeout", outcome
    message = str(outcome.message)
    assert message.startswith(f"start_timeout=2s: TorchX job {handle} did not start within 2s of its submission")
    assert "it depends on never-finishes" in message, message
    assert f"queue {batch_queue!r} ENABLED/VALID" in message
    assert f"compute environment '{batch_queue}-ce' ENABLED/VALID" in message, message
    job = terminated(job_id)
    assert job["status"] == "FAILED" and "guardrail start_timeout=2 tripped" in job["statusReason"], job
    status = runner.status(handle)
    assert status is not None and status.state in (AppState.CANCELLED, AppState.FAILED)


def test_a_batch_job_pending_on_a_dependency_trips_start_timeout_in_the_trigger(aws_env: str, batch_queue: str) -> None:
    handle, job_id = submit_pending(batch_queue)
    (event,) = run_deferred(TorchXJobTrigger(handle, poll_interval=0.5, stream_logs=False, start_timeout=1.5))
    assert event["status"] == "guardrail" and event["guard"] == "start_timeout", event
    assert "it depends on never-finishes" in event["message"], event
    assert terminated(job_id)["status"] == "FAILED"


# ---------------------------------------------------------------------- max_cost at AWS's prices

#: The Price List's on-demand price of a g4dn.xlarge (4 vCPUs) in this test: a 1-vCPU job takes
#: a quarter of it, $900 an hour, $0.25 a second.
HOURLY = "3600.00"
PER_SECOND = 0.25
BUDGET = 1.0
POLL = 0.5


def spender(seconds: int = 60) -> AppDef:
    """One 1-vCPU replica that sleeps."""
    role = Role(
        "main", image="busybox:local", entrypoint="sh", args=["-c", f"sleep {seconds}"], resource=Resource(1, 0, 64)
    )
    return AppDef(f"spender-{uuid.uuid4().hex[:6]}", roles=[role])


def operator(batch_queue: str, deferrable: bool, app: AppDef | None = None) -> TorchXRunOperator:
    return TorchXRunOperator(
        task_id="task",
        app=app or spender(),
        scheduler="aws_batch",
        cfg={"queue": batch_queue},
        poll_interval=POLL,
        deferrable=deferrable,
        max_cost=BUDGET,
    )


@pytest.fixture
def metrics(monkeypatch: pytest.MonkeyPatch) -> Counter:
    counter = Counter()
    monkeypatch.setattr("airflow_provider_torchx.metrics.stats", lambda: counter)
    return counter


@pytest.fixture
def aws_priced(aws_env: str, batch_queue: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Calls]:
    """No rates; the task's shared Batch scheduler prices its attempts over moto's EC2 and ECS
    and a stubbed Price List (one GetProducts of the g4dn.xlarge at ``HOURLY``), and moto's
    ``DescribeJobs`` entries name the on-demand instance's container instance for each
    attempt (moto says ``TBD``). Yields the AWS calls the pricing made."""
    monkeypatch.delenv("AIRFLOW__TORCHX__RATES", raising=False)
    calls = Calls()
    arn = container_instances()["on-demand"]
    sched: Any = TorchXHook(scheduler="aws_batch").get_runner()._scheduler("aws_batch")
    pricing, _ = stubbed_pricing(calls, price=HOURLY)
    monkeypatch.setattr(sched, "pricer", pricer(calls, pricing, tmp_path))
    detail = botocore.session.get_session().get_service_model("batch").shape_for("AttemptDetail")

    def on_the_instance(parsed: dict[str, Any], **_: Any) -> None:
        for job in parsed.get("jobs", []):
            for attempt in job.get("attempts") or []:
                attempt["container"]["containerInstanceArn"] = arn
                validate_parameters(attempt, detail)

    events = sched.poller.client.meta.events
    events.register("after-call.batch.DescribeJobs", on_the_instance, unique_id="test-container-instance")
    try:
        yield calls
    finally:
        events.unregister("after-call.batch.DescribeJobs", unique_id="test-container-instance")


def assert_cost_tripped(error: str, cost: float, handle: str, out: str, metrics: Counter) -> None:
    """The task's error names the guard, the budget and the cost seen; the cost crossed the
    budget within a few seconds' spend; one guard line, one metric; the job is terminated."""
    assert error.startswith(f"max_cost=1: TorchX job {handle} cost ${cost:.2f}, over its budget of $1.00"), error
    assert error.endswith("the job was cancelled and the task fails without retry"), error
    assert BUDGET < cost <= BUDGET + PER_SECOND * 8, cost
    assert len(guard_lines(out, "max_cost")) == 1, out[-3000:]
    assert [tags["guard"] for tags in metrics.of("torchx.job.guardrail")] == ["max_cost"]
    job_id = get_runner().native_id(handle)
    assert job_id is not None
    assert "guardrail max_cost=1 tripped" in terminated(job_id)["statusReason"]


def test_max_cost_without_rates_stops_a_batch_job_priced_at_aws_prices_in_the_worker(
    batch_queue: str, aws_priced: Calls, metrics: Counter, capfd: pytest.CaptureFixture[str]
) -> None:
    ti = FakeTI(run_id=f"cost-batch-worker-{uuid.uuid4().hex[:6]}")
    with pytest.raises(AirflowFailException) as failed:
        operator(batch_queue, deferrable=False).execute({"ti": ti})  # type: ignore[arg-type]
    handle = ti.xcoms["app_handle"]
    budget = ti.xcoms["usage"]["budget"]
    assert budget["max_cost"] == BUDGET and budget["hit"] is True
    out, err = capfd.readouterr()
    assert_cost_tripped(str(failed.value), budget["cost_usd"], handle, out + err, metrics)
    assert aws_priced.names[:4] == [
        "DescribeContainerInstances",
        "DescribeInstances",
        "DescribeInstanceTypes",
        "GetProducts",
    ]


def test_max_cost_without_rates_stops_a_batch_job_priced_at_aws_prices_deferred(
    batch_queue: str, aws_priced: Calls, metrics: Counter, capfd: pytest.CaptureFixture[str]
) -> None:
    op = operator(batch_queue, deferrable=True)
    ti = FakeTI(run_id=f"cost-batch-deferred-{uuid.uuid4().hex[:6]}")
    with pytest.raises(TaskDeferred) as deferred:
        op.execute({"ti": ti})  # type: ignore[arg-type]
    (event,) = run_deferred(deferred.value.trigger)
    assert event["status"] == "guardrail" and event["guard"] == "max_cost" and event["limit"] == BUDGET, event
    with pytest.raises(AirflowFailException) as failed:
        op.execute_complete({"ti": ti}, event)  # type: ignore[arg-type]
    out, err = capfd.readouterr()
    assert_cost_tripped(str(failed.value), event["cost_usd"], ti.xcoms["app_handle"], out + err, metrics)


def test_max_cost_without_rates_never_trips_on_an_attempt_aws_cannot_price(
    batch_queue: str, aws_env: str, metrics: Counter, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """moto's own entries (the attempt's container instance ``TBD``) cannot be priced: the job
    runs to its end, the task succeeds, and the log says once that ``max_cost`` cannot be held
    for that attempt."""
    monkeypatch.delenv("AIRFLOW__TORCHX__RATES", raising=False)
    ti = FakeTI(run_id=f"cost-batch-na-{uuid.uuid4().hex[:6]}")
    handle = operator(batch_queue, deferrable=False, app=spender(seconds=3)).execute({"ti": ti})  # type: ignore[arg-type]
    status = get_runner().status(handle)
    assert status is not None and status.state == AppState.SUCCEEDED
    out, err = capfd.readouterr()
    unheld = [line for line in (out + err).splitlines() if "max_cost=1 cannot be held for main[0] attempt #1" in line]
    assert len(unheld) == 1, (out + err)[-3000:]
    assert "containerInstanceArn='TBD'" in unheld[0]
    assert metrics.of("torchx.job.guardrail") == []
