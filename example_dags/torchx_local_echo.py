"""The README's main job: echo a message from two local replicas.

Runs on the local scheduler (``local_cwd``: each replica is a process on this host), so it needs
no connection and no cluster: ``airflow dags test torchx_local_echo``. The task log shows each
replica's output as ``[echo/0] ...`` and ``[echo/1] ...``.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG

from airflow_provider_torchx.operators.torchx import TorchXRunOperator

with DAG(
    dag_id="torchx_local_echo",
    schedule=None,
    start_date=datetime(2024, 1, 1),
    catchup=False,
    tags=["torchx", "example"],
):
    TorchXRunOperator(
        task_id="echo",
        component="utils.echo",
        component_args={"msg": "hello from TorchX in {{ dag.dag_id }}", "num_replicas": 2},
        scheduler="local_cwd",
        poll_interval=1,
    )
