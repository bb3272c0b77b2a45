"""The DAG of the retry policy tests (``torchx_retry_policy``, Airflow >= 3.3): a job whose
code fails (``app``: not retried), and a job whose replica is SIGKILLed on its first try
(``infra``: retried; its second try's job succeeds). ``TORCHX_TEST_MARKERS`` names the
directory where the first try leaves its mark."""

from __future__ import annotations

import os
import sys
from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_provider_torchx.core.specs import AppDef, Role
from airflow_provider_torchx.failures import torchx_retry_policy
from airflow_provider_torchx.operators.torchx import TorchXRunOperator

MARKER = os.path.join(os.environ.get("TORCHX_TEST_MARKERS", "/tmp"), "killed-once")
#: Killed by SIGKILL (as the OOM killer does) the first time, succeeds the next.
KILLED_ONCE = (
    "import os, pathlib, signal\n"
    f"marker = pathlib.Path({MARKER!r})\n"
    "if not marker.exists():\n"
    "    marker.touch()\n"
    "    os.kill(os.getpid(), signal.SIGKILL)\n"
    "print('second try: done')\n"
)


def python_app(name: str, script: str) -> AppDef:
    return AppDef(name, roles=[Role("w", image="local", entrypoint=sys.executable, args=["-c", script])])


try:
    POLICY = torchx_retry_policy()
except RuntimeError:  # Airflow < 3.3 has no retry policies: no DAG here
    POLICY = None

if POLICY is not None:
    with DAG(dag_id="torchx_test_retry_policy", schedule=None, start_date=datetime(2024, 1, 1), catchup=False):
        for task_id, script in (
            ("app_error", "raise ValueError('bad batch size')"),
            ("killed_once", KILLED_ONCE),
        ):
            TorchXRunOperator(
                task_id=task_id,
                app=python_app(task_id, script),
                scheduler="local_cwd",
                poll_interval=0.3,
                deferrable=False,
                retries=2,
                retry_delay=timedelta(seconds=0),
                retry_policy=POLICY,
            )
