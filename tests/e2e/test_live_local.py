"""Local-scheduler jobs on a live Airflow deployment, driven through the REST API only.

Deferred tasks stream replica lines into the task log while deferred, each line once; marking a
deferred task failed cancels its job; a triggerer restart neither cancels the job nor repeats a
line; a task process killed with SIGKILL is retried and the retry adopts the running job; a
2 x 2 DDP job (real PyTorch, ``scripts/torch-venv.sh``) succeeds with every rank's lines once;
50 deferred tasks at once whose jobs print their secrets leave the triggerer up, succeed, and
show the secrets masked in every task log.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.e2e.deployment import COMPONENTS, TERMINAL_TI_STATES, wait_until
from tests.e2e.live import (
    E2E_SETTING,
    LiveAirflow,
    assert_each_line_once,
    expected_lines,
    processes_of,
    replica_lines,
    still_running,
)
from tests.fixtures.torch import nodes_stderr

pytestmark = pytest.mark.airflow

DEFERRED = "torchx_e2e_deferred"
WORKER = "torchx_e2e_worker"
DDP = "torchx_e2e_ddp"
SECRETS = "torchx_e2e_secrets"
#: The mapped tasks of the secrets DAG (``tests/e2e/dags/torchx_e2e_secrets.py``).
SECRET_TASKS = 50
#: How long the job's processes may outlive marking the task failed (Airflow's on_kill timeout
#: is 30 s; the cancel grace period 10 s).
CANCEL_WITHIN = 35


def identity(run_id: str, dag_id: str) -> dict[str, str]:
    return {"airflow.dag_id": dag_id, "airflow.task_id": "job", "airflow.run_id": run_id, "airflow.map_index": "-1"}


def test_deferred_job_lines_show_while_deferred_and_once_in_the_end(live_airflow: LiveAirflow) -> None:
    live, api = live_airflow, live_airflow.deployment
    run_id = live.trigger(DEFERRED, {"lines": 10, "pause": 1, "replicas": 2})
    api.wait_for_state(DEFERRED, run_id, "job", {"deferred"})
    assert live.wait_for_log(DEFERRED, run_id, "deferred") > 0

    api.wait_for_state(DEFERRED, run_id, "job", {"success"})
    assert_each_line_once(live.log(DEFERRED, run_id), expected_lines(10, 2), run_id)
    assert live.job_state(live.app_handle(DEFERRED, run_id))["state"] == "SUCCEEDED"


def test_triggerer_restart_keeps_the_job_and_logs_each_line_once(live_airflow: LiveAirflow) -> None:
    live, api = live_airflow, live_airflow.deployment
    run_id = live.trigger(DEFERRED, {"lines": 30, "pause": 1, "replicas": 2})
    api.wait_for_state(DEFERRED, run_id, "job", {"deferred"})
    handle = live.app_handle(DEFERRED, run_id)
    live.wait_for_log(DEFERRED, run_id, "deferred")
    replicas = live.replica_processes(handle)
    procs = live.long_lived_processes(handle)

    api.stop_component("triggerer", signal.SIGTERM)
    try:
        status = live.scheduler.describe(live.job_dir(handle).name)
        assert status is not None and status.state.name == "RUNNING", status
        assert not status.cancel_requested, "stopping the triggerer cancelled the job"
        assert still_running(procs) == procs, "the supervisor or a replica ended with the triggerer"
    finally:
        api.start_component("triggerer")

    api.wait_for_state(DEFERRED, run_id, "job", {"success"}, timeout=180)
    assert live.replica_processes(handle) == replicas
    assert live.job_state(handle)["state"] == "SUCCEEDED"
    assert_each_line_once(live.log(DEFERRED, run_id), expected_lines(30, 2), run_id)


def test_retry_after_sigkill_adopts_the_running_job(live_airflow: LiveAirflow) -> None:
    live, api = live_airflow, live_airflow.deployment
    run_id = live.trigger(WORKER, {"lines": 25, "pause": 1, "replicas": 2})
    api.wait_for_state(WORKER, run_id, "job", {"running"})
    handle = live.app_handle(WORKER, run_id)
    live.wait_for_log(WORKER, run_id, "running")
    replicas = live.replica_processes(handle)
    ti = api.task_instance(WORKER, run_id, "job")
    assert ti["try_number"] == 1 and ti["pid"] and api.started(ti["pid"]), ti

    os.kill(ti["pid"], signal.SIGKILL)
    wait_until(lambda: api.task_instance(WORKER, run_id, "job")["try_number"] == 2, 120, "the task to be retried")
    api.wait_for_state(WORKER, run_id, "job", {"success"}, timeout=180)
    assert live.app_handle(WORKER, run_id) == handle
    assert api.xcom(WORKER, run_id, "job") == handle
    jobs = live.scheduler.list(labels=identity(run_id, WORKER))
    assert [job.app_id for job in jobs] == [live.job_dir(handle).name], f"resubmitted: {jobs}"
    state = live.job_state(handle)
    assert state["state"] == "SUCCEEDED" and state["num_restarts"] == 0, state
    assert live.replica_processes(handle) == replicas, "the replicas were restarted"

    first, second = replica_lines(live.log(WORKER, run_id, 1)), replica_lines(live.log(WORKER, run_id, 2))
    assert len(second) == len(set(second)), f"the retry logged a line twice: {second}"
    missing = set(expected_lines(25, 2)) - set(first) - set(second)
    assert not missing, f"lines in neither try's log: {sorted(missing)}"


def test_50_deferred_jobs_with_secrets_keep_the_triggerer_up_and_their_logs_masked(
    live_airflow: LiveAirflow, tmp_path: Path
) -> None:
    """The triggerer watches 50 jobs at once whose env holds secrets (``MY_PASSWORD`` from a
    Variable, ``HF_TOKEN``; the tasks take their scheduler from a ``torchx`` connection):
    registering the secrets must not crash it (a synchronous Task SDK call from the watch pool
    did, on Airflow 3.1), every task succeeds and no task log shows a secret."""
    live, api = live_airflow, live_airflow.deployment
    triggerer = api.procs["triggerer"]
    token = "hf_e2e_token_q7Z2xW"
    gate = tmp_path / "gate"
    run_id = live.trigger(SECRETS, {"gate": str(gate), "hf_token": token})

    def states() -> list[str]:
        assert triggerer.poll() is None, "the triggerer exited:\n" + api.component_log("triggerer")[-6000:]
        tis = api.task_instances(SECRETS, run_id)
        ended = [ti for ti in tis if ti["state"] in TERMINAL_TI_STATES]
        assert not ended, f"{[(ti['map_index'], ti['state']) for ti in ended]} ended before the gate opened"
        return [ti["state"] for ti in tis]

    wait_until(lambda: states().count("deferred") == SECRET_TASKS, 900, f"{SECRET_TASKS} tasks deferred at once")
    everyone = set(range(SECRET_TASKS))
    wait_until(lambda: api.deferrals_taken_in(run_id) >= everyone, 300, "the scheduler to take in every deferral")
    gate.touch()

    def done() -> list[dict[str, Any]] | None:
        assert triggerer.poll() is None, "the triggerer exited:\n" + api.component_log("triggerer")[-6000:]
        tis = api.task_instances(SECRETS, run_id)
        return tis if all(ti["state"] in TERMINAL_TI_STATES for ti in tis) else None

    tis = wait_until(done, 600, "every task to end")
    failed = sorted((ti["map_index"], ti["state"]) for ti in tis if ti["state"] != "success")
    assert not failed, (
        f"not successful: {failed}\n"
        + "\n".join(api.task_log(SECRETS, run_id, "job", 1, failed[0][0]))
        + api._known_races(run_id)
    )
    assert api.procs["triggerer"] is triggerer and triggerer.poll() is None
    assert psutil.pid_exists(triggerer.pid)
    triggerer_log = api.component_log("triggerer")
    for i in range(SECRET_TASKS):
        events = api.task_log(SECRETS, run_id, "job", 1, i)
        text = "\n".join(events)
        assert E2E_SETTING not in text and token not in text, f"task {i} shows a secret:\n{text}"
        # Each line once in the task's own log, the last one too: the trigger logs nothing in
        # the round that finds the job ended (the triggerer closes its log file then), the
        # resumed task does.
        for line in (f"[sh/0] job {i} started", f"[sh/0] job {i} password *** token ***"):
            elsewhere = " (it is in the triggerer's log)" if line in triggerer_log else ""
            assert events.count(line) == 1, f"task {i}: {line!r} {events.count(line)} times{elsewhere}:\n{text[-4000:]}"
    for name in COMPONENTS:
        assert E2E_SETTING not in api.component_log(name) and token not in api.component_log(name), name


@pytest.mark.torch
@pytest.mark.usefixtures("torch_venv")
def test_ddp_on_two_nodes_succeeds_with_every_ranks_lines_once(live_airflow: LiveAirflow) -> None:
    live, api = live_airflow, live_airflow.deployment
    run_id = live.trigger(DDP, {})
    try:
        api.wait_for_state(DDP, run_id, "job", {"success"}, timeout=300)
    except AssertionError as err:
        raise AssertionError(f"{err}\n{nodes_stderr(live.job_dir(live.app_handle(DDP, run_id)))}") from None
    events = live.log(DDP, run_id)
    ranks = [e for e in events if re.match(r"^\[ddp_train/[01]\] rank \d of 4: all_reduce sum 6$", e)]
    assert sorted(e.split("] ")[1] for e in ranks) == [f"rank {r} of 4: all_reduce sum 6" for r in range(4)], ranks
    for r in range(4):
        steps = [e for e in events if re.match(rf"^\[ddp_train/[01]\] rank {r} step \d loss ", e)]
        assert len(steps) == 3, steps  # the script's 3 steps, each line once


def test_marking_the_deferred_task_failed_cancels_its_job(live_airflow: LiveAirflow) -> None:
    """Runs last in this module: the marked task's trigger row is deleted while the trigger
    still runs, and Airflow 3.1 on SQLite hands that trigger id to the next deferral, whose task
    the old trigger's event then resumes (a later test's task left ``deferred`` early)."""
    live, api = live_airflow, live_airflow.deployment
    run_id = live.trigger(DEFERRED, {"lines": 600, "pause": 1, "replicas": 2})
    api.wait_for_state(DEFERRED, run_id, "job", {"deferred"})
    handle = live.app_handle(DEFERRED, run_id)
    live.wait_for_log(DEFERRED, run_id, "deferred")  # the trigger is watching the job
    procs = live.job_processes(handle)
    replicas = live.replica_processes(handle)
    assert {p.pid for p in procs} >= {pid for pid, _ in replicas} and len(replicas) == 2, procs

    api.set_state(DEFERRED, run_id, "job", "failed")
    marked = time.monotonic()
    try:
        wait_until(lambda: not still_running(procs), CANCEL_WITHIN, "the job's processes to end")
    except TimeoutError:
        pytest.fail(f"still running {CANCEL_WITHIN}s after the task was marked failed: {still_running(procs)}")
    assert not processes_of(live.job_dir(handle))
    print(f"job processes gone {time.monotonic() - marked:.1f}s after marking the task failed")
    assert live.job_state(handle)["state"] == "CANCELLED"
    assert api.task_instance(DEFERRED, run_id, "job")["state"] == "failed"
