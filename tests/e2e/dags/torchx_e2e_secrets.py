"""A DAG for the live triggerer test (``tests/e2e/test_live_local.py``): ``TASKS`` mapped
deferrable tasks at once, each a local job whose env holds secrets, through a ``torchx``
connection (``torchx_e2e_local``, given to the deployment as ``AIRFLOW_CONN_TORCHX_E2E_LOCAL``).

``MY_PASSWORD`` comes from the Variable ``torchx_e2e_setting`` (a name Airflow does not deem
sensitive: the env key is what masks it), ``HF_TOKEN`` from the run's conf. Each job prints
``job <i> started``, waits for the file ``params.gate`` (so every task is deferred at once),
prints both secrets and ends. The live deployment sets how many tasks there are
(``TORCHX_E2E_SECRET_TASKS``, read when the DAG is parsed; 50 unless it says otherwise).
"""

from __future__ import annotations

import os
from datetime import datetime

from airflow.sdk import DAG

from airflow_provider_torchx.operators.torchx import TorchXRunOperator

TASKS = int(os.environ.get("TORCHX_E2E_SECRET_TASKS", "50"))
GATED = (
    'echo "job {i} started"; while [ ! -e "{{{{ params.gate }}}}" ]; do sleep 0.5; done; '
    'echo "job {i} password $MY_PASSWORD token $HF_TOKEN"'
)

with DAG(
    dag_id="torchx_e2e_secrets",
    schedule=None,
    start_date=datetime(2024, 1, 1),
    catchup=False,
    params={"gate": "/nonexistent", "hf_token": ""},
):
    TorchXRunOperator.partial(
        task_id="job",
        torchx_conn_id="torchx_e2e_local",
        component="utils.sh",
        env={"MY_PASSWORD": "{{ var.value.torchx_e2e_setting }}", "HF_TOKEN": "{{ params.hf_token }}"},
        deferrable=True,
        poll_interval=1,
    ).expand(component_args=[{"args": [GATED.format(i=i)], "memMB": 64} for i in range(TASKS)])
