"""DAGs of the live retry policy test (``torchx_retry_policy``, Airflow >= 3.3; none before):
a deferred job whose code raises (``app``: the task fails after one try), and one whose replica
is SIGKILLed after its first checkpoint (``infra``: retried; the next try's job resumes from
the checkpoint the task instance's ``TORCHX_CHECKPOINT_DIR`` holds and succeeds)."""

from __future__ import annotations

import sys
from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_provider_torchx.core.specs import AppDef, Role
from airflow_provider_torchx.failures import torchx_retry_policy
from airflow_provider_torchx.operators.torchx import TorchXRunOperator

#: Each job runs for seconds first: a deferred task whose trigger fires within a few seconds
#: of deferring meets a known Airflow race (docs/behaviour.md, "Cancelling"), which fails a try
#: outside this test's subject.
SETTLE = "import time; time.sleep(8)\n"
KILLED_AFTER_A_CHECKPOINT = SETTLE + (
    "import os, pathlib, signal\n"
    "step = pathlib.Path(os.environ['TORCHX_CHECKPOINT_DIR']) / 'step'\n"
    "if step.exists():\n"
    "    print('resumed from step', step.read_text())\n"
    "else:\n"
    "    step.parent.mkdir(parents=True, exist_ok=True)\n"
    "    step.write_text('6')\n"
    "    print('checkpoint at step 6 written', flush=True)\n"
    "    os.kill(os.getpid(), signal.SIGKILL)\n"
)

try:
    POLICY = torchx_retry_policy()
except RuntimeError:  # Airflow < 3.3 has no retry policies: no DAGs here
    POLICY = None

if POLICY is not None:
    for dag_id, script in (
        ("torchx_e2e_policy_app", SETTLE + "raise ValueError('bad batch size')"),
        ("torchx_e2e_policy_killed", KILLED_AFTER_A_CHECKPOINT),
    ):
        with DAG(dag_id=dag_id, schedule=None, start_date=datetime(2024, 1, 1), catchup=False):
            TorchXRunOperator(
                task_id="job",
                app=AppDef(dag_id, roles=[Role("w", image="local", entrypoint=sys.executable, args=["-c", script])]),
                scheduler="local_cwd",
                deferrable=True,
                poll_interval=1,
                retries=2,
                retry_delay=timedelta(seconds=1),
                retry_policy=POLICY,
            )
