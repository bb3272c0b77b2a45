"""AWS Batch jobs (moto server, jobs as Docker containers) on a live Airflow deployment.

The DAG reads its queue from the ``torchx_batch`` connection (``AIRFLOW_CONN_TORCHX_BATCH``):
a deferred job runs and succeeds with its output in the task log once; another, marked failed
while deferred, is cancelled: Batch ends it with our cancel reason, TorchX reports CANCELLED and
its container stops; another, marked failed right after deferral (before its trigger may have
started), is terminated within a minute with the task named in its reason. On the same
deployment (a fake 4-GPU host) local jobs show the guardrails: deferred tasks fail by
``start_timeout`` and ``max_gpu_hours``. (Those run on Airflow 3.3 only: a guard acts the same
on every line, and each live test on the older lines costs CI a deployment's minutes.)
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_torchx.core.schedulers.aws_batch.status import CANCEL_REASON
from airflow_provider_torchx.core.specs import AppDef, AppState, Resource, Role, parse_app_handle
from tests.e2e.deployment import wait_until
from tests.e2e.live import TRIGGER_STARTED, LiveAirflow, LiveBatch, assert_each_line_once, expected_lines

pytestmark = [pytest.mark.airflow, pytest.mark.docker]

BATCH = "torchx_e2e_batch"
CANCEL_WITHIN = 35
#: A job ends within a minute of its task (docs/architecture.md, Orphaned jobs).
ORPHAN_WITHIN = 60
GUARDRAILS = "torchx_e2e_guardrails"
#: The capacity ladder's DAG and its rungs (``tests/e2e/conftest.py``): the box, then Batch.
LADDER = "torchx_e2e_batch_ladder"
BOX = "torchx_e2e_batch_box"
RUNG = "torchx_e2e_ladder_batch"
#: The retries the guarded tasks allow (``dags/torchx_e2e_guardrails.py``).
GUARD_RETRIES = 2


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


def holding(live: LiveAirflow, app_id: str) -> bool:
    """Whether the test's job ``app_id`` runs, holding the 2 GPUs it asked for."""
    desc = live.scheduler.describe(app_id)
    if desc is None or desc.state.name != "RUNNING":
        return False
    return len(desc.roles_statuses[0].replicas[0].devices.split(",")) == 2


@contextlib.contextmanager
def gpu_holder(live: LiveAirflow, gate: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A local job of the test's in the deployment's job store holding 2 of its 4 fake GPUs,
    running, until the block ends (its ``gate`` file made); yields its app id."""
    monkeypatch.setenv("AIRFLOW_TORCHX_LOCAL_GPUS", "0,1,2,3")  # as the deployment's
    script = f'while [ ! -e "{gate}" ]; do sleep 0.2; done'
    role = Role("g", image="local", entrypoint="sh", args=["-c", script], resource=Resource(1, 2, 64))
    holder = live.scheduler.submit(AppDef("holder", roles=[role]), {"auto_set_cuda_visible_devices": True})
    try:
        wait_until(lambda: holding(live, holder), 60, "the GPU holder to run")
        yield holder
    finally:
        gate.touch()


def guarded_try_log(live: LiveAirflow, run_id: str, task_id: str, guard: str) -> str:
    """The log of the try of ``task_id`` that ``guard`` failed, checked to be the task's last
    try although a retry was left (the DAG allows ``GUARD_RETRIES``)."""
    api = live.deployment
    tries = api.task_instance(GUARDRAILS, run_id, task_id)["try_number"]
    logs = {n: "\n".join(api.task_log(GUARDRAILS, run_id, task_id, n)) for n in range(1, tries + 1)}
    tripped = [n for n, log in logs.items() if f"Guardrail {guard} tripped" in log]
    assert tripped == [tries] and tries <= GUARD_RETRIES, logs
    return logs[tries]


def test_deferred_tasks_fail_by_their_guardrails_with_the_reason_in_the_task_log(
    live_airflow_batch: LiveBatch, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In one DAG run: a deferred task whose job waits for GPUs another job (started by the
    test in the deployment's job store, the deployment's 4 fake GPUs) holds fails by
    ``start_timeout`` (15 s), the GPU wait and its holder in the task log, its job cancelled; a
    deferred task whose 2-GPU job spends its budget fails by ``max_gpu_hours``. Neither is
    retried after its guard tripped (both allow retries: a try may be lost before to
    apache/airflow#72716, a trigger event that comes within seconds of the deferral)."""
    live = live_airflow_batch.live
    api = live.deployment
    with gpu_holder(live, tmp_path / "gate", monkeypatch) as holder:
        run_id = live.trigger(GUARDRAILS, {})
        api.wait_for_state(GUARDRAILS, run_id, "job", {"failed"}, timeout=240)
        assert holding(live, holder)  # it held its GPUs throughout: nothing freed them
    log = guarded_try_log(live, run_id, "job", "start_timeout")
    (line,) = [event for event in log.splitlines() if "Guardrail start_timeout tripped" in event]
    assert "start_timeout=15s: TorchX job" in line and "did not start within 15s of its submission" in line, line
    assert "waiting for 3 GPUs, " in line and "held by " in line and holder in line, line
    waiter = api.xcom(GUARDRAILS, run_id, "job", "app_handle")
    wait_until(lambda: live.job_state(waiter)["state"] == "CANCELLED", 30, "the waiting job to be cancelled")

    api.wait_for_state(GUARDRAILS, run_id, "budget", {"failed"}, timeout=240)
    log = guarded_try_log(live, run_id, "budget", "max_gpu_hours")
    assert log.count("Guardrail max_gpu_hours tripped") == 1, log
    assert "over its budget of 0.00833333 GPU-hours" in log and "GPU budget hit: max_gpu_hours=0.00833333" in log, log
    spender = api.xcom(GUARDRAILS, run_id, "budget", "app_handle")
    wait_until(lambda: live.job_state(spender)["state"] == "CANCELLED", 30, "the job over budget to be cancelled")


def test_a_deferred_ladder_moves_from_a_busy_box_to_batch(
    live_airflow_batch: LiveBatch, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The box's GPUs are held (2 of 4 by the test's job; the ladder's job asks for 3): the
    deferred task's job cannot start there, is cancelled for the move after the box's
    ``start_timeout``, and runs on the moto server's queue with the same identity and
    checkpoint location, the attempt continued, and succeeds: one move line in the task log."""
    batch, live = live_airflow_batch, live_airflow_batch.live
    api = live.deployment
    with gpu_holder(live, tmp_path / "gate", monkeypatch):
        run_id = live.trigger(LADDER, {})
        api.wait_for_state(LADDER, run_id, "ladder", {"success"}, timeout=120)
    steps = api.xcom(LADDER, run_id, "ladder", "ladder")
    assert [(s["conn_id"], s["outcome"]) for s in steps] == [(BOX, "moved"), (RUNG, "succeeded")], steps
    assert steps[0]["reason"] == "it did not start within start_timeout=10s", steps
    box_job = live.scheduler.describe(parse_app_handle(steps[0]["app_handle"]).app_id)
    assert box_job is not None and box_job.state == AppState.CANCELLED, box_job
    assert box_job.cancel_reason == f"moved to {RUNG}: it did not start within start_timeout=10s", box_job
    handle = api.xcom(LADDER, run_id, "ladder", "app_handle")
    assert handle == steps[1]["app_handle"] and handle.startswith(f"aws_batch://torchx/{batch.queue}:"), handle
    assert batch.batch_job(handle)["status"] == "SUCCEEDED"
    taken = batch.runner().describe_app(handle)
    assert taken is not None and taken.labels["torchx.rung"] == RUNG
    identity = {k: v for k, v in box_job.labels.items() if k.startswith("airflow.")}
    assert identity and all(taken.labels.get(k) == v for k, v in identity.items()), (identity, taken.labels)
    ckpt = f"s3://torchx-e2e/ckpt/{LADDER}/{run_id}/ladder"
    assert box_job.checkpoint_dir == taken.checkpoint_dir == ckpt, (box_job.checkpoint_dir, taken.checkpoint_dir)
    events = api.task_log(LADDER, run_id, "ladder", 1)
    moves = [e for e in events if e.startswith(f"Ladder: leaving rung 1 '{BOX}' (local_cwd)")]
    assert len(moves) == 1 and moves[0].endswith(f"moving to rung 2 '{RUNG}' (aws_batch)"), moves
    assert any(e.endswith(f"ckpt={ckpt} attempt=1") for e in events), events[-40:]
