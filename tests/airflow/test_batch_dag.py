"""The AWS Batch example DAG against the moto server, with jobs run as real Docker containers."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import pytest

pytestmark = [pytest.mark.airflow, pytest.mark.docker]


@pytest.mark.parametrize("deferrable", [pytest.param(False, id="worker"), pytest.param(True, id="deferred")])
def test_batch_dag_reads_its_queue_from_the_connection(
    run_dag: Any, aws_env: str, batch_queue: str, monkeypatch: pytest.MonkeyPatch, deferrable: bool
) -> None:
    extra = {"scheduler": "aws_batch", "cfg": f"queue={batch_queue}", "region_name": "us-east-1"}
    monkeypatch.setenv("AIRFLOW_CONN_TORCHX_BATCH", json.dumps({"conn_type": "torchx", "extra": extra}))
    monkeypatch.setenv("AIRFLOW_VAR_TORCHX_BATCH_IMAGE", "busybox:local")
    dag_run, out = run_dag("torchx_aws_batch", deferrable=deferrable)
    assert dag_run.state == "success", out[-5000:]
    handle = dag_run.get_task_instance("hello_batch").xcom_pull(task_ids="hello_batch")
    assert handle.startswith(f"aws_batch://torchx/{batch_queue}:"), handle
    assert "[sh/0] hello from AWS Batch node" in out  # moto: every node writes to one log stream
    ti = dag_run.get_task_instance("hello_batch")
    job_link = ti.xcom_pull(task_ids="hello_batch", key="_link_TorchXJobLink")
    assert job_link == f"/torchx/job?handle={quote(handle, safe='')}&conn_id=torchx_batch", job_link
    console = ti.xcom_pull(task_ids="hello_batch", key="_link_TorchXConsoleLink")
    assert console.startswith("https://us-east-1.console.aws.amazon.com/batch/"), console
