"""Submit a job in one task and wait for it in another with ``TorchXJobSensor``.

``wait_for_completion=False`` makes the first task return the app handle as soon as the job is
submitted; the sensor gets it through XCom and streams the job's log lines while it waits.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG

from airflow_provider_torchx.operators.torchx import TorchXRunOperator
from airflow_provider_torchx.sensors.torchx import TorchXJobSensor

with DAG(
    dag_id="torchx_local_submit_and_sense",
    schedule=None,
    start_date=datetime(2024, 1, 1),
    catchup=False,
    tags=["torchx", "example"],
):
    submit = TorchXRunOperator(
        task_id="submit",
        component="utils.sh",
        component_args=["echo started && sleep 1 && echo finished"],
        scheduler="local_cwd",
        wait_for_completion=False,
    )
    wait = TorchXJobSensor(
        task_id="wait",
        app_handle="{{ ti.xcom_pull(task_ids='submit') }}",
        stream_logs=True,
        poke_interval=1,
        timeout=300,
    )
    submit >> wait
