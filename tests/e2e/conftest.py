"""Fixtures for the live-deployment tests: a real Airflow (``deployment.AirflowDeployment``,
on a PostgreSQL database of its own) whose DAGs folder holds ``tests/e2e/dags/`` (helpers in
``live.py``). Each is shared by the tests of one module, which its DAG ids keep apart, and
stopped after them, so two deployments never load the machine at once.

- ``live_airflow``: a deployment for the local scheduler, with a ``torchx`` connection
  (``torchx_e2e_local``), a Variable (``torchx_e2e_setting``: ``E2E_SETTING``) that the
  secrets DAG's templates read, and real logins (an admin, as whom the REST API is called, and
  a viewer) for the browser test.
- ``live_airflow_heartbeat``: a deployment for local jobs with a 20 s task heartbeat timeout
  (worker lost) and a 10 s ``[torchx] orphan_grace`` (``ORPHAN_GRACE``).
- ``live_airflow_batch``: one whose workers and triggerer reach the moto server (and, through
  it, the Docker engine), with the ``torchx_batch`` connection given as
  ``AIRFLOW_CONN_TORCHX_BATCH``, and a capacity ladder's rungs: ``torchx_e2e_batch_box`` (local
  GPU jobs, ``LADDER_BOX``) and ``torchx_e2e_ladder_batch`` (``torchx_batch``'s queue).

Both stop every component at the end and leave no job running: live local jobs are cancelled
(and any process left of them killed), live Batch jobs terminated.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.deployment import AirflowDeployment
from tests.e2e.live import E2E_DAGS, E2E_SETTING, ORPHAN_GRACE, SECRET_TASKS, LiveAirflow, LiveBatch
from tests.fixtures.aws import FAKE_CREDS, REGION, MotoServer

#: The first rung of the Batch deployment's capacity ladder (``torchx_e2e_batch_box``): local jobs
#: given GPUs from the ledger, 10 s to start (long enough for the scheduler to take the deferral's
#: executor event before the trip's event resumes the task: apache/airflow#72716).
LADDER_BOX = {"scheduler": "local_cwd", "cfg": {"auto_set_cuda_visible_devices": True}, "start_timeout": 10}


@contextlib.contextmanager
def _deployment(
    root: Path, env: dict[str, str], users: dict[str, tuple[str, str]] | None = None
) -> Iterator[LiveAirflow]:
    state_dir = root / "torchx-state"
    state_dir.mkdir(parents=True)
    deployment = AirflowDeployment(root, E2E_DAGS, env={"AIRFLOW_TORCHX_STATE_DIR": str(state_dir), **env}, users=users)
    live = LiveAirflow(deployment, state_dir)
    try:
        deployment.start()
        yield live
    finally:
        try:
            # First: a task still waiting for its job then ends with it, and the scheduler's
            # executor, which waits for its running tasks, stops at once.
            live.cancel_jobs()
            deployment.stop()
        finally:
            live.cleanup_jobs()


@pytest.fixture(scope="module")
def live_airflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveAirflow]:
    """A live Airflow deployment for local-scheduler jobs, whose SimpleAuthManager has an
    ``admin`` and a ``viewer`` (passwords: the names)."""
    users = {"admin": ("admin", "admin"), "viewer": ("viewer", "viewer")}
    env = {
        "AIRFLOW_CONN_TORCHX_E2E_LOCAL": json.dumps({"conn_type": "torchx", "extra": {"scheduler": "local_cwd"}}),
        "AIRFLOW_VAR_TORCHX_E2E_SETTING": E2E_SETTING,
        "TORCHX_E2E_SECRET_TASKS": str(SECRET_TASKS),
    }
    with _deployment(tmp_path_factory.mktemp("live-airflow"), env, users) as live:
        yield live


@pytest.fixture(scope="module")
def live_airflow_heartbeat(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveAirflow]:
    """A live deployment for local jobs whose scheduler fails a task instance 20 s after its
    last heartbeat (the worker-lost tests) and whose reaper cancels an orphan ``ORPHAN_GRACE``
    seconds after its task ended."""
    env = {
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "20",
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
        # A task process parses its DAG file first: allow for a loaded 2-core machine (30 s default).
        "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "120",
        "AIRFLOW__TORCHX__ORPHAN_GRACE": str(ORPHAN_GRACE),
    }
    with _deployment(tmp_path_factory.mktemp("live-airflow-heartbeat"), env) as live:
        yield live


@pytest.fixture(scope="module")
def live_airflow_batch(
    tmp_path_factory: pytest.TempPathFactory, docker_engine: str, moto_server: MotoServer, batch_queue: str
) -> Iterator[LiveBatch]:
    """A live deployment with the AWS environment (moto) and the ``torchx_batch`` connection."""
    import boto3

    extra = {"scheduler": "aws_batch", "cfg": f"queue={batch_queue}", "region_name": REGION}
    env = {
        **FAKE_CREDS,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_ENDPOINT_URL": moto_server.url,
        "DOCKER_HOST": docker_engine,
        "AIRFLOW_CONN_TORCHX_BATCH": json.dumps({"conn_type": "torchx", "extra": extra}),
        "AIRFLOW_TORCHX_LOCAL_GPUS": "0,1,2,3",  # a 4-GPU host for the guardrails' and the ladder's local GPU jobs
        "AIRFLOW_CONN_TORCHX_E2E_BATCH_BOX": json.dumps({"conn_type": "torchx", "extra": LADDER_BOX}),
        "AIRFLOW_CONN_TORCHX_E2E_LADDER_BATCH": json.dumps({"conn_type": "torchx", "extra": extra}),
    }
    client = boto3.client("batch", endpoint_url=moto_server.url, region_name=REGION)
    with _deployment(tmp_path_factory.mktemp("live-airflow-batch"), env) as live:
        batch = LiveBatch(live, batch_queue, docker_engine, client)
        try:
            yield batch
        finally:
            batch.terminate_live_jobs()
