"""Example and test DAGs run with ``dag.test()`` on SQLite and the local scheduler, in both
waiting modes; the task output must hold every replica line exactly once."""

from __future__ import annotations

import getpass
import os
import re
import socket
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from airflow_provider_torchx.core.checkpoints import checkpoint_dir
from airflow_provider_torchx.core.identity import TaskIdentity
from airflow_provider_torchx.core.specs import AppState, AppStatus
from airflow_provider_torchx.watch import TaskWatcher
from tests.airflow.dags.torchx_test_dags import LINES_GATE_ENV
from tests.fixtures.airflow import EXAMPLE_DAGS, AirflowEnv, assert_lines_once

# airflow_line: the operator's whole path on each line's task runner (its exception classes, config).
pytestmark = [pytest.mark.airflow, pytest.mark.airflow_line]

MODES = [pytest.param(False, id="worker"), pytest.param(True, id="deferred")]


def task_states(dag_run: Any) -> dict[str, str]:
    return {f"{ti.task_id}[{ti.map_index}]": str(ti.state) for ti in dag_run.get_task_instances()}


def test_example_dags_import_without_errors(airflow_env: AirflowEnv) -> None:
    assert airflow_env.dagbag.import_errors == {}
    expected = {path.stem for path in EXAMPLE_DAGS.glob("*.py")}
    assert expected <= set(airflow_env.dagbag.dag_ids)


@pytest.mark.parametrize("deferrable", MODES)
def test_local_echo(run_dag: Any, deferrable: bool) -> None:
    dag_run, out = run_dag("torchx_local_echo", deferrable=deferrable)
    assert dag_run.state == "success", out[-4000:]
    assert_lines_once(out, [f"[echo/{k}] hello from TorchX in torchx_local_echo" for k in (0, 1)])
    ti = dag_run.get_task_instance("echo")
    handle = ti.xcom_pull(task_ids="echo")
    assert ti.xcom_pull(task_ids="echo", key="app_handle") == handle
    job_page = f"/torchx/job?handle={quote(handle, safe='')}&conn_id=torchx_default"  # the operator's connection
    assert ti.xcom_pull(task_ids="echo", key="_link_TorchXJobLink") == job_page
    assert ti.xcom_pull(task_ids="echo", key="_link_TorchXConsoleLink") == ""  # a local job has no console


@pytest.mark.parametrize("deferrable", MODES)
def test_local_distributed(run_dag: Any, deferrable: bool) -> None:
    dag_run, out = run_dag("torchx_local_distributed", deferrable=deferrable)
    assert dag_run.state == "success", out[-4000:]
    shard = dag_run.logical_date.strftime("%Y-%m-%d")
    expected = [f"[trainer/{k}] trainer {k} step {s}" for k in (0, 1) for s in (1, 2, 3)]
    assert_lines_once(out, [*expected, f"[reader/0] reader 0 read shard {shard}"])


@pytest.mark.parametrize("deferrable", MODES)
def test_submit_and_sense(run_dag: Any, deferrable: bool) -> None:
    dag_run, out = run_dag("torchx_local_submit_and_sense", deferrable=deferrable)
    assert dag_run.state == "success", out[-4000:]
    assert_lines_once(out, ["[sh/0] started", "[sh/0] finished"])
    handle = dag_run.get_task_instance("submit").xcom_pull(task_ids="submit")
    assert handle.startswith("local_cwd://")


@pytest.mark.parametrize("deferrable", MODES)
def test_mapped_sweep(run_dag: Any, deferrable: bool) -> None:
    dag_run, out = run_dag("torchx_local_sweep", deferrable=deferrable)
    assert dag_run.state == "success", out[-4000:]
    assert task_states(dag_run) == {f"sweep[{i}]": "success" for i in range(3)}
    lines = [f"[sh/0] training with lr {lr}" for lr in ("0.1", "0.01", "0.001")]
    assert_lines_once(out, lines, ordered=False)  # three jobs, each with its own sh/0
    handles = {ti.xcom_pull(task_ids="sweep", map_indexes=ti.map_index) for ti in dag_run.get_task_instances()}
    assert len(handles) == 3, handles


def test_dryrun_submits_nothing(run_dag: Any) -> None:
    dag_run, out = run_dag("torchx_dryrun")
    assert dag_run.state == "success", out[-4000:]
    rendered = dag_run.get_task_instance("spmd_dryrun").xcom_pull(task_ids="spmd_dryrun")
    assert isinstance(rendered, dict), rendered  # the rendered request, no json.loads needed
    assert "torchrun" in str(rendered["role_params"]) and "torchrun" in out
    assert "Submitted" not in out
    ti = dag_run.get_task_instance("spmd_dryrun")
    assert not ti.xcom_pull(task_ids="spmd_dryrun", key="_link_TorchXJobLink"), "a dry run has no job page"
    assert "XCom not found" not in out, "a link read a missing XCom"
    assert not [line for line in out.splitlines() if "[error" in line], out[-3000:]  # no "XCom not found"


def open_gate_on_running_note(monkeypatch: pytest.MonkeyPatch, gate: Path) -> None:
    """Let the replicas of ``torchx_test_lines`` write their last line (``LINES_GATE_ENV``) once
    the task's watcher, worker's or trigger's, has logged a RUNNING progress line."""
    noted = TaskWatcher._progress

    def progress(self: TaskWatcher, status: AppStatus, started_at: float | None) -> None:
        noted(self, status, started_at)
        if status.state == AppState.RUNNING:
            gate.touch()

    monkeypatch.setenv(LINES_GATE_ENV, str(gate))
    monkeypatch.setattr(TaskWatcher, "_progress", progress)


@pytest.mark.parametrize("deferrable", MODES)
def test_every_line_of_every_replica_once(
    run_dag: Any, deferrable: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    open_gate_on_running_note(monkeypatch, tmp_path / "gate")
    dag_run, out = run_dag("torchx_test_lines", deferrable=deferrable)
    assert dag_run.state == "success", out[-4000:]
    expected = [f"[{r}/{k}] {r} {k} line {i}" for r in ("trainer", "reader") for k in (0, 1) for i in range(1, 7)]
    assert_lines_once(out, expected)
    assert "RUNNING: replicas" in out  # a progress line


@pytest.mark.parametrize("deferrable", MODES)
def test_failing_job_fails_the_task_with_the_reason(run_dag: Any, deferrable: bool) -> None:
    dag_run, out = run_dag("torchx_test_fail", deferrable=deferrable)
    assert dag_run.state == "failed"
    assert task_states(dag_run) == {"fail[-1]": "failed"}
    assert "failed replica sh/0, exit code 3" in out
    assert "Last 20 log lines:\nout 6\n" in out and "\nout 25" in out


@pytest.mark.parametrize("deferrable", MODES)
def test_timeout_cancels_the_job(run_dag: Any, deferrable: bool) -> None:
    from airflow_provider_torchx.core.runner import get_runner
    from airflow_provider_torchx.core.specs import AppState

    dag_run, out = run_dag("torchx_test_timeout", deferrable=deferrable)
    assert dag_run.state == "failed"
    assert re.search(r"did not end within 2s \(still (PENDING|RUNNING)\); cancelled it", out), out[-3000:]
    handle = re.search(r"Submitted (local_cwd://\S+)", out)
    assert handle, out[-3000:]
    runner = get_runner()
    status = runner.wait(handle.group(1), wait_interval=0.2, timeout=30, cancel_on_signal=False)
    assert status is not None and status.state == AppState.CANCELLED


@pytest.mark.parametrize("deferrable", MODES)
def test_root_cause_heads_the_error_of_a_failed_torchrun_job(run_dag: Any, deferrable: bool) -> None:
    dag_run, out = run_dag("torchx_test_root_cause", deferrable=deferrable)
    assert dag_run.state == "failed"
    root = "Root cause (rank 1, replica trainer/0, exit code 1): RuntimeError: boom on rank 1"
    error = out[out.index(root) :]  # the task's error starts with the root cause, then the rest
    assert re.match(re.escape(root) + r"\n  Last frames of its traceback:\n(  .*\n)+TorchX job \S+ ended FAILED", error)
    assert 'raise RuntimeError(f"boom on rank {rank}")' in error


def test_config_error_fails_the_task_without_retries(run_dag: Any) -> None:
    dag_run, out = run_dag("torchx_test_config_error")
    ti = dag_run.get_task_instance("misspelled")
    assert (str(ti.state), ti.try_number) == ("failed", 1), out[-3000:]
    assert out.count("unrecognized arguments: --mgs") == 1, out[-3000:]
    assert "`airflow-torchx builtins utils.echo` prints the component's arguments" in out
    assert "usage:" not in out and "The above exception was the direct cause" not in out
    assert "XCom not found" not in out


def test_a_cancel_from_outside_fails_the_task_without_retry_unless_asked(run_dag: Any) -> None:
    dag_run, out = run_dag("torchx_test_outside_cancel")
    tries = {ti.task_id: (str(ti.state), ti.try_number) for ti in dag_run.get_task_instances()}
    assert tries == {"worker": ("failed", 1), "deferred": ("failed", 1), "retried": ("failed", 2)}, out[-3000:]
    by = f"airflow-torchx cancel by {getpass.getuser()}@{socket.gethostname()}"
    outside = f"The job was cancelled from outside this task, by {by}: not retried"
    assert out.count(outside) == 2, out[-3000:]
    # Each of the four tries' failures says it, and so does the deferred task's trigger, which
    # found its job cancelled (its last word in the task log, docs/architecture.md).
    assert out.count(f"ended CANCELLED: cancelled by request: {by}") == 5, out[-3000:]


BAD_DAG = """
from datetime import datetime
from airflow.sdk import DAG
from airflow_provider_torchx.core.specs import AppDef, Resource, Role
from airflow_provider_torchx.operators.torchx import TorchXRunOperator

with DAG(dag_id="bad", schedule=None, start_date=datetime(2024, 1, 1)):
    TorchXRunOperator(task_id="t", {arguments})
"""


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ('component="utils.ehco", scheduler="local_cwd"', "unknown component 'utils.ehco'. Did you mean utils.echo or"),
        ('component="utils.echo", scheduler="local_cdw"', "unknown scheduler 'local_cdw'; known: "),
        ('component="utils.echo", scheduler="local_cwd", cfg={"log_dri": "/tmp"}', "Did you mean 'log_dir'?"),
        ('component="utils.echo", component_args={"mgs": "hi"}', "unknown argument 'mgs'; arguments: msg, image"),
        ('component="dist.spmd", component_args=["--scirpt", "t.py"]', "--scirpt. Did you mean '--script'"),
        ('component="dist.spmd", component_args={"cpu": "two"}', "--cpu: 'two' is not a valid int"),
        (
            'app=AppDef(name="a", roles=[Role(name="r", image="i", entrypoint="x", '
            "resource=Resource(cpu=-5, gpu=0, memMB=1024))])",
            "roles[0].resource.cpu: -5",
        ),
    ],
    ids=["component", "scheduler", "cfg", "args-dict", "args-list", "args-type", "app"],
)
def test_literal_mistakes_are_import_errors_of_the_dag(
    airflow_env: AirflowEnv, tmp_path: Path, arguments: str, error: str
) -> None:
    (tmp_path / "bad_dag.py").write_text(BAD_DAG.format(arguments=arguments))
    import_errors = type(airflow_env.dagbag)(str(tmp_path)).import_errors
    assert len(import_errors) == 1
    assert error in next(iter(import_errors.values()))


def test_a_retry_gets_the_same_checkpoint_dir_and_the_next_attempt(run_dag: Any) -> None:
    """The first job fails twice (its local restart says why in the task log), the task's retry
    submits a job that goes on counting (attempt 2) in the same location: the local default root
    (``checkpoints/`` beside the job store). The log, the usage summary and XCom name it."""
    dag_run, out = run_dag("torchx_test_resume", deferrable=True)
    ti = dag_run.get_task_instance("resume")
    assert (str(ti.state), ti.try_number) == ("success", 2), out[-3000:]
    location = ti.xcom_pull(task_ids="resume", key="checkpoint_dir")
    root = Path(os.environ["AIRFLOW_TORCHX_STATE_DIR"]) / "checkpoints"
    assert location == checkpoint_dir(str(root), TaskIdentity("torchx_test_resume", "resume", dag_run.run_id))
    for attempt in (0, 1, 2):
        assert f"[sh/0] dir={location} attempt={attempt}" in out, out[-3000:]
    restarted = "[airflow-torchx] restarted as TORCHX_ATTEMPT 1: role 'sh' replica 0 exited with code 3; restart 1/1"
    assert f"[sh/0] {restarted}" in out, out[-3000:]
    assert "resumed from step 2" in out
    assert out.count(f"Checkpoints of this task instance: {location}") == 2
    assert f"Checkpoints: {location}" in out  # the usage summary
