"""Data-parallel PyTorch training on a Slurm cluster: ``dist.spmd`` runs ``scripts/ddp_train.py``
through ``torchrun`` on 2 nodes x 1 process, one Slurm task per node, meeting at rank 0's node
on a rendezvous port of the job's own.

The partition and the shared job directory come from a connection; create it once (see
docs/schedulers.md, "slurm": the Airflow hosts need Slurm's client commands, ``SLURM_CONF`` and
munge, and ``job_dir`` on a file system they share with the nodes)::

    airflow connections add torchx_slurm --conn-type torchx \\
        --conn-extra '{"scheduler": "slurm", "cfg": "job_dir=/shared/torchx-jobs,partition=gpu,time=1:00:00"}'

``torchrun`` must be on the nodes' ``PATH`` (the replicas run on the nodes' own software), and
the script at the same path there (a shared file system). For GPUs, set ``gpu=`` per node.
"""

from __future__ import annotations

import os
from datetime import datetime

from airflow.sdk import DAG

from airflow_provider_torchx.operators.torchx import TorchXRunOperator

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "ddp_train.py")

with DAG(
    dag_id="torchx_slurm_ddp",
    schedule=None,
    start_date=datetime(2024, 1, 1),
    catchup=False,
    tags=["torchx", "example", "pytorch", "slurm"],
):
    TorchXRunOperator(
        task_id="train",
        torchx_conn_id="torchx_slurm",
        component="dist.spmd",
        component_args={"script": SCRIPT, "j": "2x1", "cpu": 1, "memMB": 1000, "script_args": ["--steps", "3"]},
        poll_interval=5,
    )
