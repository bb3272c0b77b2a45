"""Guardrails (``core/guards.py``) on real local jobs with faked GPUs
(``AIRFLOW_TORCHX_LOCAL_GPUS``): ``start_timeout`` stops a job waiting for GPUs that another
job holds, in the worker and in the trigger; ``max_gpu_hours`` stops a 2-GPU job within a poll
of crossing its budget; each trip cancels the job, writes one line, counts the metric and
fails the task without retry. Parse-time checks of the two limits."""

from __future__ import annotations

import json
import socket
import time
from datetime import timedelta
from typing import Any

import pytest

from airflow_provider_torchx._compat import AirflowFailException
from airflow_provider_torchx.core.runner import Runner
from airflow_provider_torchx.core.specs import AppState, parse_app_handle
from airflow_provider_torchx.failures import (
    FailureKind,
    TorchXGuardrailTripped,
    TorchXJobFailed,
    TorchXStartTimedOut,
    TorchXTimedOut,
)
from airflow_provider_torchx.hooks.torchx import TorchXSettings
from airflow_provider_torchx.operators.torchx import TorchXRunOperator
from airflow_provider_torchx.outcome import Outcome
from airflow_provider_torchx.triggers.torchx import TorchXJobTrigger
from tests.airflow.helpers import CFG, Counter, FakeTI, ended, gpu_app, run_deferred

POLL = 0.5


def app_id(handle: str) -> str:
    return parse_app_handle(handle).app_id


def guard_lines(text: str, guard: str) -> list[str]:
    return [line for line in text.splitlines() if f"Guardrail {guard} tripped" in line]


def assert_holder_untouched(runner: Runner, holder: str) -> None:
    status = runner.status(holder)
    assert status is not None and status.state == AppState.RUNNING
    assert status.roles[0].replicas[0].devices == "0,1"  # still its own: nothing it held was freed


def assert_waiter_stopped_and_task_failed(
    runner: Runner, holder: str, waiter: str, event: dict[str, Any], limit: float, capfd: pytest.CaptureFixture[str]
) -> None:
    """``event`` is the ``start_timeout`` trip of ``waiter`` (held by ``holder``): the job was
    cancelled, the holder untouched, and the resumed task fails without retry with one line."""
    assert event["status"] == "guardrail" and event["guard"] == "start_timeout" and event["limit"] == limit
    assert "waiting for 2 GPUs, 0 free, held by " + app_id(holder) in event["message"]
    assert ended(runner, waiter) == AppState.CANCELLED
    assert_holder_untouched(runner, holder)
    op = TorchXRunOperator(task_id="task", app=gpu_app("waiter", 2), scheduler="local_cwd")
    with pytest.raises(AirflowFailException, match=rf"^start_timeout={limit:g}s: TorchX job"):
        op.execute_complete({"ti": FakeTI(run_id=f"guard-start-{limit:g}")}, event)  # type: ignore[arg-type]
    out, err = capfd.readouterr()
    assert len(guard_lines(out + err, "start_timeout")) == 1


def test_start_timeout_stops_a_job_waiting_for_gpus_another_job_holds_in_the_worker(
    local_jobs: tuple[Runner, list[str]], holder: str, two_gpus: Counter, capfd: pytest.CaptureFixture[str]
) -> None:
    runner, handles = local_jobs
    op = TorchXRunOperator(
        task_id="task",
        app=gpu_app("waiter", 1),
        scheduler="local_cwd",
        cfg=CFG,
        poll_interval=POLL,
        deferrable=False,
        start_timeout=2,
    )
    ti = FakeTI(run_id="guard-start-worker")
    began = time.monotonic()
    with pytest.raises(TorchXStartTimedOut) as raised:  # an AirflowFailException: no retry policy
        op.execute({"ti": ti})  # type: ignore[arg-type]
    took = time.monotonic() - began
    assert isinstance(raised.value, AirflowFailException) and raised.value.kind == FailureKind.CAPACITY
    handles.append(ti.xcoms["app_handle"])
    message = str(raised.value)
    assert message.startswith("start_timeout=2s: TorchX job local_cwd://")
    assert "still PENDING after" in message and "waiting for 1 GPU, 0 free, held by " + app_id(holder) in message
    assert ended(runner, ti.xcoms["app_handle"]) == AppState.CANCELLED
    assert_holder_untouched(runner, holder)
    out, err = capfd.readouterr()
    assert len(guard_lines(out + err, "start_timeout")) == 1, out + err
    tags = {"scheduler": "local_cwd", "dag_id": op.dag_id, "task_id": "task"}
    assert two_gpus.of("torchx.job.guardrail") == [{**tags, "guard": "start_timeout"}]
    assert two_gpus.of("torchx.job.failed") == [{**tags, "kind": "capacity"}]
    assert took < 2.0 + POLL + 5, took  # acts within a poll of the limit (a loaded machine's slack)


def test_start_timeout_in_the_trigger_cancels_and_the_resumed_task_fails_without_retry(
    local_jobs: tuple[Runner, list[str]], holder: str, two_gpus: Counter, capfd: pytest.CaptureFixture[str]
) -> None:
    runner, handles = local_jobs
    waiter = runner.run(gpu_app("waiter", 2), "local_cwd", CFG)
    handles.append(waiter)
    trigger = TorchXJobTrigger(
        waiter, poll_interval=POLL, host=socket.gethostname(), started_at=time.time() + 3600, start_timeout=1.5
    )
    (event,) = run_deferred(trigger)  # started_at is ignored: the job's own submission time counts
    assert_waiter_stopped_and_task_failed(runner, holder, waiter, event, 1.5, capfd)


def test_max_gpu_hours_stops_a_two_gpu_job_within_a_poll_of_crossing_its_budget(
    local_jobs: tuple[Runner, list[str]], two_gpus: Counter, capfd: pytest.CaptureFixture[str]
) -> None:
    runner, handles = local_jobs
    budget = 2 * 3.0 / 3600  # three seconds of two GPUs
    job = runner.run(gpu_app("spender", 2), "local_cwd", CFG)
    handles.append(job)
    (event,) = run_deferred(TorchXJobTrigger(job, poll_interval=POLL, host=socket.gethostname(), max_gpu_hours=budget))
    assert event["status"] == "guardrail" and event["guard"] == "max_gpu_hours"
    over_s = (event["gpu_hours"] - budget) * 3600 / 2  # how long after the crossing the guard acted
    assert 0 < over_s <= POLL + 2.0, over_s  # one poll (and a loaded machine's latency)
    assert ended(runner, job) == AppState.CANCELLED
    ti = FakeTI(run_id="guard-gpu-hours")
    op = TorchXRunOperator(task_id="task", app=gpu_app("spender", 2), scheduler="local_cwd")
    with pytest.raises(TorchXGuardrailTripped, match=r"^max_gpu_hours=0.00166667: TorchX job .* over its budget"):
        op.execute_complete({"ti": ti}, event)  # type: ignore[arg-type]
    assert ti.xcoms["usage"]["failure_kind"] == "guardrail"
    assert ti.xcoms["usage"]["budget"] == {"max_gpu_hours": budget, "gpu_hours": event["gpu_hours"], "hit": True}
    out, err = capfd.readouterr()
    assert "GPU budget hit: max_gpu_hours=0.00166667" in out + err
    assert len(guard_lines(out + err, "max_gpu_hours")) == 1
    assert [tags["guard"] for tags in two_gpus.of("torchx.job.guardrail")] == ["max_gpu_hours"]


#: $1 a GPU-second: a 2-GPU job spends $2 a second.
DEAR = {"gpu_hour": 3600.0}


def test_max_cost_stops_a_two_gpu_job_within_a_poll_of_crossing_its_budget_in_the_worker(
    local_jobs: tuple[Runner, list[str]],
    two_gpus: Counter,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runner, handles = local_jobs
    monkeypatch.setenv("AIRFLOW__TORCHX__RATES", json.dumps(DEAR))
    op = TorchXRunOperator(
        task_id="task",
        app=gpu_app("spender", 2),
        scheduler="local_cwd",
        cfg=CFG,
        poll_interval=POLL,
        deferrable=False,
        max_cost=6,
    )
    ti = FakeTI(run_id="guard-cost-worker")
    with pytest.raises(AirflowFailException, match=r"^max_cost=6: TorchX job local_cwd://.* over its budget of \$6.00"):
        op.execute({"ti": ti})  # type: ignore[arg-type]
    handles.append(ti.xcoms["app_handle"])
    assert ended(runner, ti.xcoms["app_handle"]) == AppState.CANCELLED
    budget = ti.xcoms["usage"]["budget"]
    assert budget["max_cost"] == 6.0 and budget["hit"] is True
    over_s = (budget["cost_usd"] - 6.0) / 2  # how long after the crossing the guard acted
    assert 0 < over_s <= POLL + 2.0, over_s  # one poll (and a loaded machine's latency)
    out, err = capfd.readouterr()
    assert "Cost budget hit: max_cost=6" in out + err and len(guard_lines(out + err, "max_cost")) == 1
    assert [tags["guard"] for tags in two_gpus.of("torchx.job.guardrail")] == ["max_cost"]


def test_max_cost_stops_a_two_gpu_job_within_a_poll_of_crossing_its_budget_deferred(
    local_jobs: tuple[Runner, list[str]], two_gpus: Counter
) -> None:
    runner, handles = local_jobs
    job = runner.run(gpu_app("spender", 2), "local_cwd", CFG)
    handles.append(job)
    trigger = TorchXJobTrigger(job, poll_interval=POLL, host=socket.gethostname(), max_cost=6.0, rates=DEAR)
    (event,) = run_deferred(trigger)
    assert event["status"] == "guardrail" and event["guard"] == "max_cost"
    over_s = (event["cost_usd"] - 6.0) / 2
    assert 0 < over_s <= POLL + 2.0, over_s
    assert ended(runner, job) == AppState.CANCELLED


def test_max_cost_with_nothing_to_price_the_job_fails_before_submitting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("AIRFLOW__TORCHX__RATES", raising=False)
    op = TorchXRunOperator(task_id="t", component="utils.echo", scheduler="local_cwd", max_cost=10)
    with pytest.raises(AirflowFailException, match=r"max_cost=10: the job cannot be priced, .*give rates"):
        op.execute({"ti": (ti := FakeTI(run_id="guard-cost-unpriced"))})  # type: ignore[arg-type]
    assert "app_handle" not in ti.xcoms  # nothing was submitted


def test_the_task_hands_its_guards_to_a_scheduler_that_holds_them(
    local_jobs: tuple[Runner, list[str]], two_gpus: Counter
) -> None:
    """Run options of the guards' names (``guards.guard_cfg``): the task's values reach the
    local supervisor's request."""
    runner, handles = local_jobs
    op = TorchXRunOperator(
        task_id="task",
        app=gpu_app("handed", 1, seconds=0),
        scheduler="local_cwd",
        cfg={**CFG, "max_gpu_hours": 5.0},  # the task's own guard replaces it
        poll_interval=POLL,
        deferrable=False,
        start_timeout=30,
        max_gpu_hours=0.25,
    )
    ti = FakeTI(run_id="guard-handed")
    op.execute({"ti": ti})  # type: ignore[arg-type]
    handles.append(ti.xcoms["app_handle"])
    local = runner._scheduler("local_cwd")
    request = local.records.request(app_id(ti.xcoms["app_handle"]))  # type: ignore[attr-defined]
    assert (request["start_timeout"], request["max_gpu_hours"]) == (30.0, 0.25)


def test_a_guard_the_supervisor_held_fails_the_task_as_a_watchers_trip_does(
    local_jobs: tuple[Runner, list[str]], holder: str, two_gpus: Counter, capfd: pytest.CaptureFixture[str]
) -> None:
    """The supervisor trips (the trigger holds no guard): the event, the message, the line
    and the metric are a watcher's trip's, and the task fails without retry."""
    runner, handles = local_jobs
    waiter = runner.run(gpu_app("waiter", 2), "local_cwd", {**CFG, "start_timeout": 1.0})
    handles.append(waiter)
    (event,) = run_deferred(TorchXJobTrigger(waiter, poll_interval=POLL, host=socket.gethostname()))
    assert event["message"].startswith(f"start_timeout=1s: TorchX job {waiter} did not start within 1s")
    assert event["message"].endswith("the job was cancelled and the task fails without retry")
    assert_waiter_stopped_and_task_failed(runner, holder, waiter, event, 1.0, capfd)
    assert [tags["guard"] for tags in two_gpus.of("torchx.job.guardrail")] == ["start_timeout"]


# ---------------------------------------------------------------------- the limits


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"start_timeout": 0}, r"start_timeout: 0 is not allowed: expected a number of seconds or a timedelta > 0"),
        ({"start_timeout": timedelta(seconds=-5)}, r"start_timeout: datetime.timedelta\(.*\) is not allowed"),
        ({"max_gpu_hours": 0}, r"max_gpu_hours: 0 is not allowed: expected a number of GPU-hours > 0"),
        ({"max_gpu_hours": -1.5}, r"max_gpu_hours: -1.5 is not allowed"),
        ({"max_cost": -20}, r"max_cost: -20 is not allowed: expected a number of US dollars > 0"),
        ({"max_cost": "ten"}, r"max_cost: 'ten' is not allowed"),
    ],
)
def test_a_zero_or_negative_limit_fails_when_the_dag_is_parsed(kwargs: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        TorchXRunOperator(task_id="t", component="utils.echo", scheduler="local_cwd", **kwargs)


class _Hook:
    def __init__(self, **limits: float | None) -> None:
        self.settings = TorchXSettings(scheduler="local_cwd", **limits)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("task", "connection", "expected"),
    [
        ({}, {}, (None, None)),
        ({}, {"start_timeout": 600.0, "max_gpu_hours": 8.0}, (600.0, 8.0)),
        ({"start_timeout": timedelta(minutes=1), "max_gpu_hours": 2.0}, {"start_timeout": 600.0}, (60.0, 2.0)),
        ({"max_gpu_hours": 9.0}, {"max_gpu_hours": 8.0}, (None, 8.0)),  # the smaller budget wins
    ],
)
def test_the_tasks_limits_over_the_connections_and_the_smaller_budget_wins(
    task: dict[str, Any], connection: dict[str, float], expected: tuple[float | None, float | None]
) -> None:
    op = TorchXRunOperator(task_id="t", component="utils.echo", scheduler="local_cwd", **task)
    guards = op.guards(_Hook(**connection), since=5.0)  # type: ignore[arg-type]
    assert (guards.start_timeout, guards.max_gpu_hours, guards.since) == (*expected, 5.0)


@pytest.mark.parametrize(
    ("fields", "counted"),
    [
        # the watcher's kind of the failure decides (watch.py: failure_kind), not the words
        ({"failure_kind": "timeout", "failure_why": "Slurm: TIMEOUT on main/0"}, True),
        ({"failure_kind": "app", "tail": ["attempt_timeout=5 is what the trainer printed"]}, False),
        # an event without a kind: the job's reason classified (core/failures.py)
        ({"message": "ended FAILED: replica g/0 ran longer than attempt_timeout=5 (seconds) and was stopped"}, True),
        ({"message": "ended FAILED: Job attempt duration exceeded timeout"}, True),  # AWS Batch's statusReason
    ],
)
def test_a_job_ended_by_its_attempts_time_limit_gets_the_guard_line_and_metric(
    local_jobs: tuple[Runner, list[str]],
    two_gpus: Counter,
    capfd: pytest.CaptureFixture[str],
    fields: dict[str, Any],
    counted: bool,
) -> None:
    runner, _ = local_jobs
    op = TorchXRunOperator(task_id="task", app=gpu_app("timed", 1), scheduler="local_cwd")
    op._runner = runner
    event = {
        "status": "failed",
        "state": "FAILED",
        "app_handle": "local_cwd://torchx/timed-0",
        "message": "ended FAILED: main/0 exited with 1",
        **fields,
    }
    with pytest.raises(TorchXJobFailed, match="ended FAILED") as raised:  # retried, as before
        op._finish(Outcome.from_event(event), {"ti": FakeTI()}, None, None)  # type: ignore[arg-type]
    assert not isinstance(raised.value, AirflowFailException)
    assert isinstance(raised.value, TorchXTimedOut) == counted
    out, err = capfd.readouterr()
    assert len(guard_lines(out + err, "attempt_timeout")) == int(counted), out + err
    assert [tags["guard"] for tags in two_gpus.of("torchx.job.guardrail")] == ["attempt_timeout"] * counted


def test_the_connections_extras_give_the_defaults_and_a_bad_one_fails_the_task_before_submitting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    extra = {"scheduler": "local_cwd", "start_timeout": "600", "max_gpu_hours": 8}
    monkeypatch.setenv("AIRFLOW_CONN_TORCHX_GUARDED", json.dumps({"conn_type": "torchx", "extra": extra}))
    op = TorchXRunOperator(task_id="t", component="utils.echo", torchx_conn_id="torchx_guarded", max_gpu_hours=9)
    guards = op.guards(op.hook(), since=0.0)
    assert (guards.start_timeout, guards.max_gpu_hours) == (600.0, 8.0)
    bad = {"scheduler": "local_cwd", "max_gpu_hours": -1}
    monkeypatch.setenv("AIRFLOW_CONN_TORCHX_GUARDED", json.dumps({"conn_type": "torchx", "extra": bad}))
    with pytest.raises(AirflowFailException, match=r"connection 'torchx_guarded' extra max_gpu_hours: -1 is not"):
        op.execute({"ti": (ti := FakeTI(run_id="guard-bad-extra"))})  # type: ignore[arg-type]
    assert "app_handle" not in ti.xcoms  # nothing was submitted
