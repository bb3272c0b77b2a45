"""DAGs of the guardrails' live tests (``tests/e2e/test_live_local.py``; the deployment fakes
a 2-GPU host with ``AIRFLOW_TORCHX_LOCAL_GPUS``).

``torchx_e2e_guard_start``: ``holder`` submits a job holding both GPUs until the file
``params.gate`` exists and returns at once; then ``job`` (deferred) waits for a GPU and trips
``start_timeout``. ``torchx_e2e_guard_budget``: ``job`` (deferred) runs on both GPUs and trips
``max_gpu_hours`` (a few seconds' worth). Both ``job`` tasks allow a retry that a guard must
not use.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_provider_torchx.operators.torchx import TorchXRunOperator

START = datetime(2024, 1, 1)
#: The GPU ledger hands devices out only with this run option.
GPU_CFG = {"auto_set_cuda_visible_devices": True}
#: Seconds of two GPUs the budget DAG's job may use.
BUDGET_SECONDS = 4

with DAG(dag_id="torchx_e2e_guard_start", schedule=None, start_date=START, catchup=False, params={"gate": ""}):
    holder = TorchXRunOperator(
        task_id="holder",
        component="utils.sh",
        component_args={"args": ['while [ ! -e "{{ params.gate }}" ]; do sleep 0.2; done'], "gpu": 2, "memMB": 64},
        scheduler="local_cwd",
        cfg=GPU_CFG,
        wait_for_completion=False,
    )
    waiter = TorchXRunOperator(
        task_id="job",
        component="utils.sh",
        component_args={"args": ["echo never printed"], "gpu": 1, "memMB": 64},
        scheduler="local_cwd",
        cfg=GPU_CFG,
        deferrable=True,
        poll_interval=1,
        start_timeout=timedelta(seconds=5),
        retries=1,
        retry_delay=timedelta(seconds=1),
    )
    holder >> waiter

with DAG(dag_id="torchx_e2e_guard_budget", schedule=None, start_date=START, catchup=False):
    TorchXRunOperator(
        task_id="job",
        component="utils.sh",
        component_args={"args": ["echo spending; sleep 120"], "gpu": 2, "memMB": 64},
        scheduler="local_cwd",
        cfg=GPU_CFG,
        deferrable=True,
        poll_interval=1,
        max_gpu_hours=2 * BUDGET_SECONDS / 3600,
        retries=1,
        retry_delay=timedelta(seconds=1),
    )
