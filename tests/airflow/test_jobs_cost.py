"""The UI jobs list's cost column (``plugins/jobs.py``, ``JobRow.cost_usd``) for AWS Batch jobs
without rates: an ended one shows its cost at AWS's own prices, read from one description kept
with the row; others stay blank without a description. The runner is a stub counting its
``describe_app`` calls (what the column costs the scheduler)."""

from __future__ import annotations

import pytest

from airflow_provider_torchx.core.schedulers.api import DescribeAppResponse
from airflow_provider_torchx.core.specs import AppState, Resource, Role
from airflow_provider_torchx.core.usage import Attempt, compute_usage
from airflow_provider_torchx.plugins import jobs

pytestmark = pytest.mark.airflow

HANDLE = "aws_batch://torchx/q1:app-1"


class Runner:
    """Describes one ended Batch job whose one attempt ran an hour at $2.50/h (AWS's price)."""

    def __init__(self) -> None:
        self.described: list[str] = []

    def describe_app(self, handle: str) -> DescribeAppResponse:
        self.described.append(handle)
        role = Role("trainer", image="img", resource=Resource(cpu=4, gpu=1, memMB=1024))
        attempt = Attempt("trainer", 0, 1, 0.0, 3600.0, exit_code=0, price_per_hour=2.5)
        usage = compute_usage(0.0, 3600.0, [role], [attempt])
        return DescribeAppResponse(app_id="q1:app-1", state=AppState.SUCCEEDED, roles=[role], usage=usage)


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> Runner:
    stub = Runner()
    monkeypatch.setattr(jobs, "runner_for", lambda handle, conn_id: stub)
    return stub


def test_an_ended_batch_job_without_rates_shows_its_aws_priced_cost_read_once(runner: Runner) -> None:
    row = jobs.JobRow(HANDLE, "aws_batch", "app-1", "SUCCEEDED", "torchx_batch")
    for _ in range(3):  # three page loads of one listing
        assert row.as_json()["cost_usd"] == pytest.approx(2.5)
    assert runner.described == [HANDLE]


@pytest.mark.parametrize(
    ("scheduler", "state"),
    [("aws_batch", "RUNNING"), ("local_cwd", "SUCCEEDED"), ("slurm", "FAILED")],
)
def test_other_jobs_without_rates_stay_blank_without_a_description(runner: Runner, scheduler: str, state: str) -> None:
    row = jobs.JobRow(HANDLE, scheduler, "app-1", state, None)
    assert row.as_json()["cost_usd"] is None and runner.described == []
