"""The usage report of real ``dag.test()`` runs (``tests/airflow/dags/torchx_usage_dags.py``):
the task log block and the XCom ``usage`` of a job of known duration and resources, of a
failed job and of a sensor; Airflow metrics reaching a StatsD listener on loopback (none when
metrics are off); and the OpenLineage events the OpenLineage provider emits through its file
transport. Runs with metrics or OpenLineage on use a fresh process (Airflow reads its
configuration once per process)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.airflow import REPO, AirflowEnv

pytestmark = pytest.mark.airflow

DAG_ID = "torchx_test_usage"


@pytest.fixture
def statsd_listener() -> Iterator[socket.socket]:
    """A UDP socket on 127.0.0.1 standing in for a StatsD server."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    yield sock
    sock.close()


def received(sock: socket.socket) -> list[str]:
    """Every StatsD line received so far."""
    lines: list[str] = []
    while True:
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            return lines
        lines += data.decode().splitlines()


def check_train_usage(usage: dict[str, Any]) -> None:
    """Two replicas of ``sleep 1`` asking 2 vCPUs, 1 GPU and 2 GiB each."""
    assert usage["attempts_count"] == 2
    assert [a["exit_code"] for a in usage["attempts"]] == [0, 0]
    assert 2.0 <= usage["node_seconds"] < 6.0  # upper bounds: room for a loaded machine
    assert usage["vcpu_hours"] == pytest.approx(2 * usage["node_seconds"] / 3600)
    assert usage["gpu_hours"] == pytest.approx(usage["node_seconds"] / 3600)
    assert usage["memory_gb_hours"] == pytest.approx(2 * usage["node_seconds"] / 3600)
    assert 1.0 <= usage["run_time_s"] < 4.0
    assert 0.0 <= usage["queue_wait_s"] < 4.0


#: The rates the runs below price their jobs at: a replica of ``train`` (1 GPU, 2 vCPUs,
#: 2 GiB) costs 1 x 3.0 + 2 x 0.5 + 2 x 0.25 = 4.5 US dollars an hour.
RATES = {"gpu_hour": 3.0, "vcpu_hour": 0.5, "memory_gb_hour": 0.25}


def check_train_cost(usage: dict[str, Any]) -> None:
    """The job's dollars are its replicas' seconds times what a replica costs an hour."""
    assert usage["rates"] == RATES
    assert usage["cost_usd"] == pytest.approx(usage["node_seconds"] / 3600 * 4.5)
    assert [a["cost_usd"] for a in usage["attempts"]] == [
        pytest.approx((a["ended"] - a["started"]) / 3600 * 4.5) for a in usage["attempts"]
    ]


def test_usage_in_log_and_xcom_and_no_metrics_when_off(
    run_dag: Any, statsd_listener: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = statsd_listener.getsockname()[1]
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_ON", "False")
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_HOST", "127.0.0.1")
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_PORT", str(port))
    monkeypatch.setenv("AIRFLOW__TORCHX__RATES", json.dumps(RATES))
    dag_run, output = run_dag(DAG_ID)
    ti = dag_run.get_task_instance("train")
    train = ti.xcom_pull(task_ids="train", key="usage")
    check_train_usage(train)
    check_train_cost(train)
    assert f"GB-h memory, ${train['cost_usd']:.2f}\n" in output, output[-3000:]
    fail = ti.xcom_pull(task_ids="fail", key="usage")
    assert [(a["role"], a["exit_code"]) for a in fail["attempts"]] == [("sh", 3)]
    watch = ti.xcom_pull(task_ids="watch", key="usage")
    assert watch["attempts_count"] == 1 and watch["attempts"][0]["exit_code"] == 0
    assert ti.xcom_pull(task_ids="submit", key="usage") is None  # not waited for: not ended
    # one readable block per ended job, success and failure alike
    assert output.count("Usage:") == 3, output[-3000:]
    assert "sleeper: 2 replica(s)" in output and "sh[0] #1:" in output and "exit 3" in output
    assert received(statsd_listener) == []


@pytest.mark.airflow_line  # each line's metrics client (_compat.stats)
def test_metrics_and_openlineage_events(
    airflow_env: AirflowEnv, statsd_listener: socket.socket, tmp_path: Path
) -> None:
    events_file = tmp_path / "openlineage.jsonl"
    env = {
        **os.environ,
        "AIRFLOW__METRICS__STATSD_ON": "True",
        "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
        "AIRFLOW__METRICS__STATSD_PORT": str(statsd_listener.getsockname()[1]),
        "AIRFLOW__METRICS__STATSD_PREFIX": "airflow",
        "AIRFLOW__METRICS__STATSD_INFLUXDB_ENABLED": "True",  # tags on the wire
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(
            {"type": "file", "log_file_path": str(events_file), "append": True}
        ),
        "AIRFLOW__OPENLINEAGE__NAMESPACE": "torchx-tests",
        "AIRFLOW__TORCHX__RATES": json.dumps(RATES),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "tests.airflow.run_dag_subprocess", "torchx_usage_dags.py", DAG_ID],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    result_line = next((x[x.index("RESULT ") :] for x in proc.stdout.splitlines() if "RESULT " in x), None)
    assert result_line is not None, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(result_line[len("RESULT ") :])
    assert result["train"]["state"] == "success" and result["fail"]["state"] == "failed"
    check_train_usage(result["train"]["usage"])

    # metrics: run time, queue wait, GPU-hours, attempts, tagged
    ours = [line for line in received(statsd_listener) if line.startswith("airflow.torchx.")]
    train_tags = "scheduler=local_cwd,dag_id=torchx_test_usage,task_id=train,app_name=sleepers"
    by_name = {line.split(":")[0]: line for line in ours}
    duration = by_name[f"airflow.torchx.job.duration,{train_tags}"]
    assert duration.endswith("|ms")
    assert float(duration.split(":")[1].split("|")[0]) == pytest.approx(
        result["train"]["usage"]["run_time_s"] * 1000, rel=1e-4
    )
    assert f"airflow.torchx.job.queue_wait,{train_tags}" in by_name
    gpu = by_name[f"airflow.torchx.job.gpu_hours,{train_tags}"]
    assert float(gpu.split(":")[1].split("|")[0]) == pytest.approx(result["train"]["usage"]["gpu_hours"], rel=1e-3)
    assert by_name[f"airflow.torchx.job.attempts,{train_tags}"].split(":")[1] == "2|g"
    cost = by_name[f"airflow.torchx.job.cost_usd,{train_tags}"]
    assert float(cost.split(":")[1].split("|")[0]) == pytest.approx(result["train"]["usage"]["cost_usd"], rel=1e-3)
    check_train_cost(result["train"]["usage"])
    assert any(",task_id=fail" in name and "attempts" in name for name in by_name), sorted(by_name)
    # the failed job's kind: in its usage XCom and as the failure counter's tag
    assert result["fail"]["usage"]["failure_kind"] == "app"
    assert "failure_kind" not in result["train"]["usage"]
    failed = "airflow.torchx.job.failed,scheduler=local_cwd,dag_id=torchx_test_usage,task_id=fail,kind=app"
    assert by_name[failed].split(":")[1].startswith("1|c"), sorted(by_name)
    assert any(",task_id=watch" in name and "duration" in name for name in by_name), sorted(by_name)

    # OpenLineage: START and COMPLETE of `train`, FAIL of `fail`, with our facets
    events = [json.loads(line) for line in events_file.read_text().splitlines()]
    by_task = {}
    for ev in events:
        by_task.setdefault(ev["job"]["name"], []).append(ev)
    train_events = {ev["eventType"]: ev for ev in by_task[f"{DAG_ID}.train"]}
    start, complete = train_events["START"], train_events["COMPLETE"]
    job_facet = start["job"]["facets"]["torchx_job"]
    assert job_facet["app_name"] == "sleepers" and job_facet["scheduler"] == "local_cwd"
    assert job_facet["images"] == ["local"]
    assert job_facet["roles"] == [
        {"name": "sleeper", "image": "local", "num_replicas": 2, "cpu": 2, "gpu": 1, "memMB": 2048}
    ]
    assert [(d["namespace"], d["name"]) for d in start["inputs"]] == [("file", "/data/torchx-usage/input.csv")]
    checkpoints = result["train"]["usage"]["checkpoint_dir"]  # the task instance's, an output too
    assert "/checkpoints/torchx_test_usage/" in checkpoints and checkpoints.endswith("/train"), checkpoints
    assert [(d["namespace"], d["name"]) for d in complete["outputs"]] == [
        ("file", "/data/torchx-usage/model.pt"),
        ("file", checkpoints),
    ]
    run_facet = complete["run"]["facets"]["torchx_run"]
    assert run_facet["app_handle"] == complete["job"]["facets"]["torchx_job"]["app_handle"]
    assert run_facet["app_handle"].startswith("local_cwd://")
    assert run_facet["state"] == "SUCCEEDED"
    assert run_facet["usage"]["attempts_count"] == 2
    assert run_facet["usage"]["node_seconds"] == pytest.approx(result["train"]["usage"]["node_seconds"])
    assert run_facet["usage"]["cost_usd"] == pytest.approx(result["train"]["usage"]["cost_usd"])
    fail_events = {ev["eventType"]: ev for ev in by_task[f"{DAG_ID}.fail"]}
    failed = fail_events["FAIL"]["run"]["facets"]["torchx_run"]
    assert failed["state"] == "FAILED" and failed["usage"]["attempts"][0]["exit_code"] == 3


_WITHOUT_OPENLINEAGE = """
import importlib.abc, json, sys

# Airflow's provider discovery still reads the installed provider's info: allow only that.
INFO = ("airflow.providers.openlineage", "airflow.providers.openlineage.get_provider_info")

class BlockOpenLineage(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in INFO and name.startswith(("openlineage", "airflow.providers.openlineage")):
            raise ImportError(f"not installed in this test: {name}")
        return None

sys.meta_path.insert(0, BlockOpenLineage())
from airflow_provider_torchx.operators.torchx import TorchXRunOperator
from tests.airflow.helpers import FakeTI

ti = FakeTI()
op = TorchXRunOperator(task_id="t", component="utils.echo", scheduler="local_cwd", poll_interval=0.2, deferrable=False)
handle = op.execute({"ti": ti})
loaded = [m for m in sys.modules if "openlineage" in m and m not in INFO]
print(json.dumps([handle, ti.xcoms["usage"]["attempts_count"], loaded]))
"""


def test_works_without_the_openlineage_provider(airflow_env: AirflowEnv) -> None:
    """With the OpenLineage provider and client unimportable, a task runs and reports its usage
    as before, and nothing tries to import them."""
    out = subprocess.run(
        [sys.executable, "-c", _WITHOUT_OPENLINEAGE], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    handle, attempts, loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert handle.startswith("local_cwd://") and attempts == 1
    assert loaded == []


@pytest.mark.airflow_line  # each line's metrics client (_compat.stats)
def test_an_orphan_cancel_is_counted_with_its_reason(statsd_listener: socket.socket) -> None:
    """``torchx.job.orphan_cancelled`` through Airflow's stats client (a fresh process: the
    client reads ``[metrics]`` once), tagged with the scheduler, DAG, task and reason."""
    env = {
        **os.environ,
        "AIRFLOW__METRICS__STATSD_ON": "True",
        "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
        "AIRFLOW__METRICS__STATSD_PORT": str(statsd_listener.getsockname()[1]),
        "AIRFLOW__METRICS__STATSD_PREFIX": "airflow",
        "AIRFLOW__METRICS__STATSD_INFLUXDB_ENABLED": "True",
    }
    code = (
        "from airflow_provider_torchx.metrics import emit_orphan_cancelled; "
        "emit_orphan_cancelled(scheduler='local_cwd', dag_id='acc', task_id='job', reason='task_failed')"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, check=True, timeout=120)
    lines = received(statsd_listener)
    want = "airflow.torchx.job.orphan_cancelled,scheduler=local_cwd,dag_id=acc,task_id=job,reason=task_failed:1|c"
    assert want in lines, lines
