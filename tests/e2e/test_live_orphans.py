"""No job outlives its task instance, on a live deployment (REST API only, real processes).

Each way a task ends for good ends its local job within a minute, with the reason in the job's
status message and a log line where the cancel happened: marked failed and marked success
while deferred, marked failed right after deferral (three tasks, before their triggers may have
started), the DAG run marked failed, a worker-mode task process SIGKILLed with ``retries=0``
(Airflow calls no listener: the scheduler's reconciling loop finds it) and a worker lost (task
process and supervisor SIGKILLed; the scheduler fails the task at its 20 s heartbeat timeout).
And never the others: a triggerer restart, a SIGKILLed task whose retry adopts its job (which
runs on to success with its replicas untouched and every line in the tries' logs, the retry's
once), a CLI job without Airflow labels. Rows run side by side in a few DAG runs; each prints
how long its job outlived its task. The deployment's ``[torchx] orphan_grace`` is
``ORPHAN_GRACE`` (10 s; the default is 30): the loop's rows wait that long, and the negative
rows are watched for that grace and a round. The two tests share one deployment: their DAGs
keep them apart, and neither needs one of its own.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import psutil
import pytest

from airflow_provider_torchx.core.runner import DEFAULT_SESSION_NAME
from airflow_provider_torchx.core.specs import AppDef, Role
from airflow_provider_torchx.reaper.loop import RECONCILE_EVERY
from tests.e2e.deployment import AirflowDeployment, wait_until
from tests.e2e.live import (
    ORPHAN_GRACE,
    TRIGGER_STARTED,
    LiveAirflow,
    expected_lines,
    processes_of,
    replica_lines,
    still_running,
    task_labels,
)

# airflow_line: the live stack: listeners, the reaper, the pre-3.3 cancel while deferred.
pytestmark = [pytest.mark.airflow, pytest.mark.airflow_line]

ORPHANS = "torchx_e2e_orphans"
EARLY = "torchx_e2e_orphans_early"
WORKER = "torchx_e2e_orphans_worker"
RUN = "torchx_e2e_orphans_run"
RETRIED = "torchx_e2e_worker"
#: The retried job's lines (1 s apart; it then waits for the test's gate).
RETRIED_LINES = 20
#: The bound the rule promises: a job ends within a minute of its task's end.
WITHIN = 60.0
CANCEL_LOG = "Cancelled orphaned job"
#: The reason of the trigger's own cancel when Airflow (>= 3.3) kills the deferred task.
ON_KILL = "was killed while deferred"


@dataclass
class Row:
    """One task whose job must end: when the task ended (as the test saw or caused it)."""

    dag_id: str
    run_id: str
    task_id: str
    ended_at: float = 0.0
    handle: str = ""
    gone_after: float | None = None

    @property
    def name(self) -> str:
        return f"{self.dag_id}.{self.task_id}"


def the_job(live: LiveAirflow, row: Row) -> str:
    """The one job carrying the row's task instance identity (exactly one)."""
    jobs = wait_until(
        lambda: live.scheduler.list(labels=task_labels(row.dag_id, row.run_id, row.task_id)), 120, f"{row.name}'s job"
    )
    assert len(jobs) == 1, f"{row.name}: {len(jobs)} jobs: {jobs}"
    return f"local_cwd://{DEFAULT_SESSION_NAME}/{jobs[0].app_id}"  # as the operator named it


def wait_all_gone(live: LiveAirflow, rows: list[Row]) -> None:
    """Poll until every row's job has no process left; fail naming the rows whose job
    outlived its task by more than ``WITHIN`` seconds."""
    deadline = max(r.ended_at for r in rows) + WITHIN + 5
    while True:
        now = time.time()
        for row in rows:
            if row.gone_after is None and not processes_of(live.job_dir(row.handle)):
                # The supervisor records "ended" once every replica exited (a scan of every
                # process's environment is slow under load: its own time would be late).
                ended = live.job_state(row.handle).get("ended") or now
                row.gone_after = min(ended, now) - row.ended_at
        late = [r for r in rows if r.gone_after is None and now - r.ended_at > WITHIN]
        if all(r.gone_after is not None for r in rows) or late or now > deadline:
            break
        time.sleep(0.5)
    for row in rows:
        gone = "never" if row.gone_after is None else f"{row.gone_after:.1f}s"
        print(f"{row.name}: job gone {gone} after its task ended")
    late = [r.name for r in rows if r.gone_after is None or r.gone_after > WITHIN]
    assert not late, f"jobs still running {WITHIN:.0f}s after their task ended: {late}"


def assert_cancelled_with_reason(live: LiveAirflow, row: Row, wording: str) -> None:
    """The job ended CANCELLED, its message names the task, run and why, and a component (or
    the task's log, where the trigger cancelled) logged the cancel."""
    state = live.job_state(row.handle)
    assert state["state"] == "CANCELLED", (row.name, state)
    who = f"task {row.dag_id}.{row.task_id} of run {row.run_id}"
    # On Airflow 3.3 a task marked while deferred also gets its trigger's on_kill, whose cancel
    # (naming the task instance) can come first: either reason is the task's end.
    said = state.get("msg") or ""
    assert who in said and (wording in said or ON_KILL in said), (row.name, said)
    api = live.deployment
    logs = {name: api.component_log(name) for name in ("api-server", "scheduler", "triggerer")}
    task_log = api.task_log(row.dag_id, row.run_id, row.task_id, 1)  # the trigger's start check logs there
    app_id = live.job_dir(row.handle).name
    lines = [line for log in [*logs.values(), "\n".join(task_log)] for line in log.splitlines() if app_id in line]
    assert any(CANCEL_LOG in line or "cancelling" in line for line in lines), (row.name, lines)


def mark(api: AirflowDeployment, path: str, body: dict[str, str]) -> None:
    """PATCH a task instance's or DAG run's state as a user would."""
    api.api("PATCH", path, body)


def mark_task(api: AirflowDeployment, row: Row, state: str) -> None:
    mark(api, f"/dags/{row.dag_id}/dagRuns/{row.run_id}/taskInstances/{row.task_id}", {"new_state": state})


def test_jobs_of_deferred_tasks_ended_by_users_end_within_a_minute(live_airflow_heartbeat: LiveAirflow) -> None:
    live, api = live_airflow_heartbeat, live_airflow_heartbeat.deployment
    cli_handle = submit_unlabelled_job(live)
    run_id = live.trigger(ORPHANS, {})
    run_row_id = live.trigger(RUN, {})
    marked = [Row(ORPHANS, run_id, "marked_failed"), Row(ORPHANS, run_id, "marked_success")]
    whole_run = Row(RUN, run_row_id, "job")
    kept = Row(ORPHANS, run_id, "kept")
    for row in [*marked, whole_run, kept]:
        api.wait_for_state(row.dag_id, row.run_id, row.task_id, {"deferred"})
        wait_until(
            lambda row=row: any(TRIGGER_STARTED.match(e) for e in api.task_log(row.dag_id, row.run_id, row.task_id, 1)),
            120,
            f"{row.name}'s trigger to start",
        )
    # Right after deferral: the triggers may not have started (then Airflow calls nothing on them).
    # The three defer after every other task of the test and are marked together as soon as all
    # three are deferred.
    early_run = live.trigger(EARLY, {})
    early = [Row(EARLY, early_run, f"early_{i}") for i in (1, 2, 3)]
    wait_until(
        lambda: all(api.task_instance(r.dag_id, r.run_id, r.task_id)["state"] == "deferred" for r in early),
        180,
        "the early tasks to defer",
        interval=0.2,
    )
    for row in early:
        row.ended_at = time.time()
        mark_task(api, row, "failed")
    marked[0].ended_at = time.time()
    mark_task(api, marked[0], "failed")
    marked[1].ended_at = time.time()
    mark_task(api, marked[1], "success")
    whole_run.ended_at = time.time()
    mark(api, f"/dags/{RUN}/dagRuns/{run_row_id}", {"state": "failed"})

    rows = [*early, *marked, whole_run]
    for row in rows:
        row.handle = the_job(live, row)
    wait_all_gone(live, rows)
    for row in early:
        assert_cancelled_with_reason(live, row, "failed")
    assert_cancelled_with_reason(live, marked[0], "failed")
    assert_cancelled_with_reason(live, marked[1], "success")
    assert_cancelled_with_reason(live, whole_run, "")

    # A triggerer restart cancels nothing: the task is still deferred.
    kept.handle = the_job(live, kept)
    procs = live.long_lived_processes(kept.handle)
    api.stop_component("triggerer", signal.SIGTERM)
    api.start_component("triggerer")
    api.wait_for_state(ORPHANS, run_id, "kept", {"deferred"})
    wait_until(
        lambda: sum(1 for e in api.task_log(ORPHANS, run_id, "kept", 1) if TRIGGER_STARTED.match(e)) >= 2,
        120,
        "the restarted triggerer to run kept's trigger",
    )
    # Longer than a grace period and a round of the reconciling loop: the kept job and the CLI's
    # job (no Airflow labels; running since the start) are never touched.
    assert_left_alone(live, [kept.handle, cli_handle], STAYS_FOR)
    assert still_running(procs) == procs, "the triggerer restart ended the kept job"


def test_worker_tasks_killed_or_lost_end_their_jobs_and_a_retry_adopts(
    live_airflow_heartbeat: LiveAirflow, tmp_path: Path
) -> None:
    live, api = live_airflow_heartbeat, live_airflow_heartbeat.deployment
    run_id = live.trigger(WORKER, {})
    gate = tmp_path / "gate"  # the retried job ends once it is opened, after the retry adopted it
    retried_run = live.trigger(RETRIED, {"lines": RETRIED_LINES, "pause": 1, "replicas": 2, "gate": str(gate)})
    oom, lost, retried = Row(WORKER, run_id, "oom"), Row(WORKER, run_id, "lost"), Row(RETRIED, retried_run, "job")
    pids = {}
    for row in (oom, lost, retried):
        api.wait_for_state(row.dag_id, row.run_id, row.task_id, {"running"})
        row.handle = the_job(live, row)
        ti = api.task_instance(row.dag_id, row.run_id, row.task_id)
        assert ti["try_number"] == 1 and ti["pid"] and api.started(ti["pid"]), ti
        pids[row.task_id] = ti["pid"]
    live.wait_for_log(RETRIED, retried_run, "running")  # the first try logged lines
    replicas = live.replica_processes(retried.handle)
    # What the OOM killer does: the task process dies; its supervisor reports it failed (no listener).
    os.kill(pids["oom"], signal.SIGKILL)
    os.kill(pids["job"], signal.SIGKILL)
    # A lost worker: the task process and its supervisor die; the scheduler fails it at its heartbeat timeout.
    supervisor = psutil.Process(pids["lost"]).ppid()
    assert api.started(supervisor), supervisor
    os.kill(pids["lost"], signal.SIGKILL)
    os.kill(supervisor, signal.SIGKILL)

    # retries=1: the retry adopts the running job (the same one, never resubmitted).
    wait_until(lambda: api.task_instance(RETRIED, retried_run, "job")["try_number"] == 2, 120, "the retry")
    api.wait_for_state(RETRIED, retried_run, "job", {"running"})
    assert the_job(live, retried) == retried.handle
    # The try runs before it adopts: its handle XCom (cleared for the try) follows.
    pushed = wait_until(lambda: api.xcom(RETRIED, retried_run, "job", "app_handle"), 120, "the retry's app_handle")
    assert pushed == retried.handle

    for row in (oom, lost):
        ti = api.wait_for_state(row.dag_id, row.run_id, row.task_id, {"failed"}, timeout=180)
        row.ended_at = datetime.fromisoformat(ti["end_date"].replace("Z", "+00:00")).timestamp()
    wait_all_gone(live, [oom, lost])
    assert_cancelled_with_reason(live, oom, "ended failed")
    assert_cancelled_with_reason(live, lost, "failed")

    # The adopted job ran to the end untouched (never cancelled, no replica restarted), and the
    # two tries' logs hold every line, the retry's each once.
    gate.touch()
    api.wait_for_state(RETRIED, retried_run, "job", {"success"}, timeout=180)
    state = live.job_state(retried.handle)
    assert state["state"] == "SUCCEEDED" and state["num_restarts"] == 0, state
    assert live.replica_processes(retried.handle) == replicas, "the replicas were restarted"
    assert the_job(live, retried) == retried.handle
    first, second = (replica_lines(live.log(RETRIED, retried_run, n)) for n in (1, 2))
    assert len(second) == len(set(second)), f"the retry logged a line twice: {second}"
    missing = set(expected_lines(RETRIED_LINES, 2)) - set(first) - set(second)
    assert not missing, f"lines in neither try's log: {sorted(missing)}"


#: How long the negative rows are watched: a grace period and a reconciling round, and some.
STAYS_FOR = ORPHAN_GRACE + RECONCILE_EVERY + 5


def assert_left_alone(live: LiveAirflow, handles: list[str], seconds: float) -> None:
    """For ``seconds``, every job stays RUNNING with no cancel requested (checked each second)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for handle in handles:
            status = live.scheduler.describe(live.job_dir(handle).name)
            assert status is not None and status.state.name == "RUNNING", (handle, status)
            assert not status.cancel_requested, f"{handle} was cancelled: {status.msg}"
        time.sleep(1)


def submit_unlabelled_job(live: LiveAirflow) -> str:
    """A job as the CLI submits it (no labels) into the deployment's job store; its handle."""
    app = AppDef(name="cli-job", roles=[Role(name="sh", entrypoint="sh", args=["-c", "sleep 600"])])
    app_id = live.scheduler.schedule(live.scheduler.submit_dryrun(app, {}))
    return f"local_cwd://e2e/{app_id}"
