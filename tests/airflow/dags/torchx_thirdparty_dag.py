"""A DAG on the third-party ``acme`` scheduler (``tests/plugin``), registered only through the
entry point by the test that runs it, which also defines the ``torchx_acme`` connection naming
it (a literal ``scheduler=`` is checked when the DAG is parsed, before the plugin exists)."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG

from airflow_provider_torchx.core.specs import AppDef, Role
from airflow_provider_torchx.operators.torchx import TorchXRunOperator
from airflow_provider_torchx.sensors.torchx import TorchXJobSensor

ACME = AppDef(
    name="acme",
    roles=[Role(name="main", image="none", entrypoint="sh", args=["-c", "for i in 1 2 3; do echo acme $i; done"])],
)

with DAG(dag_id="torchx_test_thirdparty", schedule=None, start_date=datetime(2024, 1, 1), catchup=False):
    submit = TorchXRunOperator(task_id="submit", app=ACME, torchx_conn_id="torchx_acme", wait_for_completion=False)
    run = TorchXRunOperator(task_id="run", app=ACME, torchx_conn_id="torchx_acme", poll_interval=0.3)
    sense = TorchXJobSensor(
        task_id="sense",
        app_handle="{{ ti.xcom_pull(task_ids='submit') }}",
        torchx_conn_id="torchx_acme",
        stream_logs=True,
        poke_interval=0.3,
        timeout=60,
    )
    submit >> sense
