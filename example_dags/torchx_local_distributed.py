"""A two-role local job built as an ``AppDef``: two ``trainer`` replicas and one ``reader``.

Each replica runs a shell command; ``${replica_id}`` (``macros.replica_id``) is substituted by
the scheduler. The task log interleaves the roles, each line prefixed ``[role/replica]``.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG

from airflow_provider_torchx.core.specs import AppDef, Role, macros
from airflow_provider_torchx.operators.torchx import TorchXRunOperator


def shell_role(name: str, num_replicas: int, script: str) -> Role:
    """A role of ``num_replicas`` processes running ``script`` under ``sh -c``."""
    return Role(name=name, image="local", entrypoint="sh", args=["-c", script], num_replicas=num_replicas)


app = AppDef(
    name="two-roles",
    roles=[
        shell_role("trainer", 2, f"for step in 1 2 3; do echo trainer {macros.replica_id} step $step; done"),
        shell_role("reader", 1, f"echo reader {macros.replica_id} read shard $SHARD"),
    ],
)

with DAG(
    dag_id="torchx_local_distributed",
    schedule=None,
    start_date=datetime(2024, 1, 1),
    catchup=False,
    tags=["torchx", "example"],
):
    TorchXRunOperator(
        task_id="train",
        app=app,
        env={"SHARD": "{{ ds }}"},
        scheduler="local_cwd",
        poll_interval=1,
    )
