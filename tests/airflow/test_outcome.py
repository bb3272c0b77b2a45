"""The watch's end as one typed value (``outcome.py``): each kind of end writes exactly the
payload every earlier version's trigger wrote (a task deferred before an upgrade resumes after
it), reads back equal, and a malformed payload is refused naming its field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_provider_torchx.core.failures import Failure, FailureKind
from airflow_provider_torchx.core.guards import Trip
from airflow_provider_torchx.core.schedulers.api import DescribeAppResponse
from airflow_provider_torchx.core.specs import AppState
from airflow_provider_torchx.outcome import End, Failing, Outcome

H = "local_cwd://torchx/train-7"
AT = {"log_cursors": {"w/0": "c0", "w/1": "c1"}, "cursor_seq": 4}
START_TRIP = Trip("start_timeout", 60.0, AppState.PENDING, 61.5, reason="waiting for 4 GPUs")
GPU_TRIP = Trip("max_gpu_hours", 2.0, AppState.RUNNING, 3600.0, gpu_hours=2.1)

CASES: list[tuple[str, Outcome, dict[str, Any]]] = [
    (
        "success",
        Outcome(End.SUCCESS, H, 4, {"w/0": "c0", "w/1": "c1"}, state=AppState.SUCCEEDED, ui_url="file:///j"),
        {"status": "success", "app_handle": H, **AT, "state": "SUCCEEDED", "ui_url": "file:///j"},
    ),
    (
        "failed",
        Outcome(
            End.FAILED,
            H,
            4,
            {"w/0": "c0", "w/1": "c1"},
            state=AppState.FAILED,
            message=f"TorchX job {H} ended FAILED: w/1 exited 1",
            tail=("step 4", "boom"),
            tail_of="rank 3's stderr",
            root_cause="rank 3 (w/1) failed: ValueError: boom",
            failing=Failing("w/1", 3, 1, "ValueError: boom"),
            failure=Failure(FailureKind.APP, "ValueError on w/1"),
        ),
        {
            "status": "failed",
            "app_handle": H,
            **AT,
            "state": "FAILED",
            "message": f"TorchX job {H} ended FAILED: w/1 exited 1",
            "tail": ["step 4", "boom"],
            "tail_of": "rank 3's stderr",
            "ui_url": None,
            "root_cause": "rank 3 (w/1) failed: ValueError: boom",
            "failing": {"replica": "w/1", "rank": 3, "exit_code": 1, "error": "ValueError: boom"},
            "failure_kind": "app",
            "failure_why": "ValueError on w/1",
        },
    ),
    (
        "failed-unknown",  # nobody known to have failed, no kind decided, not streaming
        Outcome(End.FAILED, H, 0, None, state=AppState.CANCELLED, message="cancelled"),
        {
            "status": "failed",
            "app_handle": H,
            "log_cursors": None,
            "cursor_seq": 0,
            "state": "CANCELLED",
            "message": "cancelled",
            "tail": [],
            "tail_of": None,
            "ui_url": None,
            "root_cause": None,
            "failing": None,
            "failure_kind": None,
            "failure_why": None,
        },
    ),
    (
        "timeout",
        Outcome(End.TIMEOUT, H, 4, {"w/0": "c0", "w/1": "c1"}, state=AppState.RUNNING, message="still RUNNING"),
        {"status": "timeout", "app_handle": H, **AT, "state": "RUNNING", "message": "still RUNNING"},
    ),
    (
        "guardrail-start-timeout",  # the trip a capacity ladder moves the job on
        Outcome(End.GUARDRAIL, H, 4, {"w/0": "c0"}, state=AppState.PENDING, message="did not start", trip=START_TRIP),
        {
            "status": "guardrail",
            "app_handle": H,
            "log_cursors": {"w/0": "c0"},
            "cursor_seq": 4,
            "message": "did not start",
            "guard": "start_timeout",
            "limit": 60.0,
            "state": "PENDING",
            "for_s": 61.5,
            "reason": "waiting for 4 GPUs",
            "gpu_hours": None,
            "cost_usd": None,
        },
    ),
    (
        "guardrail-budget",
        Outcome(End.GUARDRAIL, H, 4, {}, state=AppState.RUNNING, message="over budget", trip=GPU_TRIP),
        {
            "status": "guardrail",
            "app_handle": H,
            "log_cursors": {},
            "cursor_seq": 4,
            "message": "over budget",
            "guard": "max_gpu_hours",
            "limit": 2.0,
            "state": "RUNNING",
            "for_s": 3600.0,
            "reason": "",
            "gpu_hours": 2.1,
            "cost_usd": None,
        },
    ),
    (
        "cancelled-by-reaper",  # a failed end of a job the reaper cancelled (the trigger's last word)
        Outcome(
            End.FAILED,
            H,
            2,
            {},
            state=AppState.CANCELLED,
            message=f"TorchX job {H} ended CANCELLED: cancelled by request: task t of run r was marked failed",
            failure=Failure(FailureKind.CANCELLED, "cancelled by the reaper"),
        ),
        {
            "status": "failed",
            "app_handle": H,
            "log_cursors": {},
            "cursor_seq": 2,
            "state": "CANCELLED",
            "message": f"TorchX job {H} ended CANCELLED: cancelled by request: task t of run r was marked failed",
            "tail": [],
            "tail_of": None,
            "ui_url": None,
            "root_cause": None,
            "failing": None,
            "failure_kind": "cancelled",
            "failure_why": "cancelled by the reaper",
        },
    ),
    (
        "refused-record",
        Outcome(End.ERROR, H, 4, {"w/0": "c0", "w/1": "c1"}, message="cannot be watched", refused=True),
        {"status": "error", "app_handle": H, **AT, "message": "cannot be watched", "refused": True},
    ),
    (
        "error-vanished",
        Outcome(End.ERROR, H, 0, {}, message=f"no such job {H}: the scheduler does not know it"),
        {
            "status": "error",
            "app_handle": H,
            "log_cursors": {},
            "cursor_seq": 0,
            "message": f"no such job {H}: the scheduler does not know it",
        },
    ),
    (
        "error-wrong-host",  # the trigger never watched: no position at all
        Outcome(End.ERROR, H, message="runs on host 'a' but this triggerer runs on 'b'"),
        {"status": "error", "app_handle": H, "message": "runs on host 'a' but this triggerer runs on 'b'"},
    ),
    (
        "started",  # a watch until the job left PENDING (a ladder's task that does not wait)
        Outcome(End.STARTED, H, 4, {"w/0": "c0", "w/1": "c1"}, state=AppState.RUNNING, message=f"{H} left PENDING"),
        {"status": "started", "app_handle": H, **AT, "state": "RUNNING", "message": f"{H} left PENDING"},
    ),
]


@pytest.mark.parametrize(("outcome", "event"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_end_writes_the_payload_of_every_version_and_reads_back_equal(
    outcome: Outcome, event: dict[str, Any]
) -> None:
    assert outcome.to_event() == event
    assert json.loads(json.dumps(outcome.to_event())) == event  # what a TriggerEvent carries
    assert Outcome.from_event(outcome.to_event()) == outcome
    assert Outcome.from_event(event) == outcome


def test_an_earlier_versions_failed_payload_without_a_kind_is_classified_from_the_job() -> None:
    """A failed payload of a trigger from before failure kinds: read, its kind decided from the
        job as the scheduler describes it now, else from the payload's state and message (``infra``
    with the message, when nothing says who failed)."""
    outcome = Outcome.from_event({"status": "failed", "app_handle": H, "state": "FAILED", "message": "x"})
    assert outcome.failure is None and outcome.position.seq == 0 and outcome.log_cursors is None
    assert outcome.reported_failure(None) == Failure(FailureKind.INFRA, "x")  # nothing known of who failed
    cancelled = DescribeAppResponse(state=AppState.CANCELLED, msg="cancelled by request")
    assert outcome.reported_failure(cancelled).kind is FailureKind.CANCELLED


def test_a_decided_kind_wins_and_an_error_is_infra() -> None:
    _, failed, _ = CASES[1]
    assert failed.reported_failure(DescribeAppResponse(state=AppState.CANCELLED)) == failed.failure
    _, refused, _ = CASES[7]
    assert refused.reported_failure(None) == Failure(FailureKind.INFRA, "cannot be watched")
    _, trip, _ = CASES[4]
    assert trip.reported_failure(None).kind is FailureKind.CAPACITY


def test_the_failure_message_is_the_root_cause_the_reason_then_the_tail() -> None:
    _, failed, _ = CASES[1]
    assert failed.failure_message() == (
        f"rank 3 (w/1) failed: ValueError: boom\nTorchX job {H} ended FAILED: w/1 exited 1\n"
        "Last 2 lines of rank 3's stderr:\nstep 4\nboom"
    )


@pytest.mark.parametrize(
    ("event", "field", "allowed"),
    [
        ({"app_handle": H}, "'status'", "expected one of 'success', 'failed', 'timeout', 'guardrail', 'error'"),
        ({"status": "done", "app_handle": H}, "'status'", "'done' is not allowed: expected one of 'success'"),
        ({"status": "success"}, "'app_handle'", "missing, expected a string"),
        ({"status": "success", "app_handle": 7}, "'app_handle'", "7 is not allowed: expected a string"),
        ({"status": "success", "app_handle": H, "cursor_seq": "4"}, "'cursor_seq'", "expected an integer"),
        ({"status": "success", "app_handle": H, "log_cursors": ["c0"]}, "'log_cursors'", "expected a dict"),
        ({"status": "success", "app_handle": H, "state": "DONE"}, "'state'", "expected one of UNSUBMITTED"),
        ({"status": "failed", "app_handle": H, "tail": "boom"}, "'tail'", "expected a list of strings"),
        ({"status": "failed", "app_handle": H, "failure_kind": "odd"}, "'failure_kind'", "expected one of 'app'"),
        (
            {"status": "failed", "app_handle": H, "failing": {"rank": 1}},
            "'failing': a TorchX job event's 'replica'",
            "",
        ),
        ({"status": "error", "app_handle": H, "refused": "yes"}, "'refused'", "expected true or false"),
        ({"status": "guardrail", "app_handle": H, "message": "m"}, "'guard'", "missing, expected a string"),
        (
            {"status": "guardrail", "app_handle": H, "guard": "max_cost", "limit": "5", "state": "RUNNING", "for_s": 1},
            "'limit'",
            "expected a number",
        ),
        ("not a dict", "event", "expected a dict"),
    ],
)
def test_a_malformed_payload_is_refused_naming_its_field(event: Any, field: str, allowed: str) -> None:
    with pytest.raises(ValueError, match="TorchX job event") as refused:
        Outcome.from_event(event)
    assert field in str(refused.value) and allowed in str(refused.value), refused.value


def test_a_guardrail_outcome_carries_its_trip_and_only_it_does() -> None:
    with pytest.raises(ValueError, match="trip: None is not allowed for end 'guardrail'"):
        Outcome(End.GUARDRAIL, H, message="m")
    with pytest.raises(ValueError, match="is not allowed for end 'failed'"):
        Outcome(End.FAILED, H, trip=GPU_TRIP)
