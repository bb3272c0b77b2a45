"""The DAG of the refused-record live test (``tests/e2e/test_live_escape.py``; its deployment
fakes a 4-GPU host with ``AIRFLOW_TORCHX_LOCAL_GPUS``).

``job`` (deferred, a look a second) runs on 2 GPUs under a GPU budget far above what the test
lets it use, with retries allowed that must not submit a second job: the test swaps its job's
``state.json`` (or its directory) for a symbolic link while it runs.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_provider_torchx.operators.torchx import TorchXRunOperator

with DAG(dag_id="torchx_e2e_escape", schedule=None, start_date=datetime(2024, 1, 1), catchup=False):
    TorchXRunOperator(
        task_id="job",
        component="utils.sh",
        component_args={"args": ["echo 'r0 line 1'; sleep 600"], "gpu": 2, "memMB": 64},
        scheduler="local_cwd",
        cfg={"auto_set_cuda_visible_devices": True},
        deferrable=True,
        poll_interval=1,
        max_gpu_hours=1.0,
        retries=2,
        retry_delay=timedelta(seconds=1),
    )
