"""The local supervisor's policy (``local/policy.py``) without processes: one test per rule
(a replica's exit, ``attempt_timeout``, the retry policies and fail-fast, a cancel's grace,
success, the guards it holds without a watcher), and the supervisor's import budget."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_provider_torchx.core import guards
from airflow_provider_torchx.core.guards import Guards, Trip
from airflow_provider_torchx.core.schedulers.local import policy
from airflow_provider_torchx.core.schedulers.local.policy import Exited, Fail, Restart
from airflow_provider_torchx.core.specs import AppState, AppStatus, Resource, Role
from airflow_provider_torchx.core.usage import Attempt, compute_usage

REPO = Path(__file__).resolve().parents[3]
JOB = [("trainer", 0), ("trainer", 1), ("ps", 0)]
SUBMITTED = 1000.0

# ---------------------------------------------------------------------- a replica's exit


def test_an_exit_after_the_attempt_timed_out_is_a_failure_already_answered() -> None:
    assert policy.exited(-9, timed_out=True, stopping=True, attempt_timeout=5) == Exited(
        "FAILED", "stopped: ran longer than attempt_timeout=5 (seconds)"
    )


def test_an_exit_the_supervisor_caused_is_cancelled_not_a_failure() -> None:
    assert policy.exited(-15, timed_out=False, stopping=True) == Exited("CANCELLED")


def test_exit_code_zero_succeeds() -> None:
    assert policy.exited(0, timed_out=False, stopping=False) == Exited("SUCCEEDED")


def test_any_other_exit_is_a_failure_for_the_retry_policy() -> None:
    assert policy.exited(3, timed_out=False, stopping=False) == Exited("FAILED", failure=True)


def test_the_exit_text_names_the_signal_that_killed_a_replica() -> None:
    assert policy.exit_text("r", 1, 2) == "role 'r' replica 1 exited with code 2"
    assert policy.exit_text("r", 1, -9, "SIGKILL") == "role 'r' replica 1 was killed by SIGKILL (exit code -9)"
    assert policy.exit_text("r", 1, -99) == "role 'r' replica 1 exited with code -99"  # no such signal


# ---------------------------------------------------------------------- attempt_timeout


def test_an_attempt_has_a_deadline_only_with_a_timeout() -> None:
    assert policy.attempt_deadline(100.0, 30) == 130.0
    assert policy.attempt_deadline(100.0, None) is None


def test_an_attempt_times_out_at_its_deadline_not_before() -> None:
    assert not policy.is_timed_out(130.0, 129.9)
    assert policy.is_timed_out(130.0, 130.0)
    assert not policy.is_timed_out(None, 1e12)


# ---------------------------------------------------------------------- retries and fail-fast


def _after(policy_name: str, used: int, max_retries: int = 2, restarts: int = 0) -> Restart | Fail:
    return policy.after_failure(
        ("trainer", 1),
        "role 'trainer' replica 1 exited with code 1",
        replicas=JOB,
        max_retries=max_retries,
        policy=policy_name,
        retries_used=used,
        restarts=restarts,
    )


def test_policy_replica_restarts_the_failed_replica_alone() -> None:
    assert _after("REPLICA", 0) == Restart(
        [("trainer", 1)], "role 'trainer' replica 1 exited with code 1; restart 1/2 of role 'trainer' (REPLICA)"
    )


def test_policy_role_restarts_every_replica_of_the_role() -> None:
    decision = _after("ROLE", 1)
    assert isinstance(decision, Restart) and decision.group == [("trainer", 0), ("trainer", 1)]
    assert decision.msg.endswith("restart 2/2 of role 'trainer' (ROLE)")


def test_policy_application_restarts_the_whole_job() -> None:
    decision = _after("APPLICATION", 0)
    assert isinstance(decision, Restart) and decision.group == JOB


def test_no_retry_left_fails_the_job_naming_the_restarts_so_far() -> None:
    assert _after("REPLICA", 2, restarts=2) == Fail("role 'trainer' replica 1 exited with code 1 (after 2 restart(s))")


def test_no_retry_at_all_fails_at_once() -> None:
    assert _after("APPLICATION", 0, max_retries=0) == Fail("role 'trainer' replica 1 exited with code 1")


# ---------------------------------------------------------------------- cancel and success


def test_a_cancel_takes_the_grace_it_asks_for_else_the_requests() -> None:
    assert policy.cancel_grace({"grace": 3, "reason": "x"}, 10.0) == 3.0
    assert policy.cancel_grace({"reason": "x"}, 10.0) == 10.0
    assert policy.cancel_grace(None, 10.0) == 10.0  # cancel.json unreadable: a cancel all the same


def test_the_job_succeeds_only_when_every_replica_succeeded() -> None:
    assert policy.succeeded(["SUCCEEDED", "SUCCEEDED"])
    assert not policy.succeeded(["SUCCEEDED", "RUNNING"])
    assert not policy.succeeded(["SUCCEEDED", "CANCELLED"])


# ---------------------------------------------------------------------- guards

START = guards.START_TIMEOUT
WAIT = "waiting for 2 GPUs, 0 free, held by local_cwd://t/other"
#: Two replicas of 2 GPUs each, running since SUBMITTED + 10.
RUNNING = [(2.0, [(SUBMITTED + 10, None)]), (2.0, [(SUBMITTED + 10, None)])]


def _trip(now: float, **kw: object) -> dict[str, object] | None:
    values: dict[str, object] = dict(
        start_timeout=None, max_gpu_hours=None, submitted=SUBMITTED, first_running=None, runs=[], msg=WAIT
    )
    return policy.guard_trip(now=now, **(values | kw))  # type: ignore[arg-type]


def _check(now: float, **kw: object) -> float | None:
    values: dict[str, object] = dict(
        start_timeout=None, max_gpu_hours=None, submitted=SUBMITTED, first_running=None, runs=[]
    )
    return policy.next_guard_check(now=now, **(values | kw))  # type: ignore[arg-type]


def test_the_guard_names_are_the_watchers() -> None:
    assert (policy.START_TIMEOUT, policy.MAX_GPU_HOURS) == (guards.START_TIMEOUT, guards.MAX_GPU_HOURS)


def test_start_timeout_trips_once_a_job_that_never_ran_is_older_than_the_limit() -> None:
    assert _trip(SUBMITTED + 60, start_timeout=60) is None  # the limit itself is not over
    assert _trip(SUBMITTED + 61, start_timeout=60) == Trip(START, 60, AppState.PENDING, 61, WAIT).to_dict()


def test_start_timeout_never_trips_once_a_replica_ran() -> None:
    assert _trip(SUBMITTED + 1e6, start_timeout=60, first_running=SUBMITTED + 5) is None


def test_max_gpu_hours_trips_once_the_running_gpus_spent_the_budget() -> None:
    budget = 4 * 90 / 3600  # 90 s of both replicas
    assert _trip(SUBMITTED + 100, max_gpu_hours=budget, first_running=SUBMITTED + 10, runs=RUNNING) is None
    trip = _trip(SUBMITTED + 101, max_gpu_hours=budget, first_running=SUBMITTED + 10, runs=RUNNING, msg="")
    assert trip == {
        "guard": guards.MAX_GPU_HOURS,
        "limit": budget,
        "state": "RUNNING",
        "for_s": 91.0,
        "reason": "",
        "gpu_hours": pytest.approx(4 * 91 / 3600),
        "cost_usd": None,
    }


def test_max_gpu_hours_counts_ended_attempts_too() -> None:
    runs = [(2.0, [(SUBMITTED, SUBMITTED + 60), (SUBMITTED + 100, None)])]
    assert policy.gpu_seconds(runs, SUBMITTED + 130) == pytest.approx(2 * (60 + 30))


def test_max_gpu_hours_never_trips_for_a_job_without_gpus() -> None:
    assert (
        _trip(SUBMITTED + 1e6, max_gpu_hours=1e-9, first_running=SUBMITTED, runs=[(0.0, [(SUBMITTED, None)])]) is None
    )


def test_no_guard_set_trips_nothing_and_sets_no_wake_up() -> None:
    assert _trip(SUBMITTED + 1e9, runs=RUNNING) is None
    assert _check(SUBMITTED + 1e9, runs=RUNNING) is None


def test_the_next_check_is_the_start_deadline_while_nothing_ran() -> None:
    assert _check(SUBMITTED + 5, start_timeout=60) == SUBMITTED + 60
    assert _check(SUBMITTED + 5, start_timeout=60, first_running=SUBMITTED + 1) is None


def test_the_next_check_is_when_the_running_gpus_spend_what_is_left() -> None:
    budget = 4 * 90 / 3600
    at = _check(SUBMITTED + 40, max_gpu_hours=budget, first_running=SUBMITTED + 10, runs=RUNNING)
    assert at == pytest.approx(SUBMITTED + 100)  # 30 s used of 90: 60 s more at 4 GPUs
    assert _check(SUBMITTED + 40, max_gpu_hours=budget, runs=[(2.0, [(SUBMITTED, SUBMITTED + 5)])]) is None


def test_the_supervisors_trip_is_the_one_the_watchers_rule_finds_on_the_same_records() -> None:
    """``Guards.check`` over the usage the job's description gives (``local/usage.py``)."""
    role = Role("trainer", image="x", num_replicas=2, resource=Resource(cpu=1, gpu=2, memMB=64))
    attempts = [Attempt("trainer", k, 1, SUBMITTED + 10, None) for k in (0, 1)]
    status = AppStatus(AppState.RUNNING, usage_so_far=compute_usage(SUBMITTED, None, [role], attempts))
    budget = 4 * 90 / 3600
    watcher = Guards(max_gpu_hours=budget).check(status, SUBMITTED + 101)
    assert watcher is not None
    supervisor = _trip(SUBMITTED + 101, max_gpu_hours=budget, first_running=SUBMITTED + 10, runs=RUNNING, msg="")
    assert supervisor == pytest.approx(watcher.to_dict())


def test_the_jobs_message_names_the_guard_and_its_value() -> None:
    trip = Trip(START, 30, AppState.PENDING, 31).to_dict()
    assert policy.guard_msg(trip) == "guardrail start_timeout=30 tripped: the supervisor stopped the job"


# ---------------------------------------------------------------------- import budget


def test_the_supervisor_and_its_policy_load_no_re_enum_json_or_typing() -> None:
    """As the supervisor starts (``-I -S``), until it forks the replicas (module docstring)."""
    code = (
        f"import sys; sys.path.insert(0, {str(REPO)!r}); "
        "import airflow_provider_torchx.core.schedulers.local.supervisor; "
        "loaded = sorted(sys.modules); import json; print(json.dumps(loaded))"
    )
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = set(json.loads(out))
    assert "airflow_provider_torchx.core.schedulers.local.policy" in loaded
    assert not loaded & {"re", "enum", "json", "typing", "dataclasses", "collections"}, loaded
