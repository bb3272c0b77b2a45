"""The node rules of a look at a Batch job (``looks.py``) on entries shaped like real AWS
(``fakes``), one test per rule. ``Look`` itself, through the poller, is in ``test_status.py``."""

from __future__ import annotations

import pytest

from airflow_provider_torchx.core.schedulers.aws_batch.looks import by_node, ended_nodes, node_ids
from airflow_provider_torchx.core.schedulers.aws_batch.poller import NOT_VISIBLE
from tests.core.aws_batch.fakes import child_job, container_job, mnp_job


@pytest.mark.parametrize("status", ["SUCCEEDED", "FAILED"])
def test_every_node_of_an_ended_multi_node_job_describes_its_end(status: str) -> None:
    assert ended_nodes(mnp_job(status=status, roles=(("trainer", 2), ("ps", 1)))) == range(3)


@pytest.mark.parametrize("status", ["SUBMITTED", "RUNNABLE", "STARTING", "RUNNING"])
def test_a_multi_node_job_that_has_not_ended_needs_no_node(status: str) -> None:
    assert ended_nodes(mnp_job(status=status)) == range(0)


def test_a_single_node_job_is_its_own_description() -> None:
    assert ended_nodes(container_job(status="FAILED")) == range(0)


@pytest.mark.parametrize("job", [None, NOT_VISIBLE])
def test_a_job_unknown_or_not_visible_yet_has_no_nodes(job: dict[str, object] | None) -> None:
    assert ended_nodes(job) == range(0)


def test_a_nodes_child_job_id_is_the_job_id_hash_its_index() -> None:
    assert node_ids(mnp_job(job_id="j7"), [0, 2]) == {"j7#0": 0, "j7#2": 2}


def test_child_jobs_by_node_leave_out_those_not_described() -> None:
    ids = {"j1#0": 0, "j1#1": 1, "j1#2": 2}
    node0 = child_job("j1", 0, "SUCCEEDED", 0)
    found = {"j1#0": node0, "j1#1": None, "j1#2": NOT_VISIBLE}
    assert by_node(ids, found) == {0: node0}
