"""The description rules (``status.py``) over ``squeue --json`` as Slurm 22.05 prints it
(``data/squeue-22.05.json``, captured from the test cluster) and job records."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_provider_torchx.core.schedulers.api import CancelledBy
from airflow_provider_torchx.core.schedulers.slurm import status
from airflow_provider_torchx.core.schedulers.slurm.record import EarlierRun, JobRecord, ReplicaEnd
from airflow_provider_torchx.core.specs import AppState
from tests.core.slurm.conftest import DATA

# The captured jobs: 11 COMPLETED (ours), 12 FAILED (exit 3), 13 RUNNING, 14 PENDING on
# Resources (ours), 15 a heterogeneous job (15+0 and 15+1) PENDING, 17 CANCELLED while pending.
ENTRIES = status.index_jobs(json.loads((DATA / "squeue-22.05.json").read_text())["jobs"])


def _rec(exits: dict[tuple[str, int], ReplicaEnd], *, ended: float | None = 10.0, cancel: Any = None) -> JobRecord:
    return JobRecord(
        app_id="7",
        directory="/j/7",
        name="t",
        roles=[{"name": "a", "num_replicas": 2, "resource": {"cpu": 4, "gpu": 2, "memMB": 1024}}],
        labels={"k": "v"},
        submitted=1.0,
        started=2.0,
        ended=ended,
        hosts={("a", 0): "n1", ("a", 1): "n2"},
        starts={("a", 0): 3.0, ("a", 1): 3.0},
        exits=exits,
        cancel=cancel,
    )


def test_a_heterogeneous_job_is_its_leader() -> None:
    assert sorted(ENTRIES) == ["11", "12", "13", "14", "15", "17"]
    assert ENTRIES["15"]["het_job_offset"] == 0


@pytest.mark.parametrize(
    ("job", "state", "msg"),
    [
        ("11", AppState.SUCCEEDED, ""),
        ("12", AppState.FAILED, "Slurm: FAILED (NonZeroExitCode)"),
        ("13", AppState.RUNNING, ""),
        ("14", AppState.PENDING, "pending in Slurm (PENDING): Resources"),
        ("15", AppState.PENDING, "pending in Slurm (PENDING): Resources"),
        ("17", AppState.CANCELLED, ""),
    ],
)
def test_slurm_s_state_while_it_knows_the_job(job: str, state: AppState, msg: str) -> None:
    assert status.app_state(None, ENTRIES[job]) == (state, msg)


def test_times_and_labels_come_from_squeue_without_a_record() -> None:
    desc = status.describe("11", None, ENTRIES["11"])
    assert desc is not None
    assert desc.labels == {"airflow.dag_id": "d"}
    assert desc.created == ENTRIES["11"]["submit_time"] and desc.ended == ENTRIES["11"]["end_time"]


# The rows of the table for a job Slurm forgot (no entry).


def test_forgotten_ended_every_replica_exited_0_is_succeeded() -> None:
    rec = _rec({("a", 0): ReplicaEnd(0, 5), ("a", 1): ReplicaEnd(0, 6)})
    assert status.app_state(rec, None) == (AppState.SUCCEEDED, "")


def test_forgotten_ended_with_a_failed_replica_is_failed_naming_it() -> None:
    rec = _rec({("a", 0): ReplicaEnd(143, 6), ("a", 1): ReplicaEnd(3, 5)})
    desc = status.describe("7", rec, None)
    assert desc is not None
    assert (desc.state, desc.msg) == (AppState.FAILED, "a[1] exited with 3 on n2")


def test_forgotten_ended_with_a_replica_that_wrote_no_exit_code_is_failed() -> None:
    assert status.app_state(_rec({("a", 0): ReplicaEnd(0, 5)}), None)[0] == AppState.FAILED


def test_forgotten_with_a_cancel_and_no_end_is_cancelled_by_whom_it_recorded() -> None:
    rec = _rec({}, ended=None, cancel={"reason": "airflow-torchx cancel by bob", "by": "user"})
    desc = status.describe("7", rec, None)
    assert desc is not None
    assert (desc.state, desc.cancelled_by, desc.msg) == (
        AppState.CANCELLED,
        CancelledBy.USER,
        "cancelled by user: airflow-torchx cancel by bob",
    )


def test_forgotten_without_end_or_cancel_is_failed_unrecorded() -> None:
    state, msg = status.app_state(_rec({}, ended=None), None)
    assert state == AppState.FAILED and msg.startswith("the job ended without recording its end")


def test_cancelled_in_slurm_without_our_record_says_so() -> None:
    desc = status.describe("17", _rec({}, ended=None), ENTRIES["17"])
    assert desc is not None and desc.msg == "cancelled in Slurm (outside airflow-torchx)"


# The replica rules.


def _replicas(rec: JobRecord, state: AppState) -> list[tuple[AppState, int | None, str]]:
    return [(r.state, r.exit_code, r.msg) for r in status.replica_states(rec, state)[0].replicas]


def test_the_first_to_fail_is_failed_and_those_signalled_after_it_were_stopped() -> None:
    rec = _rec({("a", 0): ReplicaEnd(137, 6), ("a", 1): ReplicaEnd(3, 5)})
    assert _replicas(rec, AppState.FAILED) == [
        (AppState.CANCELLED, 137, "stopped after a[1] failed"),
        (AppState.FAILED, 3, ""),
    ]


def test_a_replica_failing_on_its_own_after_the_first_is_failed_too() -> None:
    rec = _rec({("a", 0): ReplicaEnd(2, 6), ("a", 1): ReplicaEnd(3, 5)})
    assert [s for s, _, _ in _replicas(rec, AppState.FAILED)] == [AppState.FAILED, AppState.FAILED]


def test_a_replica_without_exit_code_after_a_failure_was_stopped() -> None:
    rec = _rec({("a", 1): ReplicaEnd(3, 5)})
    assert _replicas(rec, AppState.FAILED)[0] == (AppState.CANCELLED, None, "stopped after a[1] failed")


def test_a_replica_without_exit_code_has_the_live_job_s_state() -> None:
    assert _replicas(_rec({}, ended=None), AppState.RUNNING) == [(AppState.RUNNING, None, "")] * 2


def test_a_replica_without_exit_code_in_a_job_slurm_failed_is_failed() -> None:
    assert _replicas(_rec({}, ended=None), AppState.FAILED) == [(AppState.FAILED, None, "")] * 2


def test_usage_counts_each_replica_from_its_start_to_its_exit_or_the_job_s_end() -> None:
    rec = _rec({("a", 1): ReplicaEnd(3, 3603.0)}, ended=7203.0)  # replica 0 was stopped, no exit code
    desc = status.describe("7", rec, None)
    assert desc is not None and desc.usage is not None and desc.usage_so_far is None
    assert (desc.usage.submitted, desc.usage.first_running, desc.usage.queue_wait_s) == (1.0, 3.0, 2.0)
    role = desc.usage.roles[0]
    assert (role.node_seconds, role.gpu_hours, role.vcpu_hours) == (3600.0 + 7200.0, 6.0, 12.0)


def test_a_live_job_has_its_usage_so_far() -> None:
    desc = status.describe("7", _rec({}, ended=None), ENTRIES["13"])
    assert desc is not None and desc.usage is None and desc.usage_so_far is not None
    assert desc.usage_so_far.first_running == 3.0


@pytest.mark.parametrize(
    ("exits", "first"),
    [
        ({("a", 0): ReplicaEnd(143, 5.0), ("a", 1): ReplicaEnd(3, 5.0)}, ("a", 1)),  # same instant: its own exit first
        ({("a", 0): ReplicaEnd(143, 5.2), ("a", 1): ReplicaEnd(3, 5.1)}, ("a", 1)),  # srun stopped rank 0 after
        ({("a", 0): ReplicaEnd(137, 4.9), ("a", 1): ReplicaEnd(3, 5.1)}, ("a", 0)),  # killed first: it failed first
        ({("a", 0): ReplicaEnd(2, 5.0), ("a", 1): ReplicaEnd(3, 5.0)}, ("a", 0)),  # a tie of own exits: index order
        ({("a", 0): ReplicaEnd(0, 5.0), ("a", 1): ReplicaEnd(0, 5.0)}, None),
    ],
)
def test_the_first_failure_is_the_earliest_end_and_an_own_exit_before_a_signal_at_the_same_time(
    exits: dict[tuple[str, int], ReplicaEnd], first: tuple[str, int] | None
) -> None:
    assert status.first_failure(_rec(exits)) == first


def test_a_requeued_job_is_described_as_of_its_current_run() -> None:
    requeued = {**ENTRIES["14"], "restart_cnt": 1}  # pending again, its first run's ends on record
    rec = _rec({("a", 0): ReplicaEnd(0, 5.0, run=0), ("a", 1): ReplicaEnd(143, 6.0, run=0)}, ended=None)
    desc = status.describe("7", rec, requeued)
    assert desc is not None and (desc.state, desc.num_restarts) == (AppState.PENDING, 1)
    assert [(r.state, r.exit_code) for r in desc.roles_statuses[0].replicas] == [(AppState.PENDING, None)] * 2
    assert desc.usage_so_far is not None
    assert sorted((a.replica, a.number, a.exit_code) for a in desc.usage_so_far.attempts) == [(0, 1, 0), (1, 1, 143)]


def test_each_run_of_a_requeued_job_is_an_attempt_one_stopped_unrecorded_counts_to_the_next_start() -> None:
    rec = _rec({("a", 0): ReplicaEnd(0, 20.0, run=1), ("a", 1): ReplicaEnd(0, 20.0, run=1)}, ended=21.0)
    rec.ended_run = 1
    rec.starts = {("a", 0): 15.0, ("a", 1): 15.0}
    rec.earlier = {("a", 0): [EarlierRun("n1", 3.0, ReplicaEnd(0, 4.0))], ("a", 1): [EarlierRun("n2", 3.0, None)]}
    desc = status.describe("7", rec, None)
    assert desc is not None and (desc.state, desc.num_restarts) == (AppState.SUCCEEDED, 1)
    assert desc.usage is not None
    assert sorted((a.replica, a.number, a.started, a.ended) for a in desc.usage.attempts) == [
        (0, 1, 3.0, 4.0),
        (0, 2, 15.0, 20.0),
        (1, 1, 3.0, 15.0),
        (1, 2, 15.0, 20.0),
    ]


# Accounting's record (``sacct --json``, ``data/sacct-22.05.json``, captured from the test cluster
# with slurmdbd): 3 COMPLETED, 4 a heterogeneous job (4+0 and 4+1, job ids 4 and 5) FAILED, 6
# cancelled outside airflow-torchx, all ours.
KEPT = status.index_jobs(status.sacct_entry(j) for j in json.loads((DATA / "sacct-22.05.json").read_text())["jobs"])


def test_accounting_s_jobs_read_as_squeue_entries_a_heterogeneous_job_as_its_leader() -> None:
    assert sorted(KEPT) == ["3", "4", "6"]
    assert [status.slurm_state(KEPT[i]) for i in ("3", "4", "6")] == ["COMPLETED", "FAILED", "CANCELLED"]


def test_a_job_slurm_forgot_is_described_from_accounting_without_a_record() -> None:
    desc = status.describe("6", None, KEPT["6"])
    assert desc is not None
    assert (desc.state, desc.msg, desc.labels) == (
        AppState.CANCELLED,
        "",
        {"k": "v"},
    )
    assert desc.created is not None and desc.started is not None and desc.ended is not None
    assert desc.ended >= desc.started >= desc.created


def test_a_job_cancelled_while_pending_never_started() -> None:
    entry = ENTRIES["17"]  # Slurm gives it a start: when it was cancelled
    assert entry["start_time"] == entry["end_time"] and entry["nodes"] == ""
    desc = status.describe("17", None, entry)
    assert desc is not None and (desc.state, desc.started, desc.ended) == (
        AppState.CANCELLED,
        None,
        entry["end_time"],
    )


def test_accounting_s_none_assigned_is_no_node_so_no_start() -> None:
    job = json.loads((DATA / "sacct-22.05.json").read_text())["jobs"][3]
    ran = status.describe("6", None, status.sacct_entry(job))
    never = status.describe("6", None, status.sacct_entry({**job, "nodes": "None assigned"}))
    assert ran is not None and ran.started == job["time"]["start"]
    assert never is not None and (never.state, never.started) == (AppState.CANCELLED, None)
