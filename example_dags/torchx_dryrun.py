"""Dry runs: render the scheduler's native request into the task log and XCom, submit nothing.

``dist.spmd`` renders a ``torchrun`` command (torchrun need not be installed for a dry run).
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG

from airflow_provider_torchx.operators.torchx import TorchXRunOperator

with DAG(
    dag_id="torchx_dryrun",
    schedule=None,
    start_date=datetime(2024, 1, 1),
    catchup=False,
    tags=["torchx", "example"],
):
    TorchXRunOperator(
        task_id="spmd_dryrun",
        component="dist.spmd",
        component_args=["-j", "2x2", "--script", "train.py", "--", "--lr", "0.1"],
        scheduler="local_cwd",
        dryrun=True,
    )
