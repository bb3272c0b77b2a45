"""The DAG of the guardrails' live test (``tests/e2e/test_live_batch.py``; the deployment fakes
a 4-GPU host with ``AIRFLOW_TORCHX_LOCAL_GPUS``), one run exercising both guards at once.

The test first starts a job holding 2 GPUs; then ``job`` (deferred) waits for 3 GPUs, which
never fit beside it, and trips ``start_timeout``. Meanwhile ``budget`` (deferred) runs on 2
GPUs (at once, or once ``job`` is cancelled: devices go in submission order) and trips
``max_gpu_hours`` (a few seconds' worth). Both tasks allow retries that a guard must not use.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import DAG

from airflow_provider_torchx.operators.torchx import TorchXRunOperator

START = datetime(2024, 1, 1)
#: The GPU ledger hands devices out only with this run option.
GPU_CFG = {"auto_set_cuda_visible_devices": True}
#: Seconds the waiting task's job may take to start, and seconds of two GPUs the budget task's
#: job may use: long enough for the scheduler to take the defer-exit's executor event before the
#: guard's event resumes the task (an earlier resume gets the try failed, and retried, by
#: apache/airflow#72716, open for 3.3.x).
START_SECONDS = 15
BUDGET_SECONDS = 15


def gpu_task(task_id: str, script: str, gpus: int, **kwargs: Any) -> TorchXRunOperator:
    """A local ``utils.sh`` task running ``script`` on ``gpus`` GPUs from the ledger."""
    args = {"args": [script], "gpu": gpus, "memMB": 64}
    return TorchXRunOperator(
        task_id=task_id, component="utils.sh", component_args=args, scheduler="local_cwd", cfg=GPU_CFG, **kwargs
    )


#: The guarded tasks: deferred, a look a second, retries allowed (a guard must not use them).
GUARDED = {"deferrable": True, "poll_interval": 1, "retries": 2, "retry_delay": timedelta(seconds=1)}

with DAG(dag_id="torchx_e2e_guardrails", schedule=None, start_date=START, catchup=False):
    gpu_task("job", "echo never printed", 3, start_timeout=timedelta(seconds=START_SECONDS), **GUARDED)
    gpu_task("budget", "echo spending; sleep 120", 2, max_gpu_hours=2 * BUDGET_SECONDS / 3600, **GUARDED)
