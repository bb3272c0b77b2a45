"""AWS Batch jobs (moto server, jobs as Docker containers) on a live Airflow deployment.

The DAG reads its queue from the ``torchx_batch`` connection (``AIRFLOW_CONN_TORCHX_BATCH``):
a deferred job runs and succeeds with its output in the task log once; another, marked failed
while deferred, is cancelled: Batch ends it with our cancel reason, TorchX reports CANCELLED and
its container stops; another, marked failed right after deferral (before its trigger may have
started), is terminated within a minute with the task named in its reason.
"""

from __future__ import annotations

import time

import pytest

from airflow_provider_torchx.core.schedulers.aws_batch.status import CANCEL_REASON
from airflow_provider_torchx.core.specs import AppState
from tests.e2e.deployment import wait_until
from tests.e2e.live import TRIGGER_STARTED, LiveBatch, assert_each_line_once, expected_lines

pytestmark = [pytest.mark.airflow, pytest.mark.docker]

BATCH = "torchx_e2e_batch"
CANCEL_WITHIN = 35
#: A job ends within a minute of its task (docs/architecture.md, Orphaned jobs).
ORPHAN_WITHIN = 60


def test_batch_job_runs_deferred_and_succeeds(live_airflow_batch: LiveBatch) -> None:
    batch, api = live_airflow_batch, live_airflow_batch.live.deployment
    # Long enough (10 s) for the scheduler to take the defer-exit's executor event before the task
    # resumes: an earlier resume gets the task failed by apache/airflow#72716 (open for 3.3.x).
    run_id = batch.live.trigger(BATCH, {"lines": 5, "pause": 2, "replicas": 1})
    handle = batch.live.app_handle(BATCH, run_id)
    assert handle.startswith(f"aws_batch://torchx/{batch.queue}:"), handle

    api.wait_for_state(BATCH, run_id, "job", {"success"}, timeout=180)
    assert batch.batch_job(handle)["status"] == "SUCCEEDED"
    assert_each_line_once(batch.live.log(BATCH, run_id), expected_lines(5, 1), run_id)


def test_batch_job_marked_failed_while_deferred_is_cancelled(live_airflow_batch: LiveBatch) -> None:
    batch, api = live_airflow_batch, live_airflow_batch.live.deployment
    run_id = batch.live.trigger(BATCH, {"lines": 600, "pause": 1, "replicas": 1})
    handle = batch.live.app_handle(BATCH, run_id)
    job_id = batch.batch_job(handle)["jobId"]
    api.wait_for_state(BATCH, run_id, "job", {"deferred"})
    # Only a running trigger can cancel: Airflow drops a trigger no triggerer has picked up yet
    # without calling it (marking the task failed in that window leaves the job running).
    batch.live.wait_for_log(BATCH, run_id, "deferred", TRIGGER_STARTED)
    wait_until(
        lambda: batch.batch_job(handle)["status"] == "RUNNING",
        120,
        f"Batch job {job_id} to run",
        seen=lambda: batch.batch_job(handle)["status"],
    )
    assert batch.running_containers(job_id)

    api.set_state(BATCH, run_id, "job", "failed")
    wait_until(
        lambda: batch.batch_job(handle)["status"] in ("SUCCEEDED", "FAILED"),
        CANCEL_WITHIN,
        f"{job_id} to end",
        seen=lambda: batch.batch_job(handle)["status"],
    )
    job = batch.batch_job(handle)
    assert job["status"] == "FAILED" and job.get("statusReason", "").startswith(CANCEL_REASON), job
    status = batch.torchx_status(handle)
    assert status is not None and status.state == AppState.CANCELLED, status
    wait_until(lambda: not batch.running_containers(job_id), CANCEL_WITHIN, f"{job_id}'s container to stop")
    assert api.task_instance(BATCH, run_id, "job")["state"] == "failed"


def test_batch_job_marked_failed_right_after_deferral_is_terminated_within_a_minute(
    live_airflow_batch: LiveBatch,
) -> None:
    """Marked before its trigger may have started (Airflow then calls nothing on it): the
    reaper's listener in the api-server terminates the job, with the reason, within a minute."""
    batch, api = live_airflow_batch, live_airflow_batch.live.deployment
    run_id = batch.live.trigger(BATCH, {"lines": 600, "pause": 1, "replicas": 1})
    wait_until(lambda: api.task_instance(BATCH, run_id, "job")["state"] == "deferred", 180, "deferral", interval=0.2)
    marked = time.time()
    api.set_state(BATCH, run_id, "job", "failed")
    handle = batch.live.app_handle(BATCH, run_id)
    wait_until(
        lambda: batch.batch_job(handle)["status"] in ("SUCCEEDED", "FAILED"),
        ORPHAN_WITHIN,
        f"{handle} to end",
        seen=lambda: batch.batch_job(handle)["status"],
    )
    print(f"Batch job ended {time.time() - marked:.1f}s after its task was marked failed")
    job = batch.batch_job(handle)
    reason = job.get("statusReason", "")
    assert job["status"] == "FAILED" and reason.startswith(CANCEL_REASON), job
    # Airflow >= 3.3 also kills the deferred task: its trigger's on_kill cancel may come first.
    ends = (
        f"task {BATCH}.job of run {run_id} was marked failed",
        f"task {BATCH}.job of run {run_id} was killed while deferred",
    )
    assert any(end in reason for end in ends), reason
