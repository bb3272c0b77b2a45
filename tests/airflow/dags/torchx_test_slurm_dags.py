"""Slurm DAGs used only by the tests (copied into the test DAGs folder next to the examples).
Their job directory comes from the ``torchx_slurm_test`` connection."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG

from airflow_provider_torchx.operators.torchx import TorchXRunOperator


def slurm_dag(dag_id: str, task_id: str, command: str, gpu: int = 0, **kwargs: object) -> None:
    """A DAG of one task running ``command`` as two replicas, one per node of the test cluster
    (``gpu`` GPUs on each), with the operator's other ``kwargs``."""
    with DAG(dag_id=dag_id, schedule=None, start_date=datetime(2024, 1, 1), catchup=False):
        TorchXRunOperator(
            task_id=task_id,
            torchx_conn_id="torchx_slurm_test",
            component="utils.sh",
            component_args={"args": [command], "num_replicas": 2, "cpu": 1, "gpu": gpu, "memMB": 100},
            poll_interval=1,
            retries=0,
            **kwargs,  # type: ignore[arg-type]
        )


slurm_dag(
    "torchx_test_slurm", "hello", "echo hello from replica ${replica_id} of $TORCHX_ROLE_NAME on $SLURMD_NODENAME"
)
# Replica 1 fails with its own message; Slurm stops replica 0.
slurm_dag(
    "torchx_test_slurm_fail",
    "fail",
    'if [ ${replica_id} = 1 ]; then echo "rank 1 gives up" >&2; exit 3; fi; sleep 60',
)
# One GPU on each node: it waits while another job holds them, past its start_timeout.
slurm_dag("torchx_test_slurm_wait", "wait", "echo started", gpu=1, start_timeout=4)
# Prints the checkpoint location it was given (a path the nodes share, as job_dir).
slurm_dag("torchx_test_slurm_ckpt", "ckpt", 'echo "ckpt=$TORCHX_CHECKPOINT_DIR attempt=$TORCHX_ATTEMPT"')
