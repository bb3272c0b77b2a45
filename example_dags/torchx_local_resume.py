"""Resume, not restart: DDP training that goes on from its last checkpoint after a reclaim.

``scripts/ddp_resume.py`` runs on 2 nodes x 2 processes (gloo, CPU). Every replica gets
``TORCHX_CHECKPOINT_DIR``, the task instance's checkpoint location (here under the default
root: ``checkpoints/`` beside the local job store; set ``checkpoint_root=`` or the connection's
``checkpoint_root`` to put it elsewhere), and ``TORCHX_ATTEMPT``. Rank 0 saves a checkpoint
every 2 steps; on the first attempt it SIGKILLs its node's ``torchrun`` after step 4, as a
host reclaim would. The local scheduler restarts the job (``max_retries=1``) with the same
location and ``TORCHX_ATTEMPT=1``, and every rank logs ``resumed from step 4`` and finishes at
step 6. Were the job's own retries spent, the task's retry (``retries=1``) would resume the
same way. The checkpoints stay after the task succeeds: ``airflow-torchx prune --checkpoints``
removes them with the jobs (docs/checkpoints.md).

``torchrun`` must be on the worker's ``PATH`` (see ``torchx_local_ddp``).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_provider_torchx.operators.torchx import TorchXRunOperator

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "ddp_resume.py")

with DAG(
    dag_id="torchx_local_resume",
    schedule=None,
    start_date=datetime(2024, 1, 1),
    catchup=False,
    tags=["torchx", "example", "pytorch", "checkpoint"],
):
    TorchXRunOperator(
        task_id="train",
        component="dist.spmd",
        component_args={
            "script": SCRIPT,
            "j": "2x2",
            "max_retries": 1,
            "script_args": ["--steps", "6", "--save-every", "2", "--reclaim-at", "4"],
        },
        scheduler="local_cwd",
        retries=1,
        retry_delay=timedelta(seconds=5),
        poll_interval=2,
    )
