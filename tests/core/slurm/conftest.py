"""Fixtures of the ``slurm`` scheduler's tests: a scheduler on the real cluster
(``slurm_cluster``, ``tests/fixtures/slurm.py``) whose job directory and index are the test's."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_torchx.core.schedulers.api import DescribeAppResponse
from airflow_provider_torchx.core.schedulers.slurm.record import JobIndex
from airflow_provider_torchx.core.schedulers.slurm.scheduler import SlurmScheduler

DATA = Path(__file__).parent / "data"


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    path = tmp_path / "jobs"
    path.mkdir()
    return path


@pytest.fixture
def slurm(slurm_cluster: str, tmp_path: Path) -> Iterator[SlurmScheduler]:
    """A scheduler on the test cluster with an index of its own."""
    sched = SlurmScheduler("test", index=JobIndex(tmp_path / "index"))
    try:
        yield sched
    finally:
        for app_id, _ in sched.index.items():  # the test's own jobs
            desc = sched.describe(app_id)
            if desc is not None and not desc.state.is_terminal():
                sched.commands.scancel(app_id)
        sched.close()


def wait_for(sched: SlurmScheduler, app_id: str, done: str = "terminal", limit: float = 60.0) -> DescribeAppResponse:
    """Describe ``app_id`` until it is terminal (or RUNNING with ``done="running"``); fails
    after ``limit`` seconds (a bound on a hang, not a timing assertion)."""
    deadline = time.monotonic() + limit
    while True:
        desc = sched.describe(app_id)
        assert desc is not None, f"job {app_id} is unknown"
        if desc.state.is_terminal() or (done == "running" and desc.state.name == "RUNNING"):
            return desc
        if time.monotonic() > deadline:
            pytest.fail(f"job {app_id} is still {desc.state.name} after {limit:g} s: {desc.msg}")
        time.sleep(0.2)
