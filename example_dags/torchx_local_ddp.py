"""Data-parallel PyTorch training on one box: ``dist.spmd`` runs ``scripts/ddp_train.py``
through ``torchrun`` on 2 nodes x 2 processes (4 ranks, gloo on the CPU).

``torchrun`` must be on the worker's ``PATH`` (PyTorch is not a dependency of this provider;
give ``env={"PATH": ...}`` to use a virtualenv of its own). The local scheduler gives the job a
rendezvous port of its own, so any number of such jobs run side by side. For GPUs, set
``gpu=`` per node and ``cfg={"auto_set_cuda_visible_devices": True}``: the host's GPU ledger
hands each job its own devices (see docs/training-box.md).
"""

from __future__ import annotations

import os
from datetime import datetime

from airflow.sdk import DAG

from airflow_provider_torchx.operators.torchx import TorchXRunOperator

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "ddp_train.py")

with DAG(
    dag_id="torchx_local_ddp",
    schedule=None,
    start_date=datetime(2024, 1, 1),
    catchup=False,
    max_active_tasks=2,
    tags=["torchx", "example", "pytorch"],
):
    TorchXRunOperator(
        task_id="train",
        component="dist.spmd",
        component_args={"script": SCRIPT, "j": "2x2", "script_args": ["--steps", "3"]},
        scheduler="local_cwd",
        poll_interval=2,
    )
