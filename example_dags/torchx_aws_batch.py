"""Run a job on AWS Batch; the queue and the other run options come from a connection.

Create the connection once (see docs/connection.md)::

    airflow connections add torchx_batch --conn-type torchx \
        --conn-extra '{"scheduler": "aws_batch", "cfg": "queue=torchx-queue", "region_name": "us-east-1"}'

The image is read from the Airflow Variable ``torchx_batch_image`` (default ``busybox:latest``).
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG

from airflow_provider_torchx.operators.torchx import TorchXRunOperator

with DAG(
    dag_id="torchx_aws_batch",
    schedule=None,
    start_date=datetime(2024, 1, 1),
    catchup=False,
    tags=["torchx", "example", "aws"],
):
    TorchXRunOperator(
        task_id="hello_batch",
        torchx_conn_id="torchx_batch",
        component="utils.sh",
        component_args={
            "args": ["echo", "hello from AWS Batch node $AWS_BATCH_JOB_NODE_INDEX"],
            "image": "{{ var.value.get('torchx_batch_image', 'busybox:latest') }}",
            "num_replicas": 2,
            "cpu": 1,
            "memMB": 256,
        },
        poll_interval=5,
    )
