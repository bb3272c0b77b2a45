"""``airflow-torchx prune --checkpoints`` on a live deployment: it asks the deployment's
database, so a task instance ``up_for_retry`` keeps its checkpoint through a prune that takes
everything older than a second, while a finished task instance of a run that ended loses its
own (the rule row by row: ``tests/core/test_checkpoint_prune.py``)."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from airflow_provider_torchx.core.checkpoints import checkpoint_dir
from airflow_provider_torchx.core.identity import TaskIdentity
from tests.e2e.deployment import AirflowDeployment, wait_until
from tests.e2e.live import LiveAirflow

pytestmark = pytest.mark.airflow

PRUNE = "torchx_e2e_prune"


def _ended_at(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _reaches(api: AirflowDeployment, run_id: str, state: str) -> None:
    """Wait until the run's task is in ``state`` (fail at once in another end state). A read
    the api-server does not answer in time is asked again: on a loaded host the execution API's
    first task start can hold its event loop longer than the client waits."""

    def now() -> str | None:
        try:
            got: str | None = api.task_instance(PRUNE, run_id, "job")["state"]
        except httpx.TimeoutException:
            return None
        assert got not in {"success", "failed", "up_for_retry"} - {state}, (run_id, got)
        return got

    wait_until(lambda: now() == state, 240, f"{run_id}'s task to be {state}")


def test_a_task_up_for_retry_keeps_its_checkpoint_through_a_prune(live_airflow: LiveAirflow) -> None:
    live, api = live_airflow, live_airflow.deployment
    retried, done = live.trigger(PRUNE, {"code": 3}), live.trigger(PRUNE, {"code": 0})
    _reaches(api, retried, "up_for_retry")
    _reaches(api, done, "success")
    run = wait_until(
        lambda: (r := api.api("GET", f"/dags/{PRUNE}/dagRuns/{done}"))["state"] == "success" and r, 120, "the run's end"
    )
    root = live.state_dir / "checkpoints"
    kept, removed = (Path(checkpoint_dir(str(root), TaskIdentity(PRUNE, "job", r))) for r in (retried, done))
    assert (kept / "step-1").exists() and (removed / "step-1").exists()
    # Everything is older than the prune's limit of one second: the run's end and every write.
    while time.time() < _ended_at(run["end_date"]) + 1.5:
        time.sleep(0.2)

    cli = [sys.executable, "-m", "airflow_provider_torchx.core.cli", "prune", "--older-than", "1s", "--checkpoints"]
    out = subprocess.run(cli, env=api.env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    print(out.stdout)
    assert f"kept {kept}: its task instance is up_for_retry: it can still run" in out.stdout
    (line,) = [line for line in out.stdout.splitlines() if line.startswith(f"{removed}  ")]
    assert "its DAG run ended success" in line and "the task instance success" in line, line
    assert (kept / "step-1").read_text() == "1\n", "the retry's checkpoint is gone"
    assert not removed.exists() and not removed.parent.exists(), "the run's empty directory went with it"
    assert kept.parent.is_dir()
    assert api.task_instance(PRUNE, retried, "job")["state"] == "up_for_retry"
