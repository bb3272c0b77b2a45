"""Slurm DAGs used only by the tests (copied into the test DAGs folder next to the examples)."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG

from airflow_provider_torchx.operators.torchx import TorchXRunOperator

with DAG(dag_id="torchx_test_slurm", schedule=None, start_date=datetime(2024, 1, 1), catchup=False):
    # Two replicas, one per node of the test cluster; the job directory comes from the
    # ``torchx_slurm_test`` connection.
    TorchXRunOperator(
        task_id="hello",
        torchx_conn_id="torchx_slurm_test",
        component="utils.sh",
        component_args={
            "args": ["echo hello from replica ${replica_id} of $TORCHX_ROLE_NAME on $SLURMD_NODENAME"],
            "num_replicas": 2,
            "cpu": 1,
            "memMB": 100,
        },
        poll_interval=1,
    )

with DAG(dag_id="torchx_test_slurm_fail", schedule=None, start_date=datetime(2024, 1, 1), catchup=False):
    # Replica 1 fails with its own message; Slurm stops replica 0.
    TorchXRunOperator(
        task_id="fail",
        torchx_conn_id="torchx_slurm_test",
        component="utils.sh",
        component_args={
            "args": ['if [ ${replica_id} = 1 ]; then echo "rank 1 gives up" >&2; exit 3; fi; sleep 60'],
            "num_replicas": 2,
            "cpu": 1,
            "memMB": 100,
        },
        poll_interval=1,
        retries=0,
    )
