"""The DAG of the out-of-tree scheduler's live test (``tests/e2e/test_live_acme.py``): every
task runs the ``acme`` scheduler of ``tests/plugin`` through the connection ``torchx_e2e_acme``,
which exists (and ``acme`` is registered) in that test's deployment only.

Each job prints ``acme line <i>`` for ``i`` in ``1..lines``, ``pause`` seconds apart, then waits
for the file ``gate`` to exist. Two deferred tasks (one the test lets run, one it marks failed)
and two in worker mode whose task process the test SIGKILLs: ``retried`` (``retries=1``: its
retry adopts the running job) and ``orphan`` (``retries=0``: the reaper cancels its job).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_provider_torchx.operators.torchx import TorchXRunOperator

SCRIPT = (
    'for i in $(seq 1 {{ params.lines }}); do echo "acme line $i"; sleep {{ params.pause }}; done; '
    'while [ ! -e "{{ params.gate }}" ]; do sleep 0.2; done'
)

with DAG(
    dag_id="torchx_e2e_acme",
    schedule=None,
    start_date=datetime(2024, 1, 1),
    catchup=False,
    params={"lines": 6, "pause": 0.5, "gate": "/nonexistent"},
):
    for acme_task, acme_deferrable, acme_retries in (
        ("deferred", True, 0),
        ("killed", True, 0),
        ("retried", False, 1),
        ("orphan", False, 0),
    ):
        TorchXRunOperator(
            task_id=acme_task,
            torchx_conn_id="torchx_e2e_acme",
            component="utils.sh",
            component_args={"args": [SCRIPT]},
            deferrable=acme_deferrable,
            poll_interval=1,
            retries=acme_retries,
            retry_delay=timedelta(seconds=1),
        )
