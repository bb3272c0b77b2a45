"""Slurm jobs on a live Airflow deployment (REST API only, real processes, the real cluster of
``scripts/slurm.sh``), in one deployment whose components reach the cluster through the test's
``SLURM_CONF`` and whose ``torchx_e2e_slurm`` connection runs the ``slurm`` scheduler.

A deferred Slurm task beside a deferred local one in one DAG run, the triggerer SIGKILLed and
restarted while they run: each log holds every replica line once. In another run, side by side:
a deferred Slurm task marked failed gets its job cancelled, naming the task (nothing of it left
in ``squeue``); a worker-mode Slurm task whose task process is SIGKILLed is retried, and the
retry adopts the running job (one job carries the task instance's labels, the same handle) and
runs it to success once the test opens its gate.

A deferred capacity ladder (the box, then Slurm) beside a local job holding the box's two GPUs:
the job cannot start on the box, moves to Slurm after the box's ``start_timeout`` and succeeds
there, every line once, the box's job cancelled for the move. Beside it the same ladder in a task
that does not wait (``wait_for_completion=False``) moves its job the same way and returns the Slurm
job's handle, and a deferred sensor follows the job there (every line once in its log).
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_torchx.core.schedulers.api import ListAppResponse
from airflow_provider_torchx.core.schedulers.slurm import status
from airflow_provider_torchx.core.schedulers.slurm.record import JobIndex
from airflow_provider_torchx.core.schedulers.slurm.scheduler import SlurmScheduler
from airflow_provider_torchx.core.specs import AppState
from tests.e2e.conftest import _deployment
from tests.e2e.deployment import wait_until
from tests.e2e.live import (
    ORPHAN_GRACE,
    TRIGGER_STARTED,
    LiveAirflow,
    assert_each_line_once,
    expected_lines,
    task_labels,
)

pytestmark = [pytest.mark.airflow, pytest.mark.slurm]

LINES = "torchx_e2e_slurm"
ENDS = "torchx_e2e_slurm_ends"
LADDER = "torchx_e2e_slurm_ladder"
CONN = "torchx_e2e_slurm"
BOX = "torchx_e2e_box"
#: The ladder's Slurm rung: CONN's cluster and job directory, checkpointing where the box does.
RUNG = "torchx_e2e_ladder_slurm"
#: The bound the reaper's rule promises: a job ends within a minute of its task's end.
WITHIN = 60.0


@pytest.fixture(scope="module")
def slurm_deployment(slurm_cluster: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveAirflow]:
    """A live deployment with the ``torchx_e2e_slurm`` connection (its ``job_dir`` under the
    deployment's folder) and a 10 s ``[torchx] orphan_grace``; its Slurm jobs cancelled at the end."""
    root = tmp_path_factory.mktemp("live-airflow-slurm")
    extra = {"scheduler": "slurm", "cfg": f"job_dir={root / 'slurm-jobs'}"}
    ckpt = str(root / "ckpt")  # the ladder's rungs' checkpoint root
    box = {"scheduler": "local_cwd", "cfg": {"auto_set_cuda_visible_devices": True}, "start_timeout": 10}
    rung = {**extra, "checkpoint_root": ckpt}
    env = {
        f"AIRFLOW_CONN_{CONN.upper()}": json.dumps({"conn_type": "torchx", "extra": extra}),
        f"AIRFLOW_CONN_{BOX.upper()}": json.dumps({"conn_type": "torchx", "extra": {**box, "checkpoint_root": ckpt}}),
        f"AIRFLOW_CONN_{RUNG.upper()}": json.dumps({"conn_type": "torchx", "extra": rung}),
        "AIRFLOW_TORCHX_LOCAL_GPUS": "0,1",  # the box's GPUs, as the ledger counts them
        "AIRFLOW__TORCHX__ORPHAN_GRACE": str(ORPHAN_GRACE),
        "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "120",  # a task process parses its DAG file first
    }
    with _deployment(root, env) as live:
        try:
            yield live
        finally:
            slurm = SlurmScheduler("e2e-cleanup", index=JobIndex(root / "cleanup-index"))
            for app in slurm.list():
                if app.labels.get("airflow.dag_id") in (LINES, ENDS, LADDER) and not app.state.is_terminal():
                    slurm.cancel(app.app_id)
            slurm.close()


@pytest.fixture
def slurm(tmp_path: Path) -> Iterator[SlurmScheduler]:
    """The test's own view of the cluster's jobs (an index of its own)."""
    sched = SlurmScheduler("e2e", index=JobIndex(tmp_path / "index"))
    yield sched
    sched.close()


def jobs_of(slurm: SlurmScheduler, dag_id: str, run_id: str, task_id: str) -> list[ListAppResponse]:
    """The Slurm jobs carrying the task instance's labels."""
    return slurm.list(labels=task_labels(dag_id, run_id, task_id))


def the_job(slurm: SlurmScheduler, dag_id: str, run_id: str, task_id: str) -> str:
    """The id of the task instance's one Slurm job (exactly one)."""
    jobs = wait_until(lambda: jobs_of(slurm, dag_id, run_id, task_id), 120, f"{dag_id}.{task_id}'s Slurm job")
    assert len(jobs) == 1, f"{dag_id}.{task_id}: {len(jobs)} jobs: {jobs}"
    return jobs[0].app_id


def live_in_squeue(slurm: SlurmScheduler, app_id: str) -> bool:
    """Whether Slurm still counts the job as pending, running or completing."""
    entry = status.index_jobs(slurm.commands.squeue()).get(app_id)
    return entry is not None and status.slurm_state(entry) in ("PENDING", "RUNNING", "COMPLETING")


def wait_deferred_and_watched(live: LiveAirflow, dag_id: str, run_id: str, task_id: str) -> None:
    """Wait until the task is deferred and its trigger runs (its start line in the task log)."""
    api = live.deployment
    api.wait_for_state(dag_id, run_id, task_id, {"deferred"})
    wait_until(
        lambda: any(TRIGGER_STARTED.match(e) for e in api.task_log(dag_id, run_id, task_id, 1)),
        120,
        f"{dag_id}.{task_id}'s trigger to start",
    )


def test_slurm_tasks_beside_a_local_one_lines_reaper_and_retry(
    slurm_deployment: LiveAirflow, slurm: SlurmScheduler, tmp_path: Path
) -> None:
    live, api = slurm_deployment, slurm_deployment.deployment
    gate = tmp_path / "gate"  # the ends run's jobs wait for it after their lines
    ends_run = live.trigger(ENDS, {"lines": 3, "pause": 1, "replicas": 1, "gate": str(gate)})
    lines_run = live.trigger(LINES, {"lines": 12, "pause": 1, "replicas": 2})

    # The triggerer SIGKILLed while the deferred Slurm job runs: the job goes on, and the
    # restarted triggerer resumes from the saved cursors (every line once, checked at the end).
    wait_deferred_and_watched(live, LINES, lines_run, "slurm")
    running = the_job(slurm, LINES, lines_run, "slurm")
    api.stop_component("triggerer", signal.SIGKILL)
    try:
        assert live_in_squeue(slurm, running), "the Slurm job ended before the triggerer was killed"
    finally:
        api.start_component("triggerer")

    # A worker-mode task SIGKILLed (what the OOM killer does): its retry adopts the running job.
    api.wait_for_state(ENDS, ends_run, "retried", {"running"})
    first = the_job(slurm, ENDS, ends_run, "retried")
    ti = api.task_instance(ENDS, ends_run, "retried")
    assert ti["try_number"] == 1 and ti["pid"] and api.started(ti["pid"]), ti
    os.kill(ti["pid"], signal.SIGKILL)

    # A deferred task marked failed: its job is cancelled, naming the task.
    wait_deferred_and_watched(live, ENDS, ends_run, "marked")
    marked = the_job(slurm, ENDS, ends_run, "marked")
    api.set_state(ENDS, ends_run, "marked", "failed")
    wait_until(lambda: not live_in_squeue(slurm, marked), WITHIN, f"job {marked} of the marked task to end")
    desc = slurm.describe(marked)
    assert desc is not None and desc.state == AppState.CANCELLED, desc
    assert f"task {ENDS}.marked of run {ends_run}" in desc.msg, desc.msg

    # The retry runs and adopts the same job: never a second one.
    wait_until(lambda: api.task_instance(ENDS, ends_run, "retried")["try_number"] == 2, 120, "the retry")
    api.wait_for_state(ENDS, ends_run, "retried", {"running"})
    handle = wait_until(lambda: api.xcom(ENDS, ends_run, "retried", "app_handle"), 120, "the retry's app_handle")
    assert handle.rsplit("/", 1)[1] == first, handle
    assert [j.app_id for j in jobs_of(slurm, ENDS, ends_run, "retried")] == [first]
    assert live_in_squeue(slurm, first), "the adopted job is no longer running"
    gate.touch()
    api.wait_for_state(ENDS, ends_run, "retried", {"success"}, timeout=120)
    desc = slurm.describe(first)
    assert desc is not None and desc.state == AppState.SUCCEEDED, desc
    assert [j.app_id for j in jobs_of(slurm, ENDS, ends_run, "retried")] == [first]

    # The deferred Slurm task and the local one beside it: every line once in each log.
    for task_id in ("slurm", "local"):
        api.wait_for_state(LINES, lines_run, task_id, {"success"}, timeout=120)
        events = api.task_log(LINES, lines_run, task_id, 1)
        assert any(TRIGGER_STARTED.match(e) for e in events), f"{task_id} was never deferred"
        assert_each_line_once(events, expected_lines(12, 2), f"{LINES}.{task_id}")
    assert [j.state for j in jobs_of(slurm, LINES, lines_run, "slurm")] == [AppState.SUCCEEDED]


def test_a_deferred_ladder_moves_from_a_busy_box_to_slurm(
    slurm_deployment: LiveAirflow, slurm: SlurmScheduler, tmp_path: Path
) -> None:
    live, api = slurm_deployment, slurm_deployment.deployment
    hold = tmp_path / "hold"  # the holder's job holds both GPUs until it exists
    ckpt = str(live.state_dir.parent / "ckpt")  # the connections' checkpoint_root
    # Each deferral lasts 10 s or more (the box's start_timeout, then the Slurm job's 5 x 2 s): a
    # trigger event within seconds of its deferral gets the task failed (apache/airflow#72716).
    run = live.trigger(LADDER, {"lines": 5, "pause": 2, "replicas": 1, "hold": str(hold), "ckpt": ckpt})
    try:
        api.wait_for_state(LADDER, run, "ladder", {"success"}, timeout=120)
        api.wait_for_state(LADDER, run, "sense", {"success"}, timeout=120)
    finally:
        hold.touch()
    steps = api.xcom(LADDER, run, "ladder", "ladder")
    assert [(s["conn_id"], s["outcome"]) for s in steps] == [(BOX, "moved"), (RUNG, "succeeded")], steps
    assert steps[0]["reason"] == "it did not start within start_timeout=10s", steps
    handle = api.xcom(LADDER, run, "ladder", "app_handle")
    assert handle == steps[1]["app_handle"] and handle.startswith("slurm://"), handle
    box_job = live.scheduler.describe(steps[0]["app_handle"].rsplit("/", 1)[1])
    assert box_job is not None and box_job.state == AppState.CANCELLED, box_job
    assert box_job.cancel_reason == f"moved to {RUNG}: it did not start within start_timeout=10s", box_job
    events = api.task_log(LADDER, run, "ladder", 1)
    moves = [e for e in events if e.startswith(f"Ladder: leaving rung 1 '{BOX}' (local_cwd)")]
    assert len(moves) == 1 and moves[0].endswith(f"moving to rung 2 '{RUNG}' (slurm)"), moves
    assert_each_line_once(events, expected_lines(5, 1), f"{LADDER}.ladder")
    job_id = handle.rsplit("/", 1)[1]  # its record, under the connection's job_dir: Slurm may have forgotten it
    slurm.index.add(job_id, str(live.state_dir.parent / "slurm-jobs" / job_id))
    desc = slurm.describe(job_id)
    assert desc is not None and desc.state == AppState.SUCCEEDED, desc
    assert desc.labels.items() >= task_labels(LADDER, run, "ladder").items(), desc.labels

    # The task that does not wait moved its job the same way and handed the Slurm job over; the
    # sensor followed it there: every line once in the sensor's log, the job SUCCEEDED.
    assert api.task_instance(LADDER, run, "handover")["state"] == "success"
    given = api.xcom(LADDER, run, "handover", "return_value")
    steps = api.xcom(LADDER, run, "handover", "ladder")
    assert [s["conn_id"] for s in steps] == [BOX, RUNG] and steps[0]["outcome"] == "moved", steps
    assert given.startswith("slurm://") and given == steps[1]["app_handle"] != handle, given
    left = live.scheduler.describe(steps[0]["app_handle"].rsplit("/", 1)[1])
    assert left is not None and left.cancel_reason == box_job.cancel_reason, left
    said = api.task_log(LADDER, run, "handover", 1)
    assert any(e.startswith(f"Ladder: job {given} is on the last rung 2 '{RUNG}'") for e in said), said[-20:]
    assert_each_line_once(api.task_log(LADDER, run, "sense", 1), expected_lines(5, 1), f"{LADDER}.sense")
    given_id = given.rsplit("/", 1)[1]
    slurm.index.add(given_id, str(live.state_dir.parent / "slurm-jobs" / given_id))
    followed = slurm.describe(given_id)
    assert followed is not None and followed.state == AppState.SUCCEEDED, followed
