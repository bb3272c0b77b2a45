"""The capacity ladder's rules (``ladder.py``): one test per row of its decision table, the
validation of the rungs and of their shared checkpoint location, the failure count, the record."""

from __future__ import annotations

import pytest

from airflow_provider_torchx.core.errors import InvalidRunConfigError
from airflow_provider_torchx.core.failures import FailureKind
from airflow_provider_torchx.core.specs import AppDef, BindMount, Role
from airflow_provider_torchx.ladder import (
    Move,
    Outcome,
    Rung,
    Step,
    Why,
    cancel_reason,
    check_checkpoints,
    conn_ids,
    decide,
    ended,
    handover_line,
    infra_failures,
    max_infra_failures,
    move_line,
    retry_rung,
    rung_start_timeout,
)

BOX = Rung("box", "local_cwd", start_timeout=60)
SLURM = Rung("slurm", "slurm", max_infra_failures=2)  # its jobs see this host's (shared) paths
SPOT = Rung("spot", "aws_batch", host_paths=False, max_infra_failures=3)
LADDER = [BOX, SLURM, SPOT]


def failed(kind: FailureKind, failures: int = 0) -> Outcome:
    return Outcome("failed", kind=kind, failures=failures)


START_TRIP = Outcome("guardrail", guard="start_timeout", kind=FailureKind.CAPACITY)

# ---------------------------------------------------------------------- the table, row by row


@pytest.mark.parametrize("outcome", [START_TRIP, failed(FailureKind.INFRA, 9)], ids=["start_timeout", "infra"])
def test_the_last_rung_stays_whatever_the_outcome(outcome: Outcome) -> None:
    assert decide(LADDER, 2, outcome) is None
    assert decide([BOX], 0, outcome) is None  # a single connection: no ladder


@pytest.mark.parametrize("status", ["success", "timeout"])
def test_a_job_that_succeeded_or_outlived_the_tasks_wait_stays(status: str) -> None:
    assert decide(LADDER, 0, Outcome(status)) is None


def test_a_job_that_left_pending_for_a_task_that_does_not_wait_stays() -> None:
    """Outcome ``started``: its task returns the handle; nothing moves the job after that, not
    even the failures its rung's ``max_infra_failures`` would count."""
    assert decide(LADDER, 0, Outcome("started")) is None
    assert decide(LADDER, 1, Outcome("started", kind=FailureKind.INFRA, failures=9)) is None


def test_a_start_timeout_moves_to_the_next_rung() -> None:
    move = decide(LADDER, 0, START_TRIP)
    assert move == Move(0, 1, Why.START_TIMEOUT, "it did not start within start_timeout=60s")


@pytest.mark.parametrize("guard", ["max_gpu_hours", "max_cost"])
def test_another_guard_stays(guard: str) -> None:
    assert decide(LADDER, 0, Outcome("guardrail", guard=guard, kind=FailureKind.GUARDRAIL)) is None


@pytest.mark.parametrize("kind", [FailureKind.APP, FailureKind.CONFIG])
def test_an_app_or_config_failure_stays_however_often(kind: FailureKind) -> None:
    assert decide(LADDER, 1, failed(kind, 99)) is None


def test_an_outside_cancel_stays() -> None:
    assert decide(LADDER, 1, failed(FailureKind.CANCELLED, 99)) is None


@pytest.mark.parametrize("kind", [FailureKind.INFRA, FailureKind.CAPACITY])
def test_infra_failures_on_a_rung_without_a_limit_stay(kind: FailureKind) -> None:
    assert decide(LADDER, 0, failed(kind, 99)) is None  # BOX sets no max_infra_failures


def test_fewer_infra_failures_than_the_rungs_limit_stay() -> None:
    assert decide(LADDER, 1, failed(FailureKind.INFRA, 1)) is None


@pytest.mark.parametrize("kind", [FailureKind.INFRA, FailureKind.CAPACITY])
def test_reaching_the_rungs_limit_of_infra_failures_moves(kind: FailureKind) -> None:
    move = decide(LADDER, 1, failed(kind, 2))
    assert move == Move(1, 2, Why.INFRA_FAILURES, "2 capacity/infra failures there (max_infra_failures=2)")


# ---------------------------------------------------------------------- the rungs


def test_one_connection_id_is_a_ladder_of_one_rung_and_a_list_keeps_its_order() -> None:
    assert conn_ids("torchx_default") == ("torchx_default",)
    assert conn_ids(["box", "slurm", "spot"]) == ("box", "slurm", "spot")


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ([], r"^torchx_conn_id: an empty list is not allowed: give one or more torchx connection ids$"),
        (
            ["box", "slurm", "box"],
            r"^torchx_conn_id\[2\]: 'box' is given twice; each rung .*got \['box', 'slurm', 'box'\]",
        ),
        (["box", ""], r"^torchx_conn_id\[1\]: '' is not allowed: each rung is a torchx connection id"),
        (["box", 3], r"^torchx_conn_id\[1\]: 3 is not allowed"),
        (7, r"^torchx_conn_id: 7 is not allowed: give a torchx connection id, or a list of them"),
    ],
)
def test_a_bad_ladder_is_refused_naming_the_field_and_value(value: object, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        conn_ids(value)


def test_a_task_that_does_not_wait_says_where_its_job_is_and_that_the_ladder_moves_it_no_more() -> None:
    handle = "slurm://torchx/train-1"
    assert handover_line(LADDER, 1, handle, "RUNNING") == (
        f"Ladder: job {handle} left PENDING (RUNNING) on rung 2 'slurm' (slurm); returning its handle "
        "(wait_for_completion=False): the ladder no longer moves it (max_infra_failures needs a task that "
        "waits for completion)"
    )
    assert handover_line(LADDER, 2, "aws_batch://torchx/train-2", None) == (
        "Ladder: job aws_batch://torchx/train-2 is on the last rung 3 'spot' (aws_batch); returning its handle "
        "at once (wait_for_completion=False): its limits act as without a ladder"
    )


def test_max_infra_failures_is_a_whole_number_from_one() -> None:
    assert max_infra_failures(None, "c") is None and max_infra_failures("", "c") is None
    assert max_infra_failures(2, "c") == 2 and max_infra_failures("3", "c") == 3
    for bad in (0, -1, "x", 1.5, True):
        with pytest.raises(InvalidRunConfigError, match=rf"^connection 'c' extra max_infra_failures: {bad!r} is not"):
            max_infra_failures(bad, "c")


def test_a_rungs_start_timeout_is_its_connections_else_the_tasks() -> None:
    assert rung_start_timeout(30, 600) == 30
    assert rung_start_timeout(None, 600) == 600
    assert rung_start_timeout(None, None) is None


# ---------------------------------------------------------------------- the shared checkpoint location


def app(*mounts: str) -> AppDef:
    return AppDef("a", [Role("r", image="i", entrypoint="e", mounts=[BindMount(m, m) for m in mounts])])


def test_rungs_that_share_a_path_root_pass_when_every_remote_rung_mounts_it() -> None:
    rungs = [Rung("box", "local_cwd", checkpoint_root="/shared"), Rung("spot", "aws_batch", False, "/shared")]
    check_checkpoints(rungs, "/shared/d/r/t", app("/shared"))


def test_a_rung_that_sees_this_host_s_paths_shares_a_path_root_without_a_mount() -> None:
    rungs = [Rung("box", "local_cwd", checkpoint_root="/shared"), Rung("slurm", "slurm", True, "/shared")]
    check_checkpoints(rungs, "/shared/d/r/t", app())


def test_rungs_that_share_an_s3_root_pass() -> None:
    rungs = [Rung("box", "local_cwd", checkpoint_root="s3://b/c"), Rung("spot", "aws_batch", False, "s3://b/c")]
    check_checkpoints(rungs, "s3://b/c/d/r/t", app())


def test_a_rung_with_another_root_is_named() -> None:
    rungs = [Rung("box", "local_cwd", checkpoint_root="/a"), Rung("spot", "aws_batch", False, "s3://b")]
    with pytest.raises(
        InvalidRunConfigError,
        match=r"^torchx_conn_id\[1\]: rung 'spot' \(aws_batch\) checkpoints under 's3://b', "
        r"rung 'box' \(local_cwd\) under '/a'",
    ):
        check_checkpoints(rungs, "/a/d/r/t", app())


def test_a_rung_with_no_root_beside_one_with_a_root_is_named() -> None:
    rungs = [Rung("box", "local_cwd", checkpoint_root="/a"), Rung("spot", "aws_batch", False, None)]
    with pytest.raises(
        InvalidRunConfigError, match=r"^torchx_conn_id\[1\]: rung 'spot' \(aws_batch\) checkpoints under None"
    ):
        check_checkpoints(rungs, "/a/d/r/t", app())


def test_a_remote_rung_that_cannot_reach_a_path_root_is_named() -> None:
    rungs = [Rung("box", "local_cwd", checkpoint_root="/a"), Rung("spot", "aws_batch", False, "/a")]
    with pytest.raises(
        InvalidRunConfigError,
        match=r"^torchx_conn_id\[1\]: rung 'spot' \(aws_batch\) cannot reach it: .*'/a/d/r/t' is a local path",
    ):
        check_checkpoints(rungs, "/a/d/r/t", app())


def test_no_root_anywhere_passes_and_a_single_rung_is_not_checked() -> None:
    check_checkpoints([Rung("box", "local_cwd"), Rung("spot", "aws_batch", False)], None, app())
    check_checkpoints([Rung("spot", "aws_batch", False, "/a")], "/a/x", app())


# ---------------------------------------------------------------------- counting, words, the record


def test_each_attempt_lost_to_the_platform_counts_and_the_job_at_least_once() -> None:
    reasons = [
        "Host EC2 (instance i-1) terminated.",
        "Host EC2 (instance i-2) terminated.",
        "Essential container exited",
    ]
    assert infra_failures(FailureKind.INFRA, reasons) == 2
    assert infra_failures(FailureKind.CAPACITY, ["CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY"]) == 1
    assert infra_failures(FailureKind.INFRA, []) == 1  # the job itself
    assert infra_failures(FailureKind.APP, reasons) == 0  # its end was its own code's


def test_the_cancel_reason_and_the_log_line_name_both_rungs_and_why() -> None:
    move = Move(0, 1, Why.START_TIMEOUT, "it did not start within start_timeout=60s")
    assert cancel_reason(SLURM, move) == "moved to slurm: it did not start within start_timeout=60s"
    assert move_line(LADDER, move, "local_cwd://s/a") == (
        "Ladder: leaving rung 1 'box' (local_cwd), job local_cwd://s/a: it did not start within start_timeout=60s; "
        "moving to rung 2 'slurm' (slurm)"
    )


def test_a_step_round_trips_through_its_xcom_form_and_ends_with_the_event() -> None:
    step = Step("box", "local_cwd://s/a", submitted_at=1.0)
    assert step.to_dict() == {
        "conn_id": "box",
        "app_handle": "local_cwd://s/a",
        "outcome": "running",
        "reason": None,
        "submitted_at": 1.0,
    }
    assert Step.from_dict(step.to_dict()) == step
    moved = Step("box", "local_cwd://s/a", "moved", "start_timeout")
    (first, last) = ended([moved, step], "success", None)
    assert first == moved and last.outcome == "succeeded" and last.submitted_at == 1.0
    assert ended([], "failed", "x") == []


def test_a_start_timeout_moves_from_every_rung_but_the_last() -> None:
    from airflow_provider_torchx.ladder import start_timeout_move

    assert start_timeout_move(LADDER, 1) == Move(
        1, 2, Why.START_TIMEOUT, "it did not start within start_timeout=its limit"
    )
    assert start_timeout_move(LADDER, 2) is None


def test_the_rungs_usage_is_summed_over_the_jobs_that_know_it() -> None:
    from airflow_provider_torchx.ladder import ladder_line, summed

    left = {"node_seconds": 0.0, "gpu_hours": 0.0, "cost_usd": None, "attempts_count": 1}
    last = {"node_seconds": 7200.0, "gpu_hours": 4.0, "cost_usd": 10.0, "attempts_count": 2, "vcpu_hours": 2.0}
    totals = summed([left, None, last])
    assert totals == {
        "jobs": 3,
        "known": 2,
        "node_seconds": 7200.0,
        "vcpu_hours": 2.0,
        "gpu_hours": 4.0,
        "memory_gb_hours": None,
        "attempts_count": 3,
        "cost_usd": 10.0,
    }
    assert ladder_line(totals) == "Ladder (3 jobs, every rung tried): 4.0000 GPU-h, $10.00, 1 job(s) unread"
    assert ladder_line(summed([left])) == "Ladder (1 jobs, every rung tried): 0.0000 GPU-h"


def test_a_retry_goes_on_to_the_rung_a_cut_short_move_was_going_to() -> None:
    """The newest job cancelled for a move to the next rung (nothing submitted there): the
    retry starts there; any other cancel, or none, keeps the newest job's rung."""
    rungs = [BOX, SLURM, SPOT]
    move = Move(0, 1, Why.START_TIMEOUT, "it did not start within start_timeout=60s")
    assert retry_rung(rungs, 0, cancel_reason(SLURM, move)) == 1
    assert retry_rung(rungs, 1, cancel_reason(SPOT, Move(1, 2, Why.START_TIMEOUT, "x"))) == 2
    assert retry_rung(rungs, 0, None) == 0
    assert retry_rung(rungs, 0, "cancelled by the task") == 0
    assert retry_rung(rungs, 0, cancel_reason(SPOT, move)) == 0, "a move to another rung than the next"
    assert retry_rung(rungs, 2, "moved to box: x") == 2, "the last rung"
