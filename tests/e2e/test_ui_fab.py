"""The TorchX pages under Airflow's FAB auth manager (``apache-airflow-providers-fab``) with
per-DAG permissions, on a live api-server: the plugin asks the auth manager as Airflow's own
routes do, so FAB's DAG-level rights decide.

One deployment (api-server and dag-processor; the FAB auth manager, its users and roles in the
metadata database): ``carol`` has a role that may read and edit the task instances (FAB's
"Task Instances" and "DAG Runs") of DAG ``fab_dag_a`` only (``DAG:fab_dag_a``), ``dave`` may
read DAG A but no task instances, the admin everything. A job of each DAG runs; carol lists
A's job but not B's, gets 403 on B's job, log and cancel, and reads and cancels A's; dave sees
no job. Airflow's own task-instance API decides the same for both.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from airflow_provider_torchx.core.specs import AppDef, Role
from tests.e2e.deployment import AirflowDeployment, wait_until
from tests.e2e.live import ONE_TASK_DAG, LiveAirflow

pytestmark = [pytest.mark.airflow, pytest.mark.airflow_line]  # the pages under each line's FAB auth manager

DAGS = ("fab_dag_a", "fab_dag_b")
#: name -> (FAB role, password); the first one is the admin the deployment's API calls use.
USERS = {"admin": ("Admin", "admin-pw"), "carol": ("dag_a_user", "carol-pw"), "dave": ("dag_a_only", "dave-pw")}
#: The role and users, made with FAB's own security manager (what ``airflow roles add-perms``
#: and ``airflow users create`` do, in one process): DAG A's task instances, read and edit;
#: DAG A alone, read.
SETUP = """
import json, sys
from airflow.providers.fab.auth_manager.cli_commands.utils import get_application_builder

users = json.loads(sys.argv[1])
with get_application_builder() as appbuilder:
    sm = appbuilder.sm
    role = sm.add_role("dag_a_user")
    for action in ("can_read", "can_edit"):
        for resource in ("DAG:fab_dag_a", "Task Instances", "DAG Runs"):
            sm.add_permission_to_role(role, sm.create_permission(action, resource))
    sm.add_permission_to_role(sm.add_role("dag_a_only"), sm.create_permission("can_read", "DAG:fab_dag_a"))
    for name, (role_name, password) in users.items():
        user = sm.add_user(name, name, "Test", f"{name}@example.com", sm.find_role(role_name), password=password)
        assert user, f"could not create {name}"
"""


@pytest.fixture(scope="module")
def fab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The FAB deployment, a running job of each DAG (``a``, ``b``) and every user's token."""
    root = tmp_path_factory.mktemp("live-airflow-fab")
    state_dir = root / "torchx-state"
    state_dir.mkdir()
    dags = []
    for dag_id in DAGS:
        path = root / f"{dag_id}.py"
        path.write_text(ONE_TASK_DAG.format(dag_id=dag_id))
        dags.append(path)
    env = {
        "AIRFLOW_TORCHX_STATE_DIR": str(state_dir),
        "AIRFLOW__CORE__AUTH_MANAGER": "airflow.providers.fab.auth_manager.fab_auth_manager.FabAuthManager",
    }
    deployment = AirflowDeployment(root, dags, env=env, users=USERS)
    live = LiveAirflow(deployment, state_dir)
    try:
        deployment.start(["api-server", "dag-processor"])
        subprocess.run(
            [sys.executable, "-c", SETUP, json.dumps(USERS)],
            env=deployment.env,
            check=True,
            capture_output=True,
            timeout=300,
        )
        for dag_id in DAGS:
            deployment.wait_for_dag(dag_id)
        handles = {}
        for key, dag_id in (("a", "fab_dag_a"), ("b", "fab_dag_b")):
            role = Role("worker", image="/", entrypoint="sh", args=["-c", f"echo {key}-ready; sleep 600"])
            labels = {"airflow.dag_id": dag_id, "airflow.task_id": "job", "airflow.run_id": "manual"}
            app_id = live.scheduler.submit(AppDef(f"fab-{key}", roles=[role]), labels=labels)
            wait_until(lambda a=app_id: live.scheduler.read_log(a, "worker").lines, 60, f"job {key}'s first line")
            handles[key] = f"local_cwd://torchx/{app_id}"
        yield {
            "deployment": deployment,
            "live": live,
            "handles": handles,
            "tokens": {u: deployment.token(u) for u in USERS},
        }
    finally:
        try:
            deployment.stop()
        finally:
            live.cleanup_jobs()


def test_fab_per_dag_rights_decide_what_a_user_sees_and_cancels(fab: dict[str, Any]) -> None:
    deployment: AirflowDeployment = fab["deployment"]
    h = fab["handles"]
    with httpx.Client(base_url=deployment.base_url, timeout=60) as client:

        def call(user: str, method: str, path: str, **kwargs: Any) -> httpx.Response:
            headers = {"Authorization": f"Bearer {fab['tokens'][user]}"}
            return client.request(method, path, headers=headers, **kwargs)

        def own_api(user: str, dag_id: str) -> int:  # Airflow's own task-instance list of the DAG
            return call(user, "GET", f"/api/v2/dags/{dag_id}/dagRuns/~/taskInstances").status_code

        assert own_api("carol", "fab_dag_a") == 200
        assert own_api("carol", "fab_dag_b") == 403 and own_api("dave", "fab_dag_a") == 403

        listed = {u: {j["handle"] for j in call(u, "GET", "/torchx/api/jobs").json()["jobs"]} for u in USERS}
        assert h["a"] in listed["carol"] and h["b"] not in listed["carol"], listed
        assert {h["a"], h["b"]} <= listed["admin"] and not listed["dave"], listed
        assert call("dave", "GET", "/torchx/api/job", params={"handle": h["a"]}).status_code == 403

        for method, path, kwargs in (
            ("GET", "/torchx/api/job", {"params": {"handle": h["b"]}}),
            ("GET", "/torchx/api/log", {"params": {"handle": h["b"], "role": "worker"}}),
            ("POST", "/torchx/api/cancel", {"json": {"handle": h["b"]}}),
        ):
            resp = call("carol", method, path, **kwargs)
            assert resp.status_code == 403, (path, resp.text)
            assert "'carol' may not" in resp.json()["detail"] and "DAG 'fab_dag_b'" in resp.json()["detail"], resp.text
        b_id = h["b"].rsplit("/", 1)[1]
        desc = fab["live"].scheduler.describe(b_id)
        assert desc.state.name == "RUNNING" and not desc.cancel_requested, "carol cancelled DAG B's job"

        job = call("carol", "GET", "/torchx/api/job", params={"handle": h["a"]})
        assert job.status_code == 200 and job.json()["can_cancel"] is True, job.text
        log = call("carol", "GET", "/torchx/api/log", params={"handle": h["a"], "role": "worker"})
        assert log.status_code == 200 and log.json()["lines"] == ["a-ready"], log.text
        resp = call("carol", "POST", "/torchx/api/cancel", json={"handle": h["a"]})
        assert resp.status_code == 202 and resp.json()["cancel_requested"], resp.text
    a_id = h["a"].rsplit("/", 1)[1]
    wait_until(lambda: fab["live"].scheduler.describe(a_id).state.name == "CANCELLED", 60, "job a to be cancelled")
