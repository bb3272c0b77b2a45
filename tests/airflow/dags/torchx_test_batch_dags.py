"""AWS Batch DAGs used only by the tests (copied into the test DAGs folder next to the examples)."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG

from airflow_provider_torchx.operators.torchx import TorchXRunOperator

with DAG(dag_id="torchx_test_batch_single", schedule=None, start_date=datetime(2024, 1, 1), catchup=False):
    # One role of one replica: a single-node (``type: container``) Batch job, the kind Spot and
    # Fargate queues run. The queue comes from the ``torchx_batch`` connection.
    TorchXRunOperator(
        task_id="single",
        torchx_conn_id="torchx_batch",
        component="utils.sh",
        component_args={
            "args": ["echo single-node replica ${replica_id} of role $TORCHX_ROLE_IDX"],
            "image": "{{ var.value.get('torchx_batch_image', 'busybox:latest') }}",
            "cpu": 1,
            "memMB": 256,
        },
        poll_interval=1,
    )
