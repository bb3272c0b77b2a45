"""A capacity ladder: the training goes where it can run now, and resumes there.

``torchx_conn_id`` lists four ``torchx`` connections, tried in order (docs/operators.md,
"Capacity ladder"): the team's GPU box (local), the Slurm cluster, an AWS Batch Spot queue, an
AWS Batch on-demand queue. The job moves down when it has not started within a rung's
``start_timeout`` (the connection's extra, else the task's), or after a rung's
``max_infra_failures`` failures of kind ``infra``/``capacity`` (Spot reclaims); it never moves on
an app or config failure. Every rung checkpoints in one place, here ``/shared/ckpt``: a file
system the box, the Slurm nodes and the Batch instances (EFS) all mount at that path, bind-mounted
into the job (``mounts``), so the job resumes from its last checkpoint wherever it lands.

Create the connections once (see docs/connection.md)::

    airflow connections add torchx_box --conn-type torchx \\
        --conn-extra '{"scheduler": "local_cwd", "cfg": "auto_set_cuda_visible_devices=True", "start_timeout": 600}'
    airflow connections add torchx_slurm --conn-type torchx \\
        --conn-extra '{"scheduler": "slurm", "cfg": "job_dir=/shared/torchx-jobs,partition=gpu", "start_timeout": 1800}'
    airflow connections add torchx_batch_spot --conn-type torchx \\
        --conn-extra '{"scheduler": "aws_batch", "cfg": "queue=gpu-spot,retry_on=infra", "start_timeout": 900,
                       "max_infra_failures": 3, "region_name": "us-east-1"}'
    airflow connections add torchx_batch_ondemand --conn-type torchx \\
        --conn-extra '{"scheduler": "aws_batch", "cfg": "queue=gpu-ondemand", "region_name": "us-east-1"}'

The script reads ``TORCHX_CHECKPOINT_DIR`` and ``TORCHX_ATTEMPT`` (docs/checkpoints.md). XCom
``ladder`` lists each rung tried: its connection, job, outcome and why it moved.
"""

from __future__ import annotations

import os
from datetime import datetime

from airflow.sdk import DAG

from airflow_provider_torchx.operators.torchx import TorchXRunOperator

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "ddp_train.py")
SHARED = "/shared/ckpt"

with DAG(
    dag_id="torchx_ladder",
    schedule=None,
    start_date=datetime(2024, 1, 1),
    catchup=False,
    tags=["torchx", "example", "pytorch", "ladder"],
):
    TorchXRunOperator(
        task_id="train",
        torchx_conn_id=["torchx_box", "torchx_slurm", "torchx_batch_spot", "torchx_batch_ondemand"],
        component="dist.spmd",
        component_args={
            "script": SCRIPT,
            "j": "1x2",
            "gpu": 2,
            "memMB": 8000,
            "mounts": ["type=bind", f"src={SHARED}", f"dst={SHARED}"],
            "script_args": ["--steps", "1000"],
        },
        checkpoint_root=SHARED,
        start_timeout=1200,  # for the rungs whose connection sets none
        poll_interval=30,
    )
