"""A DAG's task running a job on the real Slurm cluster (``scripts/slurm.sh``), waiting in its
worker and deferred to the trigger: every replica's line once, the handle in XCom."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.airflow import assert_lines_once

pytestmark = [pytest.mark.airflow, pytest.mark.slurm]

MODES = [pytest.param(False, id="worker"), pytest.param(True, id="deferred")]


@pytest.fixture
def slurm_conn(slurm_cluster: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The ``torchx_slurm_test`` connection: the slurm scheduler with a job directory of the test's."""
    job_dir = tmp_path / "jobs"
    extra = {"scheduler": "slurm", "cfg": f"job_dir={job_dir}"}
    monkeypatch.setenv("AIRFLOW_CONN_TORCHX_SLURM_TEST", json.dumps({"conn_type": "torchx", "extra": extra}))
    return job_dir


@pytest.mark.parametrize("deferrable", MODES)
def test_a_slurm_job_s_lines_reach_the_task_log_once(run_dag: Any, slurm_conn: Path, deferrable: bool) -> None:
    dag_run, out = run_dag("torchx_test_slurm", deferrable=deferrable)
    assert dag_run.state == "success", out[-5000:]
    handle = dag_run.get_task_instance("hello").xcom_pull(task_ids="hello")
    assert handle.startswith("slurm://"), handle
    job_id = handle.rsplit("/", 1)[1]
    assert (slurm_conn / job_id / "job.json").is_file()
    assert_lines_once(
        out, ["[sh/0] hello from replica 0 of sh on n1", "[sh/1] hello from replica 1 of sh on n2"], ordered=False
    )
    assert ("Pausing task as DEFERRED" in out) == deferrable


def test_a_failed_rank_fails_the_task_with_its_exit_code_and_message(run_dag: Any, slurm_conn: Path) -> None:
    dag_run, out = run_dag("torchx_test_slurm_fail", deferrable=True)
    assert dag_run.state == "failed", out[-5000:]
    assert "sh[1] exited with 3" in out, out[-5000:]
    assert "failed replica sh/1, exit code 3" in out and "rank 1 gives up" in out


@pytest.mark.parametrize("deferrable", MODES)
def test_a_job_that_cannot_start_trips_start_timeout_naming_slurm_s_reason(
    run_dag: Any, slurm_conn: Path, deferrable: bool, tmp_path: Path
) -> None:
    """Another job holds both nodes' GPUs: the task's job stays PENDING, the guard cancels it
    after ``start_timeout`` and the task fails with Slurm's own reason for the wait."""
    from airflow_provider_torchx.core.schedulers.slurm.record import JobIndex
    from airflow_provider_torchx.core.schedulers.slurm.scheduler import SlurmScheduler
    from airflow_provider_torchx.core.specs import AppDef, AppState, Resource, Role
    from tests.core.slurm.conftest import wait_for

    slurm = SlurmScheduler("holder", index=JobIndex(tmp_path / "index"))
    hold = Role(name="hold", entrypoint="sleep", args=["120"], num_replicas=2, resource=Resource(1, 2, 100))
    holder = slurm.submit(AppDef(name="holder", roles=[hold]), {"job_dir": str(slurm_conn)})
    try:
        wait_for(slurm, holder, done="running")
        dag_run, out = run_dag("torchx_test_slurm_wait", deferrable=deferrable)
    finally:
        slurm.cancel(holder)
    assert dag_run.state == "failed", out[-5000:]
    assert "start_timeout=4s: TorchX job slurm://" in out and "did not start within 4s" in out, out[-5000:]
    assert "Slurm's reason: Resources" in out, out[-5000:]
    jobs = slurm.list(labels={"airflow.dag_id": "torchx_test_slurm_wait", "airflow.run_id": dag_run.run_id})
    assert len(jobs) == 1 and f"slurm://torchx/{jobs[0].app_id}" in out, jobs
    desc = wait_for(slurm, jobs[0].app_id)
    assert desc.state == AppState.CANCELLED and desc.started is None, desc
    slurm.close()


def test_a_path_checkpoint_root_reaches_the_slurm_job_without_a_mount(
    run_dag: Any, slurm_conn: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slurm's nodes see this host's shared paths (``shared_paths``): a plain path root is the
    job's ``TORCHX_CHECKPOINT_DIR`` on every node, its parents made here, owner-only."""
    root = tmp_path / "ckpt"
    monkeypatch.setenv("AIRFLOW__TORCHX__CHECKPOINT_ROOT", str(root))
    dag_run, out = run_dag("torchx_test_slurm_ckpt", deferrable=False)
    assert dag_run.state == "success", out[-5000:]
    location = root / "torchx_test_slurm_ckpt" / dag_run.run_id.replace(":", "%3A").replace("+", "%2B") / "ckpt"
    assert_lines_once(out, [f"[sh/{k}] ckpt={location} attempt=0" for k in (0, 1)], ordered=False)
    assert (location.parent.stat().st_mode & 0o777) == 0o700
