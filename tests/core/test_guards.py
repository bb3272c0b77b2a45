"""The guardrails' rule (``core/guards.py``: ``Guards.check``) without I/O, row by row, on a
fake clock; how the watching rules act on a trip (``WatchRules``); the live GPU-hours count
(``Usage.gpu_hours_at``) and the limits' checks; what a scheduler holding the guards gets (a
trip's record, the GPU budget as a time limit, the run options handed over)."""

from __future__ import annotations

import dataclasses
import json
import logging
from datetime import timedelta
from typing import Any, cast

import pytest

from airflow_provider_torchx.core.guards import (
    MAX_COST,
    MAX_GPU_HOURS,
    START_TIMEOUT,
    Guards,
    Trip,
    add_guard_option,
    budget_seconds,
    guard_cfg,
    has_started,
    positive_limit,
    smaller,
)
from airflow_provider_torchx.core.logstream import (
    JobWatch,
    LogBatch,
    LogLine,
    Look,
    Pause,
    Tripped,
    WatchRules,
    WatchState,
)
from airflow_provider_torchx.core.rates import Rates
from airflow_provider_torchx.core.runopts import runopts
from airflow_provider_torchx.core.specs import AppState, AppStatus, ReplicaStatus, Resource, Role, RoleStatus
from airflow_provider_torchx.core.usage import Attempt, Usage, compute_usage

SUBMITTED = 1000.0
TRAINER = Role("trainer", image="x", num_replicas=2, resource=Resource(cpu=4, gpu=2, memMB=1024))
CPU_ONLY = Role("ps", image="x", num_replicas=1, resource=Resource(cpu=1, gpu=-1, memMB=1024))


def usage(*attempts: Attempt, submitted: float | None = SUBMITTED, roles: tuple[Role, ...] = (TRAINER,)) -> Usage:
    return compute_usage(submitted, None, list(roles), list(attempts))


def run(replica: int, started: float | None, ended: float | None = None, role: str = "trainer") -> Attempt:
    return Attempt(role=role, replica=replica, number=1, started=started, ended=ended)


def status(state: AppState, so_far: Usage | None, msg: str = "", replica: AppState | None = None) -> AppStatus:
    rep = ReplicaStatus(0, replica or state, "trainer")
    return AppStatus(state, msg=msg, roles=[RoleStatus("trainer", [rep])], usage_so_far=so_far)


QUEUED = status(AppState.PENDING, usage(), msg="waiting for 2 GPUs, 0 free, held by local_cwd://t/other")


# ---------------------------------------------------------------------- start_timeout


def test_start_timeout_trips_only_once_the_submission_is_older_than_the_limit() -> None:
    guards = Guards(start_timeout=60)
    assert guards.check(QUEUED, SUBMITTED + 59) is None
    assert guards.check(QUEUED, SUBMITTED + 60) is None  # "within it": the limit itself is not over
    trip = guards.check(QUEUED, SUBMITTED + 61)
    assert trip == Trip(START_TIMEOUT, 60, AppState.PENDING, 61, QUEUED.msg)


def test_start_timeout_counts_from_the_schedulers_submission_not_the_watchers_start() -> None:
    # a reattached try began at SUBMITTED + 500: the job's own submission time decides
    assert Guards(start_timeout=60, since=SUBMITTED + 500).check(QUEUED, SUBMITTED + 61) is not None


def test_start_timeout_counts_from_since_where_the_scheduler_does_not_date_the_submission() -> None:
    undated = status(AppState.PENDING, None)
    guards = Guards(start_timeout=60, since=SUBMITTED)
    assert guards.check(undated, SUBMITTED + 59) is None
    assert guards.check(undated, SUBMITTED + 61) is not None
    assert Guards(start_timeout=60).check(undated, SUBMITTED + 1e6) is None  # no date at all: nothing to count


@pytest.mark.parametrize(
    "started",
    [
        pytest.param(status(AppState.RUNNING, usage(run(0, SUBMITTED + 5))), id="job-running"),
        pytest.param(status(AppState.PENDING, usage(), replica=AppState.RUNNING), id="a-replica-running"),
        pytest.param(status(AppState.PENDING, usage(run(0, SUBMITTED + 5, SUBMITTED + 9))), id="ran-then-requeued"),
    ],
)
def test_start_timeout_never_trips_for_a_job_that_has_run(started: AppStatus) -> None:
    assert has_started(started)
    assert Guards(start_timeout=60).check(started, SUBMITTED + 3600) is None


@pytest.mark.parametrize("state", [AppState.SUCCEEDED, AppState.FAILED, AppState.CANCELLED])
def test_an_ended_or_vanished_job_trips_nothing(state: AppState) -> None:
    guards = Guards(start_timeout=1, max_gpu_hours=1e-9)
    assert guards.check(status(state, usage()), SUBMITTED + 1e6) is None
    assert guards.check(None, SUBMITTED + 1e6) is None


def test_no_guard_set_trips_nothing() -> None:
    assert not Guards().armed
    assert Guards().check(QUEUED, SUBMITTED + 1e9) is None


# ---------------------------------------------------------------------- max_gpu_hours


def test_max_gpu_hours_counts_open_attempts_up_to_now_and_trips_once_over_the_budget() -> None:
    # two replicas of 2 GPUs each, running since SUBMITTED + 10: 4 GPU-seconds per second
    live = status(AppState.RUNNING, usage(run(0, SUBMITTED + 10), run(1, SUBMITTED + 10)))
    budget = 4 * 90 / 3600  # 90 s of both replicas
    guards = Guards(max_gpu_hours=budget)
    assert guards.check(live, SUBMITTED + 100) is None  # exactly at the budget
    trip = guards.check(live, SUBMITTED + 101)
    assert trip is not None and trip.guard == MAX_GPU_HOURS and trip.limit == budget
    assert trip.gpu_hours == pytest.approx(4 * 91 / 3600) and trip.for_s == pytest.approx(91)


def test_max_gpu_hours_counts_every_attempt_as_the_usage_summary_does() -> None:
    # the first attempt ran 60 s and ended; the retry runs since SUBMITTED + 100
    so_far = usage(run(0, SUBMITTED, SUBMITTED + 60), dataclasses.replace(run(0, SUBMITTED + 100), number=2))
    assert so_far.gpu_hours_at(SUBMITTED + 130) == pytest.approx(2 * (60 + 30) / 3600)
    ended = compute_usage(SUBMITTED, SUBMITTED + 130, [TRAINER], so_far.attempts)
    assert ended.gpu_hours == pytest.approx(so_far.gpu_hours_at(SUBMITTED + 130))  # the summary's own figure


def test_max_gpu_hours_never_trips_for_a_job_without_gpus() -> None:
    cpu = status(AppState.RUNNING, usage(run(0, SUBMITTED, role="ps"), roles=(CPU_ONLY,)))
    assert cpu.usage_so_far is not None and cpu.usage_so_far.gpu_hours_at(SUBMITTED + 1e6) is None
    assert Guards(max_gpu_hours=1e-9).check(cpu, SUBMITTED + 1e6) is None


def test_a_queued_job_uses_no_gpu_hours() -> None:
    assert Guards(max_gpu_hours=1e-9).check(QUEUED, SUBMITTED + 1e6) is None


# ---------------------------------------------------------------------- the message


def test_the_message_names_the_guard_its_value_the_state_how_long_and_why() -> None:
    trip = Trip(START_TIMEOUT, 30, AppState.PENDING, 31, "waiting for 2 GPUs, 0 free, held by local_cwd://t/a")
    text = trip.message("local_cwd://t/b", why="queue 'q' ENABLED/VALID")
    assert text.startswith("start_timeout=30s: TorchX job local_cwd://t/b did not start within 30s")
    assert "still PENDING after 31s" in text and "held by local_cwd://t/a" in text and "queue 'q'" in text
    budget = Trip(MAX_GPU_HOURS, 0.5, AppState.RUNNING, 600, gpu_hours=0.51).message("h")
    assert "max_gpu_hours=0.5" in budget and "used 0.5100 GPU-hours, over its budget of 0.5" in budget
    assert "running for 10.0 min" in budget


# ---------------------------------------------------------------------- in the watching rules


def _round(rules: WatchRules, st: AppStatus, now: float, lines: int = 0, settle: float = 0.0) -> WatchState:
    batch = LogBatch([LogLine("trainer", 0, "x\n")] * lines, {"trainer/0": str(lines)}, False)
    return WatchState().looked_at(st, now).read(batch).logged(now, settle)


def test_the_rules_end_a_round_with_the_trip_instead_of_the_next_look() -> None:
    rules = WatchRules(poll=10, guards=Guards(start_timeout=60))
    assert rules.next_action(_round(rules, QUEUED, 0.0), 0.0, SUBMITTED + 59) == Look(10, None)
    action = rules.next_action(_round(rules, QUEUED, 0.0), 0.0, SUBMITTED + 61)
    assert isinstance(action, Tripped) and action.trip.guard == START_TIMEOUT


def test_the_trigger_trips_only_once_its_last_lines_settled() -> None:
    rules = WatchRules(poll=10, log_the_end=False, settle=2.0, guards=Guards(start_timeout=60))
    state = _round(rules, QUEUED, 0.0, lines=3, settle=2.0)
    assert rules.next_action(state, 0.5, SUBMITTED + 61) == Pause(1.5)
    assert isinstance(rules.next_action(state, 2.0, SUBMITTED + 63), Tripped)


# ---------------------------------------------------------------------- limits


@pytest.mark.parametrize(
    ("value", "seconds", "expected"),
    [(None, True, None), (30, True, 30.0), (timedelta(minutes=2), True, 120.0), (0.25, False, 0.25), ("7", False, 7.0)],
)
def test_a_limit_takes_a_positive_number(value: Any, seconds: bool, expected: float | None) -> None:
    assert positive_limit("x", value, seconds=seconds) == expected


@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf"), True, "soon", timedelta(0), [1]])
def test_a_limit_refuses_anything_else_naming_the_field_and_the_value(value: Any) -> None:
    with pytest.raises(ValueError, match=r"start_timeout: .* is not allowed: expected a number of seconds"):
        positive_limit("start_timeout", value, seconds=True)


def test_the_smaller_limit_wins() -> None:
    assert smaller(None, None) is None and smaller(2.0, None) == 2.0 and smaller(3.0, 1.5) == 1.5


def test_max_cost_trips_when_the_cost_so_far_at_the_rates_goes_over_the_budget() -> None:
    """One replica of 2 GPUs and 4 vCPUs at $3 a GPU-hour and $0.25 a vCPU-hour: $7 an hour.
    A $7 budget holds for one hour of running, not a minute more."""
    live = status(AppState.RUNNING, usage(run(0, SUBMITTED + 10)))
    guards = Guards(max_cost=7.0, rates=Rates(gpu_hour=3.0, vcpu_hour=0.25))
    assert guards.check(live, SUBMITTED + 10 + 3600) is None  # exactly at the budget
    trip = guards.check(live, SUBMITTED + 10 + 3660)
    assert trip is not None and trip.guard == MAX_COST and trip.cost_usd == pytest.approx(7 * 3660 / 3600)
    message = trip.message("local_cwd://t/j")
    assert message.startswith("max_cost=7: TorchX job local_cwd://t/j cost $7.12, over its budget of $7.00 (RUNNING")
    assert trip.to_dict()["cost_usd"] == pytest.approx(7 * 3660 / 3600)


def test_max_cost_without_rates_is_refused_before_anything_runs() -> None:
    with pytest.raises(ValueError, match=r"max_cost=5: the job cannot be priced, .*give rates \(the conn\)"):
        Guards(max_cost=5.0).require_priced("the conn")
    Guards(max_cost=5.0, rates=Rates(gpu_hour=1.0)).require_priced("the conn")
    Guards(max_gpu_hours=1.0).require_priced("the conn")


def test_max_cost_without_rates_is_accepted_where_the_scheduler_prices_its_attempts() -> None:
    Guards(max_cost=5.0).require_priced("the conn", prices_attempts=True)


# ---------------------------------------------------------------------- max_cost: the decision table
# What prices a live job's cost so far, row by row: rates / its scheduler's price (AWS's) / an
# attempt it cannot price (n/a) / not priced yet / nothing at all. One running attempt of one
# replica (2 GPUs, 4 vCPUs), started 10 s after its submission.

STARTED = SUBMITTED + 10
BUDGET = 1.0
UNAUTHORIZED = "ec2:DescribeInstances: UnauthorizedOperation"


def live_at(price_per_hour: float | None = None, no_price: str = "") -> AppStatus:
    attempt = Attempt("trainer", 0, 1, STARTED, None, price_per_hour=price_per_hour, no_price=no_price)
    return status(AppState.RUNNING, usage(attempt))


def test_max_cost_row_rates_win_over_the_schedulers_price() -> None:
    """Rates ($0.5 a GPU-hour: $1 an hour) and an AWS price of $100 an hour: the rates count.
    Half an hour in, AWS's price would be $50 over the $1 budget; at the rates it is $0.50."""
    guards = Guards(max_cost=BUDGET, rates=Rates(gpu_hour=0.5))
    live = live_at(price_per_hour=100.0)
    assert guards.check(live, STARTED + 1800) is None
    trip = guards.check(live, STARTED + 3660)
    assert trip is not None and trip.guard == MAX_COST and trip.cost_usd == pytest.approx(3660 / 3600)
    assert guards.unheld(live) == []


def test_max_cost_row_no_rates_trips_on_the_schedulers_price_of_the_running_attempt() -> None:
    """No rates, the attempt priced by its scheduler at $2 an hour: a $1 budget holds for 30
    minutes, then trips with the cost seen."""
    guards = Guards(max_cost=BUDGET)
    live = live_at(price_per_hour=2.0)
    assert guards.check(live, STARTED + 1800) is None  # exactly at the budget
    trip = guards.check(live, STARTED + 1860)
    assert trip is not None and trip.guard == MAX_COST and trip.limit == BUDGET
    assert trip.cost_usd == pytest.approx(2.0 * 1860 / 3600)
    assert trip.message("aws_batch://q/app").startswith(
        "max_cost=1: TorchX job aws_batch://q/app cost $1.03, over its budget of $1.00 (RUNNING"
    )
    assert guards.unheld(live) == []


def test_max_cost_row_an_attempt_that_cannot_be_priced_never_trips_and_is_unheld() -> None:
    """No rates, the running attempt n/a (a permission missing): no trip however long it runs,
    also beside an ended attempt that was priced; the attempt is the one the guard cannot hold."""
    guards = Guards(max_cost=BUDGET)
    live = live_at(no_price=UNAUTHORIZED)
    assert guards.check(live, STARTED + 100 * 3600) is None
    assert [(a.role, a.replica, a.number, a.no_price) for a in guards.unheld(live)] == [("trainer", 0, 1, UNAUTHORIZED)]
    priced_before = Attempt("trainer", 0, 1, SUBMITTED, STARTED - 1, price_per_hour=1000.0)
    open_na = Attempt("trainer", 0, 2, STARTED, None, no_price=UNAUTHORIZED)
    assert guards.check(status(AppState.RUNNING, usage(priced_before, open_na)), STARTED + 3600) is None


def test_max_cost_row_rates_price_an_attempt_its_scheduler_could_not() -> None:
    """With rates, an attempt n/a at AWS's prices is priced at the rates: it trips, and
    nothing is unheld."""
    guards = Guards(max_cost=BUDGET, rates=Rates(gpu_hour=0.5))
    live = live_at(no_price=UNAUTHORIZED)
    trip = guards.check(live, STARTED + 3660)
    assert trip is not None and trip.cost_usd == pytest.approx(3660 / 3600)
    assert guards.unheld(live) == []


def test_max_cost_row_an_attempt_not_priced_yet_trips_nothing_and_is_not_unheld() -> None:
    """No rates, the running attempt's price not known yet (its pricing still under way): no
    trip, and nothing said yet: a later look brings its price or what is missing."""
    guards = Guards(max_cost=BUDGET)
    live = live_at()
    assert guards.check(live, STARTED + 100 * 3600) is None
    assert guards.unheld(live) == []


def test_max_cost_row_no_price_source_trips_nothing_and_is_refused_before_submitting() -> None:
    """No rates and a scheduler that prices nothing (local, Slurm): nothing to trip on, which
    is why the task refuses such a ``max_cost`` before submitting, with the same error."""
    guards = Guards(max_cost=BUDGET)
    assert guards.check(live_at(), STARTED + 100 * 3600) is None
    with pytest.raises(ValueError, match=r"^max_cost=1: the job cannot be priced, so its budget could never be held"):
        guards.require_priced("the conn", prices_attempts=False)


def test_a_watcher_says_once_per_attempt_that_max_cost_cannot_be_held_for_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every look at an n/a attempt: one warning for it, naming the guard, the attempt and what
    is missing; a second n/a attempt gets its own; without ``max_cost``, none."""
    watch = JobWatch(cast(Any, None), "aws_batch://q/app", stream_logs=False)
    watch.guards = Guards(max_cost=BUDGET)
    second = Attempt("trainer", 1, 1, STARTED, None, no_price="pricing:GetProducts: AccessDeniedException")
    with caplog.at_level(logging.WARNING, logger="airflow_provider_torchx.core.logstream"):
        for _ in range(3):
            watch.looked_at(live_at(no_price=UNAUTHORIZED))
        watch.looked_at(status(AppState.RUNNING, usage(run(0, STARTED), second)))
        watch.looked_at(live_at(no_price=UNAUTHORIZED))
        quiet = JobWatch(cast(Any, None), "aws_batch://q/app", stream_logs=False)
        quiet.guards = Guards(max_gpu_hours=1.0)
        quiet.looked_at(live_at(no_price=UNAUTHORIZED))
    assert [r.getMessage() for r in caplog.records] == [
        "max_cost=1 cannot be held for trainer[0] attempt #1 of TorchX job aws_batch://q/app: its scheduler "
        f"cannot price it ({UNAUTHORIZED}); the job's cost so far is unknown while it runs, and the guard "
        "does not trip on it",
        "max_cost=1 cannot be held for trainer[1] attempt #1 of TorchX job aws_batch://q/app: its scheduler "
        "cannot price it (pricing:GetProducts: AccessDeniedException); the job's cost so far is unknown while "
        "it runs, and the guard does not trip on it",
    ]
    assert watch.state.status is not None and watch.state.looked


# ---------------------------------------------------------------------- held by the scheduler


def test_a_trip_comes_back_from_its_dict() -> None:
    trip = Trip(MAX_GPU_HOURS, 0.5, AppState.RUNNING, 600.0, "why", 0.51)
    assert Trip.from_dict(trip.to_dict()) == trip
    assert Trip.from_dict(json.loads(json.dumps(trip.to_dict()))) == trip  # as state.json keeps it


@pytest.mark.parametrize(
    "data",
    [None, [], {"guard": "start_timeout"}, {**Trip(START_TIMEOUT, 1, AppState.PENDING, 2).to_dict(), "state": "X"}],
    ids=["none", "not-an-object", "fields-missing", "unknown-state"],
)
def test_anything_else_is_no_trip(data: Any) -> None:
    assert Trip.from_dict(data) is None


@pytest.mark.parametrize(
    ("budget", "gpus", "timeout", "seconds"),
    [
        pytest.param(1.0, 10, None, 360, id="budget-over-gpus"),
        pytest.param(1.0, 10, 300, 300, id="attempt-timeout-shorter"),
        pytest.param(1.0, 10, 900, 360, id="budget-shorter"),
        pytest.param(1e-9, 4, None, 1, id="at-least-a-second"),
        pytest.param(1.0, 0, 120, 120, id="no-gpus-timeout-alone"),
        pytest.param(None, 8, None, None, id="neither"),
    ],
)
def test_a_gpu_budget_bounds_an_attempts_run_time(
    budget: float | None, gpus: float, timeout: float | None, seconds: int | None
) -> None:
    assert budget_seconds(budget, gpus, timeout) == seconds


def test_the_task_hands_over_only_the_guards_the_scheduler_declares() -> None:
    opts = runopts()
    add_guard_option(opts, MAX_GPU_HOURS, "budget")
    guards = Guards(start_timeout=60, max_gpu_hours=2.0)
    assert guard_cfg(guards, opts) == {MAX_GPU_HOURS: 2.0}
    assert guard_cfg(Guards(start_timeout=60), opts) == {}
    assert guard_cfg(guards, runopts()) == {}
