"""The failure kinds (``core/failures.py``) of Slurm jobs, from squeue entries shaped as Slurm
22.05 prints them (a captured FAILED job with its state changed to each end Slurm reports) and
from a job's own record once Slurm forgot it: one test per row of the decision table that a
Slurm end reaches."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_provider_torchx.core.failures import FailureKind, classify
from airflow_provider_torchx.core.schedulers.slurm import status
from airflow_provider_torchx.core.schedulers.slurm.record import ReplicaEnd
from tests.core.slurm.conftest import DATA
from tests.core.slurm.test_status import _rec

#: Job 12 of the capture: FAILED, NonZeroExitCode, exit 3.
FAILED = status.index_jobs(json.loads((DATA / "squeue-22.05.json").read_text())["jobs"])["12"]


def _ended_as(job_state: str, reason: str) -> dict[str, Any]:
    return {**FAILED, "job_state": job_state, "state_reason": reason}


@pytest.mark.parametrize(
    ("job_state", "reason", "kind"),
    [
        ("NODE_FAIL", "None", FailureKind.INFRA),  # a node of the job failed
        ("BOOT_FAIL", "None", FailureKind.INFRA),  # a node could not boot
        ("PREEMPTED", "None", FailureKind.INFRA),  # a higher-priority job took the nodes
        ("OUT_OF_MEMORY", "OutOfMemory", FailureKind.INFRA),  # the OOM killer
        ("TIMEOUT", "TimeLimit", FailureKind.TIMEOUT),  # its own --time ran out
        ("DEADLINE", "None", FailureKind.TIMEOUT),  # its --deadline passed
    ],
)
def test_slurms_own_ends_of_a_job_decide_its_kind(job_state: str, reason: str, kind: FailureKind) -> None:
    desc = status.describe("12", None, _ended_as(job_state, reason))
    assert desc is not None
    failure = classify(desc)
    assert failure is not None and failure.kind == kind, (desc.msg, failure)


def test_a_rank_that_exits_non_zero_is_app() -> None:
    desc = status.describe("7", _rec({("a", 0): ReplicaEnd(0, 5.0), ("a", 1): ReplicaEnd(3, 5.0)}), None)
    assert desc is not None
    failure = classify(desc)
    assert failure is not None and failure.kind == FailureKind.APP, failure


def test_a_rank_killed_by_sigkill_from_outside_is_infra() -> None:
    desc = status.describe("7", _rec({("a", 0): ReplicaEnd(137, 5.0), ("a", 1): ReplicaEnd(0, 5.0)}), None)
    assert desc is not None
    failure = classify(desc)
    assert failure is not None and failure.kind == FailureKind.INFRA, failure
