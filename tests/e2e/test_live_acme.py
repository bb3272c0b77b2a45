"""The out-of-tree scheduler gets the whole Airflow behaviour on a live deployment.

``acme`` (``tests/plugin``: written against the public contract alone, registered through the
entry point groups by an installed distribution's metadata on the deployment's ``PYTHONPATH``)
runs every task of one DAG run side by side (``dags/torchx_e2e_acme.py``): a deferred task logs
its job's lines while deferred, each once in the end; the UI's jobs API lists its four jobs
(listed without a connection: ``acme`` is host-bound); a deferred task marked failed gets its
job cancelled; a worker-mode task whose process is SIGKILLed is retried and the retry adopts
the running job (one job, the same handle); one with ``retries=0`` has its job cancelled by the
reaper's loop; and ``airflow-torchx prune`` removes the four ended jobs through ``acme``'s own
``Scheduler.prune``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from airflow_provider_torchx.core.specs import parse_app_handle
from tests.e2e.conftest import _deployment
from tests.e2e.deployment import wait_until
from tests.e2e.live import LiveAirflow, task_labels
from tests.plugin.acme_scheduler import AcmeScheduler

pytestmark = [pytest.mark.airflow]

DAG_ID = "torchx_e2e_acme"
LINES = 6
LINE = re.compile(r"^\[main/0\] acme line \d+$")
#: ``[torchx] orphan_grace`` of this deployment (seconds): how long the reaper's loop waits
#: after the orphan's task ended before it cancels the job.
GRACE = 3
#: The reaper's bound: a job ends within a minute of its task's end.
WITHIN = 60.0
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def acme_deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveAirflow, AcmeScheduler]]:
    """A live deployment where ``acme`` is installed (a distribution's metadata naming
    ``tests.plugin``'s scheduler and run options) with the connection ``torchx_e2e_acme``; its
    jobs under the deployment's folder, every process of them killed at the end."""
    root = tmp_path_factory.mktemp("live-airflow-acme")
    dist = root / "site" / "acme_scheduler-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-scheduler\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[airflow_provider_torchx.schedulers]\nacme = tests.plugin.acme_scheduler:create_scheduler\n"
        "[airflow_provider_torchx.run_options]\nacme = tests.plugin.acme_options:run_opts\n"
    )
    jobs = root / "acme-jobs"
    env = {
        "PYTHONPATH": os.pathsep.join([str(dist.parent), str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(":"),
        "ACME_JOBS_DIR": str(jobs),
        "AIRFLOW_CONN_TORCHX_E2E_ACME": json.dumps({"conn_type": "torchx", "extra": {"scheduler": "acme"}}),
        "AIRFLOW__TORCHX__ORPHAN_GRACE": str(GRACE),
        "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "120",  # a task process parses its DAG file first
    }
    os.environ["ACME_JOBS_DIR"] = str(jobs)  # this process's own AcmeScheduler reads the same jobs
    try:
        with _deployment(root, env) as live:
            try:
                yield live, AcmeScheduler("e2e")
            finally:
                for pid in jobs.glob("*/pid"):
                    with contextlib.suppress(ProcessLookupError, ValueError):
                        os.killpg(int(pid.read_text()), signal.SIGKILL)
    finally:
        os.environ.pop("ACME_JOBS_DIR", None)


def alive(acme: AcmeScheduler, handle: str) -> bool:
    """Whether the job's process group still has a process."""
    pid = int((acme.root / parse_app_handle(handle).app_id / "pid").read_text())
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_plugin_scheduler_defers_cancels_reattaches_is_reaped_listed_and_pruned(
    acme_deployment: tuple[LiveAirflow, AcmeScheduler], tmp_path: Path
) -> None:
    live, acme = acme_deployment
    api = live.deployment
    gate = tmp_path / "gate"
    run_id = live.trigger(DAG_ID, {"lines": LINES, "pause": 0.5, "gate": str(gate)})

    def handle_of(task_id: str) -> str:
        found = wait_until(lambda: api.xcom(DAG_ID, run_id, task_id, "app_handle"), 120, f"{task_id}'s handle")
        return str(found)

    states = {"deferred": "deferred", "killed": "deferred", "retried": "running", "orphan": "running"}
    for task, state in states.items():
        api.wait_for_state(DAG_ID, run_id, task, {state})
    handles = {task: handle_of(task) for task in states}
    assert all(h.startswith("acme://") for h in handles.values()), handles

    # Logs while deferred.
    wait_until(
        lambda: (
            any(LINE.match(e) for e in api.task_log(DAG_ID, run_id, "deferred", 1))
            and api.task_instance(DAG_ID, run_id, "deferred")["state"] == "deferred"
        ),
        120,
        "acme's lines in the deferred task's log while it is deferred",
    )
    # The UI lists the jobs (host-bound: without a connection).
    token = api.token()
    listed = httpx.get(
        f"{api.base_url}/torchx/api/jobs",
        params={"dag_id": DAG_ID},
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
    )
    assert listed.status_code == 200, listed.text
    rows = {row["task_id"]: row for row in listed.json()["jobs"]}
    assert {task: rows[task]["handle"] for task in rows} == handles, listed.json()
    assert {(row["scheduler"], row["conn_id"], row["state"]) for row in rows.values()} == {("acme", None, "RUNNING")}

    # Cancel on kill; a retry adopts; the reaper takes the orphan.
    tis = {task: api.task_instance(DAG_ID, run_id, task) for task in ("retried", "orphan")}
    retried_pid, orphan_pid = tis["retried"]["pid"], tis["orphan"]["pid"]  # their jobs run: they have one
    assert retried_pid and orphan_pid and api.started(retried_pid) and api.started(orphan_pid), tis
    api.set_state(DAG_ID, run_id, "killed", "failed")
    os.kill(retried_pid, signal.SIGKILL)
    os.kill(orphan_pid, signal.SIGKILL)
    killed_at = time.monotonic()
    wait_until(lambda: not alive(acme, handles["killed"]), 35, "the killed task's job to stop")
    killed = acme.describe(parse_app_handle(handles["killed"]).app_id)
    assert killed is not None and killed.state.name == "CANCELLED" and killed.cancel_reason, killed
    print(f"killed: job stopped {time.monotonic() - killed_at:.1f}s after the task was marked failed")

    wait_until(lambda: api.task_instance(DAG_ID, run_id, "retried")["try_number"] == 2, 120, "the retry")
    api.wait_for_state(DAG_ID, run_id, "retried", {"running"})
    assert handle_of("retried") == handles["retried"], "the retry submitted a job of its own"
    assert len(acme.list(labels=task_labels(DAG_ID, run_id, "retried"))) == 1

    api.wait_for_state(DAG_ID, run_id, "orphan", {"failed"})
    wait_until(lambda: not alive(acme, handles["orphan"]), WITHIN, "the reaper to cancel the orphan's job")
    orphan = acme.describe(parse_app_handle(handles["orphan"]).app_id)
    assert orphan is not None and orphan.state.name == "CANCELLED", orphan
    assert f"task {DAG_ID}.orphan of run {run_id}" in str(orphan.cancel_reason), orphan.cancel_reason
    print(f"orphan: job stopped {time.monotonic() - killed_at:.1f}s after its task process was killed")
    assert alive(acme, handles["retried"]) and alive(acme, handles["deferred"]), "a kept job was stopped"

    gate.touch()
    for task in ("deferred", "retried"):
        api.wait_for_state(DAG_ID, run_id, task, {"success"}, timeout=120)
    got = [e for e in api.task_log(DAG_ID, run_id, "deferred", 1) if LINE.match(e)]
    assert got == [f"[main/0] acme line {i}" for i in range(1, LINES + 1)], got

    # Prune, through acme's own Scheduler.prune, from the CLI in the deployment's environment.
    time.sleep(1.1)
    cli = [sys.executable, "-m", "airflow_provider_torchx.core.cli", "prune", "--older-than", "1s"]
    out = subprocess.run(cli, env=api.env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "removed 4 ended job(s) of acme;" in out.stdout, out.stdout
    assert {line.split()[0] for line in out.stdout.splitlines() if not line.startswith("removed")} == {
        parse_app_handle(h).app_id for h in handles.values()
    }, out.stdout
    assert acme.list() == [] and not any(acme.root.iterdir())
