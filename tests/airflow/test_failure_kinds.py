"""What the operator and the sensor raise for a failed job (``failures.py``: the kind's
``TorchXJobFailed``, never-retried classes where the task never retried), on real local jobs;
``torchx_retry_policy``'s rules, one test per row; and ``dag.test()`` of a DAG with the policy
(an app error fails after one try, a SIGKILLed replica is retried and its next try succeeds)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_torchx._compat import AirflowFailException
from airflow_provider_torchx.core.failures import Failure, FailureKind
from airflow_provider_torchx.core.runner import Runner
from airflow_provider_torchx.core.schedulers.api import CancelledBy
from airflow_provider_torchx.core.specs import AppDef, AppState, Role
from airflow_provider_torchx.failures import (
    TorchXAppFailure,
    TorchXCancelled,
    TorchXCapacityFailure,
    TorchXConfigFailure,
    TorchXConfigRefused,
    TorchXInfraFailure,
    TorchXJobFailed,
    TorchXTimedOut,
    failure_block,
    failure_error,
    torchx_retry_policy,
)
from airflow_provider_torchx.operators.torchx import TorchXRunOperator
from airflow_provider_torchx.outcome import Outcome
from airflow_provider_torchx.sensors.torchx import TorchXJobSensor
from tests.airflow.helpers import FakeTI, wait_until
from tests.fixtures import aborted_node
from tests.fixtures.airflow import REPO, AirflowEnv

try:
    from airflow.sdk import ExceptionRetryPolicy, RetryAction, RetryRule
except ImportError:  # Airflow < 3.3: no retry policies
    ExceptionRetryPolicy = RetryAction = RetryRule = None  # type: ignore[assignment,misc]
#: The policy's own tests need Airflow's retry policies (3.3); its error before 3.3 is tested on every line.
needs_policies = pytest.mark.skipif(RetryAction is None, reason="retry policies arrived in Airflow 3.3")


def sh(name: str, script: str) -> AppDef:
    return AppDef(name, roles=[Role("w", image="local", entrypoint="sh", args=["-c", script])])


def operator(app: AppDef, **kw: Any) -> TorchXRunOperator:
    return TorchXRunOperator(task_id="task", app=app, scheduler="local_cwd", poll_interval=0.2, deferrable=False, **kw)


# ------------------------------------------------------------------ the operator and the sensor


def test_an_exit_1_raises_the_app_failure_with_its_kind_handle_and_log_line(
    local_jobs: tuple[Runner, list[str]], capfd: pytest.CaptureFixture[str]
) -> None:
    ti = FakeTI(run_id="kinds-app")
    with pytest.raises(TorchXAppFailure, match="ended FAILED") as raised:
        operator(sh("exit1", "exit 1")).execute({"ti": ti})  # type: ignore[arg-type]
    local_jobs[1].append(ti.xcoms["app_handle"])
    error = raised.value
    assert (error.kind, error.app_handle, error.why) == (FailureKind.APP, ti.xcoms["app_handle"], "exit code 1 on w/0")
    assert not isinstance(error, AirflowFailException)  # retried as before, without a policy
    assert ti.xcoms["usage"]["failure_kind"] == "app"
    out, err = capfd.readouterr()
    assert "Failure kind: app (exit code 1 on w/0)" in out + err


def test_the_failure_tells_one_story_the_failing_rank_its_code_and_its_own_last_lines(
    local_jobs: tuple[Runner, list[str]], capfd: pytest.CaptureFixture[str]
) -> None:
    """A node whose rank 1 aborted while rank 0 logged a collateral gloo error
    (``tests/fixtures/aborted_node.py``): the message names rank 1 and its signal, then rank
    1's own last lines (faulthandler's module list left out), never rank 0's; the task's log
    ends with the same story as its closing block."""
    node = f"{sys.executable} {aborted_node.__file__} peer-first"
    op = TorchXRunOperator(
        task_id="task", component="utils.sh", component_args=[node], scheduler="local_cwd", deferrable=False
    )
    ti = FakeTI(run_id="kinds-story")
    with pytest.raises(TorchXAppFailure) as raised:
        op.execute({"ti": ti})  # type: ignore[arg-type]
    local_jobs[1].append(ti.xcoms["app_handle"])
    message = str(raised.value)
    head = "Root cause (rank 1, replica sh/0, exit code -6): Signal 6 (SIGABRT) received by PID 1596\n"
    assert message.startswith(head), message
    own = message[message.index("\nLast ") :]
    assert own.startswith("\nLast 5 lines of rank 1's stderr:\nrank 1: corrupt shard, aborting\n"), message
    assert "Connection closed by peer" not in message and "Extension modules" not in message, message
    assert raised.value.why == "SIGABRT on sh/0"
    out, err = capfd.readouterr()
    task_log = (out + err).rstrip()
    block = task_log[task_log.rindex("Failure kind: ") :]
    lines = block.splitlines()
    assert lines[:4] == [
        "Failure kind: app (SIGABRT on sh/0)",
        "  failing: rank 1 of replica sh/0",
        "  signal SIGABRT (exit code -6)",
        "  error: Signal 6 (SIGABRT) received by PID 1596",
    ], block
    assert lines[4] == "  last 5 lines of rank 1's stderr:" and lines[5] == "    rank 1: corrupt shard, aborting", block
    assert len(lines) == 10, block  # the rank's 5 lines close the task's log
    assert "Connection closed by peer" not in block and "Extension modules" not in block, block


@pytest.mark.parametrize(
    ("event", "block"),
    [
        (  # torchrun's root cause, with the rank's own stderr
            {
                "failing": {
                    "replica": "t/1",
                    "rank": 3,
                    "exit_code": -9,
                    "error": "Signal 9 (SIGKILL) received by PID 7",
                },
                "tail": ["step 4", "killed"],
                "tail_of": "rank 3's stderr",
            },
            "Failure kind: infra (SIGKILL on t/1)\n  failing: rank 3 of replica t/1\n  signal SIGKILL (exit code -9)\n"
            "  error: Signal 9 (SIGKILL) received by PID 7\n  last 2 lines of rank 3's stderr:\n    step 4\n    killed",
        ),
        (  # a replica without torchrun: its exit code and its log's last lines
            {"failing": {"replica": "t/0", "rank": None, "exit_code": 2, "error": None}, "tail": ["usage: x"]},
            "Failure kind: infra (SIGKILL on t/1)\n  failing: replica t/0\n  exit code 2\n"
            "  last 1 lines of replica t/0's log:\n    usage: x",
        ),
        (  # nobody known (a vanished job): its code unknown, no lines
            {"failing": {"replica": "t/0", "rank": None, "exit_code": None, "error": None}},
            "Failure kind: infra (SIGKILL on t/1)\n  failing: replica t/0\n  exit code unknown",
        ),
        ({"message": "max_gpu_hours"}, "Failure kind: infra (SIGKILL on t/1)"),
    ],
    ids=["rank", "replica", "unknown-code", "no-failing"],
)
def test_the_closing_block_is_the_rank_its_code_and_its_lines_in_that_order(event: dict[str, Any], block: str) -> None:
    outcome = Outcome.from_event({"status": "failed", "app_handle": "local_cwd://torchx/t-1", **event})
    assert failure_block(Failure(FailureKind.INFRA, "SIGKILL on t/1"), outcome) == block


def test_a_missing_local_dir_image_is_refused_as_config_before_anything_is_submitted(
    local_jobs: tuple[Runner, list[str]], tmp_path: Path
) -> None:
    app = AppDef("noimage", roles=[Role("w", image=str(tmp_path / "missing"), entrypoint="true")])
    ti = FakeTI(run_id="kinds-config")
    op = TorchXRunOperator(task_id="task", app=app, scheduler="local_dir", deferrable=False)
    with pytest.raises(TorchXConfigRefused, match="does not exist or is not a directory") as raised:
        op.execute({"ti": ti})  # type: ignore[arg-type]
    assert isinstance(raised.value, AirflowFailException) and isinstance(raised.value, TorchXConfigFailure)
    assert raised.value.kind == FailureKind.CONFIG and raised.value.app_handle is None
    assert "app_handle" not in ti.xcoms


def cancel_once_running(runner: Runner, ti: FakeTI, by: CancelledBy) -> None:
    handle = wait_until(lambda: ti.xcoms.get("app_handle"), what="the submit")
    wait_until(lambda: (s := runner.status(handle)) and s.state == AppState.RUNNING, what="the job to run")
    runner.cancel(handle, reason="airflow-torchx cancel by alice@box", by=by)


@pytest.mark.parametrize("retry_after", [False, True])
def test_a_cancel_from_outside_is_cancelled_and_never_retried_unless_asked(
    local_jobs: tuple[Runner, list[str]], retry_after: bool
) -> None:
    import threading

    runner, handles = local_jobs
    ti = FakeTI(run_id=f"kinds-cancel-{retry_after}")
    op = operator(sh("cancelled", "sleep 60"), retry_after_outside_cancel=retry_after)
    thread = threading.Thread(target=cancel_once_running, args=(runner, ti, CancelledBy.USER), daemon=True)
    thread.start()
    with pytest.raises(TorchXJobFailed) as raised:
        op.execute({"ti": ti})  # type: ignore[arg-type]
    thread.join(10)
    handles.append(ti.xcoms["app_handle"])
    assert raised.value.kind == FailureKind.CANCELLED
    assert isinstance(raised.value, TorchXCancelled) is not retry_after
    assert isinstance(raised.value, AirflowFailException) is not retry_after


def test_the_tasks_own_timeout_is_timed_out_and_retried(local_jobs: tuple[Runner, list[str]]) -> None:
    ti = FakeTI(run_id="kinds-timeout")
    with pytest.raises(TorchXTimedOut, match="did not end within 1s") as raised:
        operator(sh("slow", "sleep 60"), timeout=timedelta(seconds=1)).execute({"ti": ti})  # type: ignore[arg-type]
    local_jobs[1].append(ti.xcoms["app_handle"])
    assert raised.value.kind == FailureKind.TIMEOUT and not isinstance(raised.value, AirflowFailException)


def test_the_sensor_raises_the_kind_and_a_cancel_stays_retried(local_jobs: tuple[Runner, list[str]]) -> None:
    runner, handles = local_jobs
    failed = runner.run(sh("sensed", "exit 4"), "local_cwd")
    cancelled = runner.run(sh("sensed-cancel", "sleep 60"), "local_cwd")
    handles += [failed, cancelled]
    runner.cancel(cancelled, reason="airflow-torchx cancel by alice@box", by=CancelledBy.USER)
    for handle in (failed, cancelled):
        wait_until(lambda h=handle: (s := runner.status(h)) and s.is_terminal(), what=f"{handle} to end")  # type: ignore[misc]
    sensor = TorchXJobSensor(task_id="watch", app_handle=failed, poke_interval=0.2, deferrable=False)
    ti = FakeTI(run_id="kinds-sensor")
    with pytest.raises(TorchXAppFailure, match="exit code 4"):
        sensor.poke({"ti": ti})  # type: ignore[arg-type]
    assert ti.xcoms["usage"]["failure_kind"] == "app"
    sensor = TorchXJobSensor(task_id="watch2", app_handle=cancelled, poke_interval=0.2, deferrable=False)
    with pytest.raises(TorchXJobFailed) as raised:
        sensor.poke({"ti": FakeTI(run_id="kinds-sensor-2")})  # type: ignore[arg-type]
    assert raised.value.kind == FailureKind.CANCELLED and not isinstance(raised.value, AirflowFailException)


# ------------------------------------------------------------------ torchx_retry_policy, one test per row


def raised(kind: FailureKind, why: str = "ValueError on trainer/0") -> TorchXJobFailed:
    return failure_error("boom", Failure(kind, why), no_retry=False, app_handle="local_cwd://torchx/x")


def decide(exc: BaseException, **kw: Any) -> Any:
    return torchx_retry_policy(**kw).evaluate(exc, try_number=1, max_tries=3)


@needs_policies
def test_the_policy_fails_an_app_failure_at_once_saying_why() -> None:
    decision = decide(raised(FailureKind.APP))
    assert decision.action == RetryAction.FAIL
    assert decision.reason == "not retried: app failure — ValueError on trainer/0"


@needs_policies
def test_the_policy_fails_a_config_failure_at_once() -> None:
    assert decide(raised(FailureKind.CONFIG, "CannotPullContainerError: x on main/0")).action == RetryAction.FAIL


@needs_policies
def test_the_policy_retries_an_infra_failure_after_the_tasks_delay() -> None:
    decision = decide(raised(FailureKind.INFRA, "SIGKILL on w/0"))
    assert (decision.action, decision.retry_delay) == (RetryAction.RETRY, None)
    assert decision.reason == "retried: infra failure — SIGKILL on w/0"


@needs_policies
def test_the_policy_retries_capacity_after_its_own_longer_delay() -> None:
    decision = decide(raised(FailureKind.CAPACITY, "guard start_timeout tripped"), capacity_delay=timedelta(minutes=10))
    assert (decision.action, decision.retry_delay) == (RetryAction.RETRY, timedelta(minutes=10))
    assert isinstance(raised(FailureKind.CAPACITY), TorchXCapacityFailure)


@needs_policies
@pytest.mark.parametrize("kind", [FailureKind.TIMEOUT, FailureKind.CANCELLED, FailureKind.GUARDRAIL])
def test_the_policy_leaves_the_other_kinds_to_airflows_retries(kind: FailureKind) -> None:
    assert decide(raised(kind)).action == RetryAction.DEFAULT


@needs_policies
def test_the_policy_leaves_other_exceptions_to_airflow() -> None:
    assert decide(RuntimeError("not ours")).action == RetryAction.DEFAULT


@needs_policies
def test_a_users_own_rules_come_first() -> None:
    rules = [RetryRule(exception=TorchXAppFailure, action=RetryAction.RETRY, reason="our flaky loader")]
    decision = decide(raised(FailureKind.APP), rules=rules)
    assert (decision.action, decision.reason) == (RetryAction.RETRY, "our flaky loader")
    assert decide(raised(FailureKind.CONFIG), rules=rules).action == RetryAction.FAIL  # theirs did not match


@needs_policies
def test_a_fallback_decides_what_the_policy_leaves() -> None:
    fallback = ExceptionRetryPolicy(rules=[RetryRule(exception=RuntimeError, action=RetryAction.FAIL)])
    assert decide(RuntimeError("not ours"), fallback=fallback).action == RetryAction.FAIL
    assert decide(raised(FailureKind.TIMEOUT), fallback=fallback).action == RetryAction.DEFAULT
    assert decide(raised(FailureKind.INFRA), fallback=fallback).action == RetryAction.RETRY


@needs_policies
def test_each_kinds_class_matches_airflows_own_exception_policy() -> None:
    policy = ExceptionRetryPolicy(rules=[RetryRule(exception=TorchXInfraFailure, action=RetryAction.RETRY)])
    assert policy.evaluate(raised(FailureKind.INFRA), 1, 3).action == RetryAction.RETRY
    assert policy.evaluate(raised(FailureKind.APP), 1, 3).action == RetryAction.DEFAULT


def test_before_airflow_3_3_the_policy_names_the_version(monkeypatch: pytest.MonkeyPatch) -> None:
    import airflow

    monkeypatch.setitem(sys.modules, "airflow.sdk.definitions.retry_policy", None)  # as on 3.1/3.2
    monkeypatch.setattr(airflow, "__version__", "3.2.1")
    with pytest.raises(RuntimeError, match=r"needs Airflow >= 3.3 .*this is Airflow 3\.2\.1"):
        torchx_retry_policy()
    assert raised(FailureKind.APP).kind == FailureKind.APP  # the classes work on any version


def test_a_failure_survives_pickling_with_its_kind() -> None:
    import pickle

    error = pickle.loads(pickle.dumps(raised(FailureKind.INFRA, "SIGKILL on w/0")))
    assert type(error) is TorchXInfraFailure and (error.kind, error.why) == (FailureKind.INFRA, "SIGKILL on w/0")


# ------------------------------------------------------------------ dag.test() with the policy


DAG_ID = "torchx_test_retry_policy"


@needs_policies
def test_dag_test_with_the_policy_fails_an_app_error_once_and_retries_a_killed_replica(
    airflow_env: AirflowEnv, tmp_path: Path
) -> None:
    env = {**os.environ, "TORCHX_TEST_MARKERS": str(tmp_path)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.airflow.run_dag_subprocess",
            "torchx_retry_policy_dags.py",
            "torchx_test_retry_policy",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = proc.stdout + proc.stderr
    line = next((x[x.index("RESULT ") :] for x in proc.stdout.splitlines() if "RESULT " in x), None)
    assert line is not None, output[-4000:]
    result = json.loads(line[len("RESULT ") :])
    assert (result["app_error"]["state"], result["app_error"]["try_number"]) == ("failed", 1), result
    assert "not retried: app failure — exit code 1 on w/0" in output, output[-4000:]
    assert (result["killed_once"]["state"], result["killed_once"]["try_number"]) == ("success", 2), result
    assert "retried: infra failure — SIGKILL on w/0" in output, output[-4000:]
    assert (tmp_path / "killed-once").exists()
