"""The DAG of the checkpoint prune's live test (``tests/e2e/test_live_prune.py``): ``job``
saves a checkpoint in its ``TORCHX_CHECKPOINT_DIR`` (the default root beside the job store),
then exits with ``params.code``; a failed try is retried only after ten minutes, so the task
instance stays ``up_for_retry`` for the whole test.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_provider_torchx.operators.torchx import TorchXRunOperator

SAVES = 'mkdir -p "$TORCHX_CHECKPOINT_DIR" && echo 1 > "$TORCHX_CHECKPOINT_DIR/step-1"; exit {{ params.code }}'

with DAG(dag_id="torchx_e2e_prune", schedule=None, start_date=datetime(2024, 1, 1), catchup=False, params={"code": 0}):
    TorchXRunOperator(
        task_id="job",
        component="utils.sh",
        component_args={"args": [SAVES], "memMB": 64},
        scheduler="local_cwd",
        deferrable=False,
        poll_interval=0.5,
        retries=1,
        retry_delay=timedelta(minutes=10),
    )
