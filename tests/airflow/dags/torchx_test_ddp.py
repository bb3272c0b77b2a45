"""DDP DAGs for the PyTorch tests (``tests/airflow/test_ddp.py``): the example's training script
(``$TORCHX_TEST_DDP_SCRIPT``) through ``dist.spmd`` (2 nodes) with the test venv's ``torchrun`` on
the jobs' ``PATH`` (``$TORCHX_TEST_TORCH_VENV``). They parse without PyTorch."""

from __future__ import annotations

import os
from datetime import datetime
from typing import Any

from airflow.sdk import DAG

from airflow_provider_torchx.operators.torchx import TorchXRunOperator

START = datetime(2024, 1, 1)
SCRIPT = os.environ.get("TORCHX_TEST_DDP_SCRIPT", "ddp_train.py")
TORCH_PATH = os.path.join(os.environ.get("TORCHX_TEST_TORCH_VENV", ".venv-torch"), "bin")
#: Where the crash-once marker of a run goes (the tests' private job store).
MARKERS = os.environ.get("AIRFLOW_TORCHX_STATE_DIR", "/tmp")


def ddp_task(*script_args: str, j: str = "2x2", **component_args: Any) -> TorchXRunOperator:
    """The training script on ``j`` (nodes x ranks) with ``script_args``."""
    return TorchXRunOperator(
        task_id="train",
        component="dist.spmd",
        component_args={"script": SCRIPT, "j": j, "script_args": list(script_args), **component_args},
        scheduler="local_cwd",
        env={"PATH": TORCH_PATH + os.pathsep + os.environ.get("PATH", "")},
        poll_interval=0.5,
    )


with DAG(dag_id="torchx_test_ddp", schedule=None, start_date=START, catchup=False):
    ddp_task("--steps", "3")

with DAG(dag_id="torchx_test_ddp_crash", schedule=None, start_date=START, catchup=False):
    ddp_task("--steps", "50", "--crash-rank", "1", "--crash-step", "2", "--crash-aborts")

with DAG(dag_id="torchx_test_ddp_raise", schedule=None, start_date=START, catchup=False):
    ddp_task("--steps", "50", "--crash-rank", "1", "--crash-step", "2", "--crash-raises", j="2x1")

with DAG(dag_id="torchx_test_ddp_retry", schedule=None, start_date=START, catchup=False):
    marker = os.path.join(MARKERS, "crashed-{{ run_id | replace(':', '_') | replace('+', '_') }}")
    ddp_task("--steps", "3", "--crash-rank", "1", "--crash-once", marker, j="2x1", max_retries=1)
