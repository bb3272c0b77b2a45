"""The DAG of the usage, metrics and lineage tests: a job of known duration and resources
(two replicas of ``sleep 1``, 2 vCPUs, 1 GPU and 2 GiB each) with an inlet and an outlet, a
failing job, and a job watched by the sensor."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG, Asset

from airflow_provider_torchx.core.specs import AppDef, Resource, Role
from airflow_provider_torchx.operators.torchx import TorchXRunOperator
from airflow_provider_torchx.sensors.torchx import TorchXJobSensor

SLEEPERS = AppDef(
    name="sleepers",
    roles=[
        Role(
            name="sleeper",
            image="local",
            entrypoint="sleep",
            args=["1"],
            num_replicas=2,
            resource=Resource(cpu=2, gpu=1, memMB=2048),
        )
    ],
)

with DAG(dag_id="torchx_test_usage", schedule=None, start_date=datetime(2024, 1, 1), catchup=False):
    TorchXRunOperator(
        task_id="train",
        app=SLEEPERS,
        scheduler="local_cwd",
        cfg={"auto_set_cuda_visible_devices": False, "allow_no_gpus": True},  # the CI host has no GPU
        poll_interval=0.3,
        deferrable=False,
        inlets=[Asset("file:///data/torchx-usage/input.csv")],
        outlets=[Asset("file:///data/torchx-usage/model.pt")],
    )
    TorchXRunOperator(
        task_id="fail",
        component="utils.sh",
        component_args=["exit 3"],
        scheduler="local_cwd",
        poll_interval=0.3,
        deferrable=False,
    )
    submit = TorchXRunOperator(
        task_id="submit",
        component="utils.sh",
        component_args=["sleep 0.5"],
        scheduler="local_cwd",
        wait_for_completion=False,
    )
    watch = TorchXJobSensor(
        task_id="watch", app_handle="{{ ti.xcom_pull(task_ids='submit') }}", poke_interval=0.3, deferrable=False
    )
    submit >> watch
