"""A small hyper-parameter sweep with dynamic task mapping: one job per learning rate.

Each mapped task instance submits its own job (labelled with its map index) and reports it.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG

from airflow_provider_torchx.operators.torchx import TorchXRunOperator

LEARNING_RATES = ["0.1", "0.01", "0.001"]

with DAG(
    dag_id="torchx_local_sweep",
    schedule=None,
    start_date=datetime(2024, 1, 1),
    catchup=False,
    tags=["torchx", "example"],
):
    TorchXRunOperator.partial(
        task_id="sweep",
        component="utils.sh",
        scheduler="local_cwd",
        poll_interval=1,
    ).expand(component_args=[["echo", "training with lr", lr] for lr in LEARNING_RATES])
