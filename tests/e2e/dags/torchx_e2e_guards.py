"""DAGs of the unwatched-guards live test (``tests/e2e/test_live_guards_unwatched.py``): deferred
local jobs on faked GPUs (``AIRFLOW_TORCHX_LOCAL_GPUS``) whose guards the job's supervisor holds
while the triggerer is down (4 faked GPUs). ``torchx_e2e_guard_budget``: one replica of 2 GPUs
that prints a line and sleeps, with a budget of ``BUDGET_S`` seconds of its GPUs;
``torchx_e2e_guard_start``: one replica of 3 GPUs, held PENDING while the test's own job holds
2, with ``start_timeout`` of ``START_TIMEOUT_S`` seconds. Both may retry: a guard fails them
without one."""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_provider_torchx.operators.torchx import TorchXRunOperator

START = datetime(2024, 1, 1)
#: The GPU budget, in seconds of the job's 2 GPUs.
BUDGET_S = 20
#: The start_timeout, in seconds.
START_TIMEOUT_S = 15
CFG = {"auto_set_cuda_visible_devices": True}
SCRIPT = 'echo "r${replica_id} started on $CUDA_VISIBLE_DEVICES"; sleep 600'


def guarded_task(gpu: int, **guard: float) -> TorchXRunOperator:
    """The deferred task of one replica asking for ``gpu`` GPUs, with the ``guard`` given."""
    return TorchXRunOperator(
        task_id="job",
        component="utils.sh",
        component_args={"args": [SCRIPT], "gpu": gpu, "memMB": 64},
        scheduler="local_cwd",
        cfg=CFG,
        deferrable=True,
        poll_interval=1,
        retries=1,
        retry_delay=timedelta(seconds=1),
        **guard,  # type: ignore[arg-type]
    )


with DAG(dag_id="torchx_e2e_guard_budget", schedule=None, start_date=START, catchup=False):
    guarded_task(2, max_gpu_hours=2 * BUDGET_S / 3600)

with DAG(dag_id="torchx_e2e_guard_start", schedule=None, start_date=START, catchup=False):
    guarded_task(3, start_timeout=START_TIMEOUT_S)
