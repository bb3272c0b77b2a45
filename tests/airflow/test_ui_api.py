"""The TorchX UI plugin's API (``plugins/app.py``) in-process with FastAPI's TestClient, on real
local jobs and Airflow's SimpleAuthManager: who may see and cancel what, errors that explain
themselves (400 bad handle, 404 unknown job, never a traceback), log pages with cursors, and
that Airflow loads the plugin from the entry point and mounts it under ``/torchx``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_torchx.core.runner import Runner
from airflow_provider_torchx.core.schedulers.api import CancelledBy
from airflow_provider_torchx.core.specs import AppDef, AppState, Resource, Role
from tests.fixtures.clock import FakeClock
from tests.fixtures.files import swap_file_for_symlink

pytestmark = [pytest.mark.airflow, pytest.mark.airflow_line]  # the UI plugin under each line's auth manager

LINES = 'for i in 1 2 3; do echo "line $i"; done; sleep {pause}'


def _app(pause: int) -> AppDef:
    return AppDef(
        "ui", roles=[Role("worker", image="/", entrypoint="sh", args=["-c", LINES.format(pause=pause)], num_replicas=2)]
    )


def _identity(dag_id: str, run_id: str = "r1") -> dict[str, str]:
    return {"airflow.dag_id": dag_id, "airflow.task_id": "train", "airflow.run_id": run_id, "airflow.map_index": "-1"}


@pytest.fixture(scope="module")
def auth(airflow_env: Any) -> Any:
    """Airflow's auth manager (SimpleAuthManager), as the api-server initialises it."""
    from airflow.api_fastapi.app import init_auth_manager

    return init_auth_manager()


def _headers(auth: Any, role: str | None) -> dict[str, str]:
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    token = auth.generate_jwt(SimpleAuthManagerUser(username=f"ann-{role}", role=role))
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def client(auth: Any) -> Iterator[Any]:
    from fastapi.testclient import TestClient

    from airflow_provider_torchx.plugins.app import create_app

    with TestClient(create_app(), raise_server_exceptions=False) as c:
        yield c


@pytest.fixture(scope="module")
def jobs(airflow_env: Any) -> Iterator[dict[str, str]]:
    """A finished job of DAG ``ui_done`` and a running one of DAG ``ui_live`` (2 replicas each)."""
    from airflow_provider_torchx.core.runner import get_runner

    runner = get_runner()
    done = runner.run(_app(0), "local_cwd", labels=_identity("ui_done"))
    live = runner.run(_app(120), "local_cwd", labels=_identity("ui_live"))
    runner.wait(done, wait_interval=0.2, timeout=60, cancel_on_signal=False)
    deadline = time.monotonic() + 60  # a loaded machine may start the live one after the other ended
    while (status := runner.status(live)) is None or status.state != AppState.RUNNING:
        assert time.monotonic() < deadline, f"the live job never ran: {status}"
        time.sleep(0.05)
    yield {"done": done, "live": live}
    for handle in (done, live):
        runner.delete(handle)


def test_nothing_without_a_login(client: Any) -> None:
    resp = client.get("/api/jobs")
    assert resp.status_code == 401 and "not authenticated" in resp.json()["detail"]
    resp = client.get("/api/jobs", headers={"Authorization": "Bearer not-a-jwt"})
    assert resp.status_code == 401 and "invalid or expired" in resp.json()["detail"]
    page = client.get("/", follow_redirects=False)
    assert page.status_code in (302, 307) and "login" in page.headers["location"]


def test_list_filters_by_dag_and_state(client: Any, auth: Any, jobs: dict[str, str]) -> None:
    viewer = _headers(auth, "viewer")
    listed = client.get("/api/jobs", headers=viewer).json()
    handles = {j["handle"] for j in listed["jobs"]}
    assert {jobs["done"], jobs["live"]} <= handles, listed
    only = client.get("/api/jobs", params={"dag_id": "ui_live"}, headers=viewer).json()["jobs"]
    assert [j["handle"] for j in only] == [jobs["live"]]
    assert only[0] | {"url": None} == only[0] | {
        "dag_id": "ui_live",
        "task_id": "train",
        "run_id": "r1",
        "scheduler": "local_cwd",
        "url": None,
    }
    assert only[0]["app_id"] == jobs["live"].rsplit("/", 1)[1]
    assert only[0]["url"].startswith("/torchx/job?handle=local_cwd%3A%2F%2F")
    assert only[0]["created"] <= only[0]["started"] <= listed["now"] and only[0]["ended"] is None, only[0]
    (done_row,) = [j for j in listed["jobs"] if j["handle"] == jobs["done"]]
    assert done_row["created"] <= done_row["started"] <= done_row["ended"] <= listed["now"], done_row
    done = client.get("/api/jobs", params={"state": "succeeded", "task_id": "train"}, headers=viewer).json()["jobs"]
    assert jobs["done"] in {j["handle"] for j in done} and jobs["live"] not in {j["handle"] for j in done}
    assert client.get("/api/jobs", headers=_headers(auth, None)).json()["jobs"] == [], "a user without a role"


def test_a_broken_connection_is_reported_beside_the_other_jobs(
    client: Any, auth: Any, jobs: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Connections come from the environment and the metadata database; one of a local
    scheduler adds nothing (the store is listed once), a broken one is named with its error,
    except beside the jobs found of one task instance (its TorchX tab): they come from its own
    connection."""
    from airflow.models import Connection
    from airflow.utils.session import create_session

    monkeypatch.setenv("_AIRFLOW_PROCESS_CONTEXT", "server")  # as in the api-server: connections from the database
    broken = json.dumps({"conn_type": "torchx", "extra": {"scheduler": "nope"}})
    monkeypatch.setenv("AIRFLOW_CONN_TORCHX_BROKEN", broken)
    stored = [
        Connection(conn_id=f"torchx_db_{name}", conn_type="torchx", extra=json.dumps({"scheduler": scheduler}))
        for name, scheduler in (("local", "local_dir"), ("broken", "nope2"))
    ]
    with create_session() as session:
        session.add_all(stored)
    try:
        listed = client.get("/api/jobs", headers=_headers(auth, "viewer")).json()
        found = client.get("/api/jobs", params=_one_task("ui_live"), headers=_headers(auth, "viewer")).json()
        missing = client.get("/api/jobs", params=_one_task("ui_none"), headers=_headers(auth, "viewer")).json()
    finally:
        with create_session() as session:
            session.query(Connection).filter(Connection.conn_id.startswith("torchx_db_")).delete()
    handles = [j["handle"] for j in listed["jobs"]]
    assert jobs["live"] in handles and len(handles) == len(set(handles))
    assert set(listed["errors"]) == {"torchx_broken", "torchx_db_broken"}, listed["errors"]
    assert "unknown scheduler 'nope'" in listed["errors"]["torchx_broken"]
    assert "unknown scheduler 'nope2'" in listed["errors"]["torchx_db_broken"]
    assert [j["handle"] for j in found["jobs"]] == [jobs["live"]] and found["errors"] == {}, found
    assert missing["jobs"] == [] and set(missing["errors"]) == {"torchx_broken", "torchx_db_broken"}, missing


@pytest.fixture
def database_down(monkeypatch: pytest.MonkeyPatch) -> str:
    """Airflow's database unreachable: every session connects to a PostgreSQL port where
    nothing listens (psycopg2's error names that host and port). Returns ``host, port``'s text."""
    import socket

    from airflow import settings
    from sqlalchemy import create_engine
    from sqlalchemy.orm import scoped_session, sessionmaker

    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    engine = create_engine(f"postgresql+psycopg2://airflow:pw@127.0.0.1:{port}/airflow")
    monkeypatch.setattr(settings, "Session", scoped_session(sessionmaker(bind=engine)))
    return f"port {port}"


def test_a_database_outage_is_a_500_saying_nothing_of_the_error(
    client: Any, auth: Any, database_down: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A database error is answered as Airflow's own routes answer it: a 500 whose detail
    names an ID to look for in the api-server's log, never the error's text (psycopg2's names
    the database's host and port); the log has the error under that ID."""
    import logging
    import re

    with caplog.at_level(logging.ERROR, logger="airflow_provider_torchx.plugins"):
        resp = client.get("/api/jobs", headers=_headers(auth, "viewer"))
    assert resp.status_code == 500, resp.text
    detail = resp.json()["detail"]
    found = re.fullmatch(r"Serious error when handling your request\. Check logs .* look for ID (\w+)", detail)
    assert found, detail
    for leak in ("OperationalError", "psycopg2", "127.0.0.1", database_down):
        assert leak not in resp.text, resp.text
    (logged,) = [r for r in caplog.records if found[1] in r.getMessage()]
    assert logged.exc_info and "OperationalError" in type(logged.exc_info[1]).__name__
    assert database_down in str(logged.exc_info[1])


def _one_task(dag_id: str) -> dict[str, str]:
    return {"dag_id": dag_id, "task_id": "train", "run_id": "r1"}


@pytest.mark.parametrize(
    ("filters", "found", "shown"),
    [
        ({}, 0, True),  # the jobs page: every source that could not be listed
        ({}, 3, True),
        ({"dag_id": "d"}, 2, True),  # a DAG's tasks may use several connections
        ({"dag_id": "d", "task_id": "t"}, 1, True),  # a task of several runs, maybe other connections
        ({"dag_id": "d", "task_id": "t", "run_id": "r"}, 0, True),  # its job may be in the broken source
        ({"dag_id": "d", "task_id": "t", "run_id": "r"}, 1, False),  # a task instance's jobs were found
        ({"dag_id": "d", "task_id": "t", "run_id": "r", "state": "RUNNING"}, 1, False),
    ],
)
def test_a_source_error_is_shown_where_it_can_hide_jobs_asked_for(
    filters: dict[str, str], found: int, shown: bool
) -> None:
    from airflow_provider_torchx.plugins.jobs import JobRow, errors_that_matter

    rows = [JobRow(f"local_cwd://torchx/j-{n}", "local_cwd", "j", "RUNNING", None) for n in range(found)]
    errors = {"torchx_batch": "SchedulerSetupError: no AWS region"}
    assert errors_that_matter(filters, rows, errors) == (errors if shown else {})


def test_job_shows_roles_and_replicas(client: Any, auth: Any, jobs: dict[str, str]) -> None:
    job = client.get("/api/job", params={"handle": jobs["done"]}, headers=_headers(auth, "viewer")).json()
    assert job["state"] == "SUCCEEDED" and job["dag_id"] == "ui_done" and job["can_cancel"] is False
    (role,) = job["roles"]
    assert role["name"] == "worker" and role["num_replicas"] == 2
    assert [(r["id"], r["state"], r["exit_code"]) for r in role["replicas"]] == [
        (0, "SUCCEEDED", 0),
        (1, "SUCCEEDED", 0),
    ]
    assert job["console_url"] is None, "a local job's file:// directory is no link"
    assert client.get("/api/job", params={"handle": jobs["done"]}, headers=_headers(auth, "user")).json()["can_cancel"]
    assert job["created"] <= job["started"] <= job["ended"] <= job["now"], job
    usage = job["usage"]
    assert usage["attempts_count"] == 2 and usage["node_seconds"] > 0, usage
    assert usage["gpu_hours"] is None and usage["vcpu_hours"] is None, "the null resource asks for no amount"
    assert job["root_cause"] is None and [r["devices"] for r in role["replicas"]] == [None, None]
    assert job["failure_kind"] is None
    live = client.get("/api/job", params={"handle": jobs["live"]}, headers=_headers(auth, "viewer")).json()
    assert live["started"] is not None and live["ended"] is None and live["usage"] is None, live


#: A replica that fails as a rank recorded by torchrun does: its error file names the exception
#: (and a secret the masker knows), then it exits 3.
ERROR_FILE = (
    '{"message": {"message": "RuntimeError: loss is NaN (key EnvUiCausePw551)", "errorCode": 3, '
    '"extraInfo": {"py_callstack": "Traceback (most recent call last):\\n  File \\"train.py\\", line 9, in step\\n'
    '    raise RuntimeError(\\"loss is NaN\\")\\nRuntimeError: loss is NaN", "timestamp": "1700000000"}}}'
)


def test_a_failed_job_shows_its_root_cause_masked_and_its_gpus(
    client: Any, auth: Any, local_jobs: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job page gets a failed job's root cause (the failing replica's error file, as the
    task's failure message shows it), masked as everything else, and the GPUs each replica
    was given."""
    from airflow_provider_torchx.plugins import secrets

    monkeypatch.setenv("AIRFLOW_TORCHX_LOCAL_GPUS", "0,1")
    monkeypatch.setenv("AIRFLOW_VAR_UI_CAUSE_PASSWORD", "EnvUiCausePw551")
    monkeypatch.setattr(secrets, "_cached", (-secrets.REFRESH_S, frozenset()))  # read them now
    runner: Runner = local_jobs[0]
    script = f"printf '%s\\n' '{ERROR_FILE}' > \"$TORCHELASTIC_ERROR_FILE\"; exit 3"
    role = Role("trainer", image="/", entrypoint="sh", args=["-c", script], resource=Resource(1, 1, 128))
    cfg = {"auto_set_cuda_visible_devices": True}
    handle = runner.run(AppDef("ui-cause", roles=[role]), "local_cwd", cfg, labels=_identity("ui_cause"))
    local_jobs[1].append(handle)
    runner.wait(handle, wait_interval=0.2, timeout=60, cancel_on_signal=False)
    job = client.get("/api/job", params={"handle": handle}, headers=_headers(auth, "viewer")).json()
    assert job["state"] == "FAILED", job
    cause = job["root_cause"]
    assert cause["error"] == "RuntimeError: loss is NaN (key ***)" and cause["replica"] == "trainer/0", cause
    assert cause["exit_code"] == 3 and cause["frames"][0].startswith('File "train.py", line 9'), cause
    assert cause["text"].startswith("Root cause (replica trainer/0, exit code 3): RuntimeError: loss is NaN"), cause
    assert "EnvUiCausePw551" not in json.dumps(job)
    assert job["failure_kind"] == "app"  # the page's "failure kind" row
    assert job["usage"]["attempts_count"] == 1 and job["usage"]["gpu_hours"] > 0, job["usage"]
    assert [r["devices"] for r in job["roles"][0]["replicas"]] == ["0"]


def test_a_priced_job_shows_its_usage_and_cost_so_far_while_running_then_its_cost(
    client: Any, auth: Any, local_jobs: Any, jobs: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A live job's page gets what it used so far (GPU-hours, dollars at the rates it carries);
    once it ended, its usage with the cost. The jobs list's cost column says the same (so far,
    growing, then the final cost); a job without rates has none."""
    from airflow_provider_torchx.core.rates import Rates

    monkeypatch.setenv("AIRFLOW_TORCHX_LOCAL_GPUS", "0")
    runner: Runner = local_jobs[0]
    role = Role("trainer", image="/", entrypoint="sh", args=["-c", "echo up; sleep 2"], resource=Resource(1, 1, 128))
    labels = _identity("ui_priced") | Rates(gpu_hour=3600.0).labels()  # $1 a GPU-second
    handle = runner.run(
        AppDef("ui-priced", roles=[role]), "local_cwd", {"auto_set_cuda_visible_devices": True}, labels=labels
    )
    local_jobs[1].append(handle)
    deadline = time.monotonic() + 30
    while not runner.read_log(handle, "trainer", 0).lines:  # it runs
        assert time.monotonic() < deadline, "the replica never printed"
        time.sleep(0.05)
    viewer = _headers(auth, "viewer")

    def listed(**filters: str) -> dict[str, Any]:
        """The job's row in the jobs list (new filters: a listing made now, not one reused)."""
        rows = client.get("/api/jobs", params={"dag_id": "ui_priced", **filters}, headers=viewer).json()["jobs"]
        (row,) = [r for r in rows if r["handle"] == handle]
        return row

    first = listed()["cost_usd"]
    live = client.get("/api/job", params={"handle": handle}, headers=viewer).json()
    so_far = live["usage_so_far"]
    assert live["usage"] is None and so_far["gpu_hours"] > 0, live
    assert so_far["cost_usd"] == pytest.approx(so_far["gpu_hours"] * 3600.0), so_far
    assert 0 < first <= so_far["cost_usd"] <= listed()["cost_usd"], (first, so_far)  # so far: it grows
    runner.wait(handle, wait_interval=0.2, timeout=60, cancel_on_signal=False)
    done = client.get("/api/job", params={"handle": handle}, headers=viewer).json()
    assert done["usage_so_far"] is None and done["usage"]["cost_usd"] == pytest.approx(done["usage"]["node_seconds"])
    assert listed(task_id="train")["cost_usd"] == done["usage"]["cost_usd"]
    rows = client.get("/api/jobs", params={"dag_id": "ui_done"}, headers=viewer).json()["jobs"]
    assert [r["cost_usd"] for r in rows if r["handle"] == jobs["done"]] == [None]  # no rates: blank


@pytest.mark.parametrize(
    ("params", "status", "message"),
    [
        ({"handle": "not a handle"}, 400, "app_handle: 'not a handle' is not of the form"),
        ({"handle": "nosuch://torchx/x-1"}, 400, "unknown scheduler 'nosuch'"),
        ({"handle": "local_cwd://torchx/no-such-job"}, 404, "no job 'local_cwd://torchx/no-such-job'"),
        ({}, 400, "'handle': Field required"),
    ],
)
def test_bad_and_unknown_handles_get_a_clear_error(
    client: Any, auth: Any, params: dict[str, str], status: int, message: str
) -> None:
    for method, path in (
        ("GET", "/api/job"),
        ("GET", "/api/log"),
        ("POST", "/api/cancel"),
        ("POST", "/api/start-over"),
    ):
        query = {**params, "role": "worker"} if path == "/api/log" else params
        sent = {"json": query} if method == "POST" else {"params": query}
        resp = client.request(method, path, headers=_headers(auth, "admin"), **sent)
        assert resp.status_code == status, (path, resp.text)
        assert message in json.dumps(resp.json()["detail"]), (path, resp.text)
        assert "Traceback" not in resp.text


def test_log_pages_follow_the_cursor(client: Any, auth: Any, jobs: dict[str, str]) -> None:
    viewer, handle = _headers(auth, "viewer"), jobs["done"]
    first = client.get("/api/log", params={"handle": handle, "role": "worker", "replica": 1}, headers=viewer).json()
    assert first["lines"] == ["line 1", "line 2", "line 3"] and first["eof"], first
    again = client.get(
        "/api/log", params={"handle": handle, "role": "worker", "replica": 1, "cursor": first["cursor"]}, headers=viewer
    ).json()
    assert again["lines"] == [] and again["eof"]
    for query, message in (
        ({"role": "nope"}, "has no role 'nope'"),
        ({"role": "worker", "replica": 7}, "has replicas 0..1; got 7"),
        ({"role": "worker", "cursor": "garbage{"}, "cursor"),
    ):
        resp = client.get("/api/log", params={"handle": handle, **query}, headers=viewer)
        assert resp.status_code == 400 and message in resp.json()["detail"], resp.text


def test_only_users_with_edit_rights_cancel(client: Any, auth: Any, jobs: dict[str, str], local_jobs: Any) -> None:
    runner: Runner = local_jobs[0]
    handle = jobs["live"]
    denied = client.post("/api/cancel", json={"handle": handle}, headers=_headers(auth, "viewer"))
    assert denied.status_code == 403, denied.text
    assert denied.json()["detail"] == (
        "'ann-viewer' may not cancel this job: needs edit rights on the task instances of DAG 'ui_live'"
    )
    assert not runner.describe_app(handle).cancel_requested  # type: ignore[union-attr]

    resp = client.post("/api/cancel", json={"handle": handle}, headers=_headers(auth, "user"))
    assert resp.status_code == 202 and resp.json()["cancel_requested"], resp.text
    status = runner.wait(handle, wait_interval=0.2, timeout=30, cancel_on_signal=False)
    assert status is not None and status.state == AppState.CANCELLED
    assert status.msg.startswith("cancelled by request: the Airflow UI's TorchX jobs page, by ann-user"), status.msg
    assert runner.describe_app(handle).cancelled_by == CancelledBy.USER  # type: ignore[union-attr]
    again = client.post("/api/cancel", json={"handle": handle}, headers=_headers(auth, "user")).json()
    assert again == {"handle": handle, "state": "CANCELLED", "cancel_requested": False}


def test_only_users_with_edit_rights_start_an_ended_jobs_task_instance_over(
    client: Any, auth: Any, jobs: dict[str, str], local_jobs: Any, tmp_path: Path
) -> None:
    """The job page's "Start over" (``POST api/start-over``), ruled as its Cancel: a viewer gets
    403 and a cookie-only request without the same origin is refused, nothing moved; refused
    (409) while the job still uses its checkpoints; once it ended, an editor's sets them aside
    (renamed beside them, kept), and a second finds nothing there. A job given no checkpoint
    location has nothing to set aside (400)."""
    from airflow_provider_torchx.core import checkpoints

    runner: Runner = local_jobs[0]
    location = tmp_path / "ck" / "task"
    save = 'mkdir -p "$TORCHX_CHECKPOINT_DIR" && echo w > "$TORCHX_CHECKPOINT_DIR/step-1.pt" && sleep 300'
    app = AppDef("ui-ck", roles=[Role("w", image="/", entrypoint="sh", args=["-c", save])])
    checkpoints.place(app, str(location), 0, host_paths=True)
    handle = runner.run(app, "local_cwd", labels=_identity("ui_ck"))
    local_jobs[1].append(handle)
    deadline = time.monotonic() + 30
    while not (location / "step-1.pt").exists():
        assert time.monotonic() < deadline, "the job never saved its checkpoint"
        time.sleep(0.05)
    viewer, user, body = _headers(auth, "viewer"), _headers(auth, "user"), {"handle": handle}

    denied = client.post("/api/start-over", json=body, headers=viewer)
    assert denied.status_code == 403 and denied.json()["detail"] == (
        "'ann-viewer' may not start this task instance over: needs edit rights on the task instances of DAG 'ui_ck'"
    ), denied.text
    cookie = {"Cookie": f"_token={user['Authorization'].split()[1]}", "Content-Type": "application/json"}
    refused = client.post("/api/start-over", content=json.dumps(body), headers=cookie)
    assert refused.status_code == 403 and "without an Origin header" in refused.json()["detail"], refused.text
    busy = client.post("/api/start-over", json=body, headers=user)
    assert busy.status_code == 409, busy.text
    assert busy.json()["detail"] == (
        f"job(s) {handle.rsplit('/', 1)[1]} still use {location}: cancel them first (nothing was moved)"
    )
    assert (location / "step-1.pt").exists()

    runner.cancel(handle)
    runner.wait(handle, wait_interval=0.2, timeout=30, cancel_on_signal=False)
    done = client.post("/api/start-over", json=body, headers={**cookie, "Origin": "http://testserver"})
    assert done.status_code == 200, done.text
    moved = done.json()["set_aside_to"]
    assert done.json()["checkpoint_dir"] == str(location) and moved.startswith(f"{location}+set-aside-"), done.text
    assert Path(moved, "step-1.pt").exists() and not location.exists()
    again = client.post("/api/start-over", json=body, headers=user).json()
    assert again == {"handle": handle, "checkpoint_dir": str(location), "set_aside_to": None}

    nothing = client.post("/api/start-over", json={"handle": jobs["done"]}, headers=_headers(auth, "admin"))
    assert nothing.status_code == 400, nothing.text
    assert nothing.json()["detail"].endswith("was given no TORCHX_CHECKPOINT_DIR: nothing to set aside")


def test_airflow_mounts_the_plugin_under_torchx(airflow_env: Any, auth: Any) -> None:
    """Loaded from the ``airflow.plugins`` entry point by the api-server's own app factory: the
    plugin is listed with its app and views, the page is served to a logged-in user, the API is
    behind the auth manager."""
    from airflow.api_fastapi.app import create_app
    from fastapi.testclient import TestClient

    with TestClient(create_app("core"), raise_server_exceptions=False) as c:
        plugins = c.get("/api/v2/plugins", headers=_headers(auth, "admin")).json()["plugins"]
        (ours,) = [p for p in plugins if p["name"] == "torchx"]
        assert [a["url_prefix"] for a in ours["fastapi_apps"]] == ["/torchx"]
        assert {v["url_route"] for v in ours["external_views"]} == {"torchx", "torchx_task"}
        assert c.get("/torchx/api/jobs").status_code == 401
        page = c.get("/torchx/", headers=_headers(auth, "viewer"))
        assert page.status_code == 200 and "<title>TorchX jobs</title>" in page.text
        bare = c.get("/torchx", follow_redirects=False)
        assert (bare.status_code, bare.headers["location"]) == (307, "torchx/"), bare.text
        followed = c.get("/torchx?dag_id=d", headers=_headers(auth, "viewer"))
        assert followed.status_code == 200 and "<title>TorchX jobs</title>" in followed.text
        assert str(followed.url).endswith("/torchx/?dag_id=d"), followed.url


@pytest.mark.parametrize(
    ("path", "root_path", "query", "location"),
    [
        ("/torchx", "", b"", "torchx/"),
        ("/torchx", "", b"dag_id=a%20b&run_id=r", "torchx/?dag_id=a%20b&run_id=r"),
        ("/airflow/torchx", "/airflow", b"", "torchx/"),  # the api-server under a path prefix
        ("/torchx/", "", b"", None),  # the app's own page
        ("/torchx/api/jobs", "", b"", None),
        ("/torchxy", "", b"", None),
        ("/other/torchx", "", b"", None),
        ("/", "", b"", None),
    ],
)
def test_only_the_bare_prefix_is_redirected(path: str, root_path: str, query: bytes, location: str | None) -> None:
    from airflow_provider_torchx.plugins.torchx import bare_prefix_location

    assert bare_prefix_location(path, root_path, query) == location


@pytest.mark.docker
def test_batch_jobs_through_their_connection(
    client: Any, auth: Any, aws_env: str, batch_queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Batch job (moto server, real containers) is listed through its ``torchx`` connection,
    shown with its AWS console link, and cancelled through the connection's AWS settings."""
    from airflow_provider_torchx.hooks.torchx import TorchXHook

    extra = {"scheduler": "aws_batch", "cfg": f"queue={batch_queue}", "region_name": "us-east-1"}
    monkeypatch.setenv("AIRFLOW_CONN_TORCHX_UI_BATCH", json.dumps({"conn_type": "torchx", "extra": extra}))
    hook = TorchXHook("torchx_ui_batch")
    role = Role(
        "worker", image="busybox:local", entrypoint="sh", args=["-c", "sleep 120"], resource=Resource(1, 0, 256)
    )
    app = AppDef("ui", roles=[role])
    handle = hook.get_runner().run(app, "aws_batch", hook.resolve_cfg(), labels=_identity("ui_batch"))
    admin = _headers(auth, "admin")
    try:
        listed = client.get("/api/jobs", params={"dag_id": "ui_batch"}, headers=admin).json()
        assert [(j["handle"], j["conn_id"]) for j in listed["jobs"]] == [(handle, "torchx_ui_batch")], listed
        assert listed["jobs"][0]["url"].endswith("&conn_id=torchx_ui_batch")
        params = {"handle": handle, "conn_id": "torchx_ui_batch"}
        job = client.get("/api/job", params=params, headers=admin).json()
        assert job["console_url"].startswith("https://us-east-1.console.aws.amazon.com/batch/"), job
        assert listed["jobs"][0]["created"] == job["created"] and job["created"] <= job["now"], (listed, job)
        assert [r["name"] for r in job["roles"]] == ["worker"] and job["dag_id"] == "ui_batch"
        assert client.post("/api/cancel", json=params, headers=admin).status_code == 202
        status = hook.get_runner().wait(handle, wait_interval=1, timeout=60, cancel_on_signal=False)
        assert status is not None and status.is_terminal() and status.state != AppState.SUCCEEDED, status
    finally:
        hook.get_runner().cancel(handle)


def _listed_once(client: Any, auth: Any, ready: Any, timeout: float = 60) -> dict[str, Any]:
    """The jobs list (by handle) once ``ready(jobs)`` holds: the list is a listing renewed in
    the background, so a change shows a moment later."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        listed = {j["handle"]: j for j in client.get("/api/jobs", headers=_headers(auth, "viewer")).json()["jobs"]}
        if ready(listed):
            return listed
        assert time.monotonic() < deadline, f"the list never showed the change: {sorted(listed)}"
        time.sleep(0.2)


def test_a_live_job_whose_task_instance_ended_is_listed_as_orphaned(
    client: Any, auth: Any, jobs: dict[str, str]
) -> None:
    """A running job labelled with a DAG that exists and a DAG run that does not (deleted):
    the list marks it orphaned with the reason, until it is cancelled; other jobs are not."""
    from airflow.models.dag import DagModel
    from airflow.models.dagbundle import DagBundleModel
    from airflow.utils.session import create_session

    from airflow_provider_torchx.core.runner import get_runner

    runner = get_runner()
    orphan = runner.run(_app(120), "local_cwd", labels=_identity("ui_orphaned", run_id="deleted-run"))
    with create_session() as session:
        session.add(DagBundleModel(name="ui-orphans"))
    with create_session() as session:
        session.add(DagModel(dag_id="ui_orphaned", fileloc="/nowhere/ui_orphaned.py", bundle_name="ui-orphans"))
    try:
        listed = _listed_once(client, auth, lambda jobs: orphan in jobs)  # the listing is renewed in the background
        assert listed[orphan]["orphaned"] == "task ui_orphaned.train of run deleted-run: the DAG run was deleted"
        assert listed[jobs["live"]]["orphaned"] is None, "a job whose labels name no known DAG is not judged"
        assert listed[jobs["done"]]["orphaned"] is None
        runner.cancel(orphan)
        runner.wait(orphan, wait_interval=0.2, timeout=60, cancel_on_signal=False)
        listed = _listed_once(client, auth, lambda jobs: jobs[orphan]["state"] == "CANCELLED")
        assert listed[orphan]["orphaned"] is None
    finally:
        runner.delete(orphan)
        with create_session() as session:
            session.query(DagModel).filter(DagModel.dag_id == "ui_orphaned").delete()
            session.query(DagBundleModel).filter(DagBundleModel.name == "ui-orphans").delete()


def test_the_list_pages_newest_first_with_a_cursor(client: Any, auth: Any, jobs: dict[str, str]) -> None:
    viewer = _headers(auth, "viewer")
    everything = client.get("/api/jobs", params={"task_id": "train"}, headers=viewer).json()
    assert everything["next"] is None and len(everything["jobs"]) >= 2
    created = [j["created"] for j in everything["jobs"]]
    assert created == sorted(created, reverse=True), "newest first"
    seen, cursor = [], None
    while True:
        params = {"task_id": "train", "limit": 1} | ({"cursor": cursor} if cursor else {})
        page = client.get("/api/jobs", params=params, headers=viewer).json()
        assert len(page["jobs"]) == 1, page
        seen.append(page["jobs"][0]["handle"])
        cursor = page["next"]
        if cursor is None:
            break
    assert seen == [j["handle"] for j in everything["jobs"]], "each job once, in order"
    for params, named in (
        ({"cursor": "bm90IGEgY3Vyc29y"}, "cursor: 'bm90IGEgY3Vyc29y' is not a cursor api/jobs returned"),
        ({"limit": 0}, "query parameter 'limit': '0'"),
        ({"limit": "many"}, "query parameter 'limit': 'many'"),
    ):
        resp = client.get("/api/jobs", params=params, headers=viewer)
        assert resp.status_code == 400 and named in resp.json()["detail"], resp.text


def test_one_listing_serves_every_page_and_is_renewed_in_the_background(
    jobs: dict[str, str], local_jobs: Any, fake_clock: FakeClock
) -> None:
    """Many open pages cost one walk of the store per ``LIST_REUSE_S`` (of the listing's
    clock), and no page waits for the renewal: a new job shows a moment later; an ended job's
    row is not made again."""
    import time

    from airflow_provider_torchx.plugins import jobs as ui_jobs

    fake_clock.now = time.monotonic()  # after the listings of earlier tests (the system's clock)
    clock = fake_clock.clock
    first = ui_jobs.list_jobs({"task_id": "train"}, clock)
    fake_clock.advance(ui_jobs.LIST_REUSE_S - 0.1)
    assert ui_jobs.list_jobs({"task_id": "train"}, clock) is first
    runner, handles = local_jobs
    handles.append(runner.run(_app(0), "local_cwd", labels=_identity("ui_new")))
    fake_clock.advance(0.1)
    assert ui_jobs.list_jobs({"task_id": "train"}, clock) is first, "the old listing answers while it is renewed"
    deadline = time.monotonic() + 60
    while handles[0] not in {row.handle for row in ui_jobs.list_jobs({"task_id": "train"}, clock).jobs}:
        assert time.monotonic() < deadline, "the listing was never renewed"
        time.sleep(0.1)
    renewed = ui_jobs.list_jobs({"task_id": "train"}, clock)
    (done_before,) = [row for row in first.jobs if row.handle == jobs["done"]]
    (done_after,) = [row for row in renewed.jobs if row.handle == jobs["done"]]
    assert renewed is not first and done_after is done_before, "the ended job's row was made again"


def test_secrets_of_connections_and_variables_only_in_the_environment_are_masked(
    client: Any, auth: Any, local_jobs: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection defined only in an ``AIRFLOW_CONN_*`` variable (URI or JSON) and a variable
    only in ``AIRFLOW_VAR_*`` are masked as those of the metadata database are."""
    from airflow_provider_torchx.plugins import secrets

    monkeypatch.setenv("AIRFLOW_CONN_SVC_URI", "http://user:EnvUriPw9917@example.com/?api_token=EnvExtraTok55")
    monkeypatch.setenv(
        "AIRFLOW_CONN_SVC_JSON",
        json.dumps({"conn_type": "http", "password": "EnvJsonPw3312", "extra": {"secret_key": "EnvJsonKey71"}}),
    )
    monkeypatch.setenv("AIRFLOW_VAR_SVC_PASSWORD", "EnvVarPw88231")
    monkeypatch.setattr(secrets, "_cached", (-secrets.REFRESH_S, frozenset()))  # read them now
    leaked = ["EnvUriPw9917", "EnvExtraTok55", "EnvJsonPw3312", "EnvJsonKey71", "EnvVarPw88231"]
    runner: Runner = local_jobs[0]
    role = Role("worker", image="/", entrypoint="sh", args=["-c", "echo " + " ".join(leaked)])
    handle = runner.run(AppDef("ui-env-secrets", roles=[role]), "local_cwd", labels=_identity("ui_env"))
    local_jobs[1].append(handle)
    runner.wait(handle, wait_interval=0.2, timeout=60, cancel_on_signal=False)
    admin = _headers(auth, "admin")
    log = client.get("/api/log", params={"handle": handle, "role": "worker"}, headers=admin)
    assert log.status_code == 200 and log.json()["lines"] == [" ".join(["***"] * len(leaked))], log.text
    job = client.get("/api/job", params={"handle": handle}, headers=admin)
    assert job.status_code == 200 and not [s for s in leaked if s in job.text], job.text


#: A cursor nested deeper than Python's JSON parser goes.
DEEP = "[" * 3000 + "]" * 3000


def test_hostile_values_are_a_400_naming_them(client: Any, auth: Any, jobs: dict[str, str]) -> None:
    """An app id longer than a file name, and cursors nested too deep to parse, are bad input
    named (shortened) in a 400, never a crash of the file system call or of the parser."""
    import base64

    admin, long_handle = _headers(auth, "admin"), "local_cwd://torchx/" + "a" * 300
    for method, path, sent, named in (
        ("GET", "/api/job", {"params": {"handle": long_handle}}, "is longer than 255 characters"),
        ("GET", "/api/log", {"params": {"handle": long_handle, "role": "worker"}}, "is longer than 255 characters"),
        ("POST", "/api/cancel", {"json": {"handle": long_handle}}, "is longer than 255 characters"),
        ("GET", "/api/log", {"params": {"handle": jobs["done"], "role": "worker", "cursor": DEEP}}, "cursor: '[[[["),
        ("GET", "/api/jobs", {"params": {"cursor": base64.urlsafe_b64encode(DEEP.encode()).decode()}}, "cursor: "),
    ):
        resp = client.request(method, path, headers=admin, **sent)
        assert resp.status_code == 400 and named in resp.json()["detail"], (path, resp.text[:500])
        assert len(resp.text) < 1000, f"the value is shortened: {resp.text[:500]}"


def test_a_batch_handle_without_an_aws_region_is_a_400_saying_what_to_set(
    client: Any, auth: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    handle = "aws_batch://torchx/queue:0a1b2c3d-0000-4000-8000-000000000000"
    for name in ("AWS_DEFAULT_REGION", "AWS_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    for method, path, sent in (
        ("GET", "/api/job", {"params": {"handle": handle}}),
        ("GET", "/api/log", {"params": {"handle": handle, "role": "worker"}}),
        ("POST", "/api/cancel", {"json": {"handle": handle}}),
    ):
        resp = client.request(method, path, headers=_headers(auth, "admin"), **sent)
        assert resp.status_code == 400, (path, resp.text)
        detail = resp.json()["detail"]
        assert repr(handle) in detail and "region_name" in detail and "AWS_DEFAULT_REGION" in detail, detail


def test_a_job_whose_state_file_was_swapped_is_cancelled_all_the_same(
    client: Any, auth: Any, local_jobs: Any, tmp_path: Any
) -> None:
    """The job cannot be described (its state file is a symbolic link), yet a user with edit
    rights on its DAG (from its record) cancels it: the supervisor is reached and the answer
    names the refused file; a viewer still gets 403."""
    import os
    import time
    from pathlib import Path

    from airflow_provider_torchx.core.schedulers.local import store
    from airflow_provider_torchx.core.specs import parse_app_handle

    runner: Runner = local_jobs[0]
    handle = runner.run(_app(120), "local_cwd", labels=_identity("ui_swapped"))
    local_jobs[1].append(handle)
    state_file = os.path.join(store.JobStore().job_dir(parse_app_handle(handle).app_id), store.STATE)
    deadline = time.monotonic() + 30
    while not all(len(runner.read_log(handle, "worker", k).lines) == 3 for k in (0, 1)):  # both started
        assert time.monotonic() < deadline, "the replicas never printed"
        time.sleep(0.05)
    (tmp_path / "state.json").write_text(Path(state_file).read_text())
    swap_file_for_symlink(Path(state_file), tmp_path / "state.json")
    assert client.post("/api/cancel", json={"handle": handle}, headers=_headers(auth, "viewer")).status_code == 403
    resp = client.post("/api/cancel", json={"handle": handle}, headers=_headers(auth, "user"))
    assert resp.status_code == 202, resp.text
    assert f"{state_file} is corrupt (refused: it is a symbolic link" in resp.json()["msg"], resp.text
    assert "its supervisor (pid " in resp.json()["msg"]
    while os.path.islink(state_file):  # the supervisor records the end, replacing the link
        assert time.monotonic() < deadline + 30, "the supervisor never recorded the cancel"
        time.sleep(0.05)
    status = runner.wait(handle, wait_interval=0.2, timeout=60, cancel_on_signal=False)
    assert status is not None and status.state == AppState.CANCELLED, status


def test_the_job_page_shows_the_checkpoint_location_the_replicas_get() -> None:
    """The job page's checkpoint location is the one the replicas' ``TORCHX_CHECKPOINT_DIR``
    carries; none without it."""
    from airflow_provider_torchx.core.schedulers.api import DescribeAppResponse
    from airflow_provider_torchx.plugins.jobs import job_details

    handle = "local_cwd://torchx/app-1"
    role = Role("trainer", image="/", env={"TORCHX_CHECKPOINT_DIR": "/ckpt/d/r/t/-1"})
    given = DescribeAppResponse(app_id="app-1", roles=[Role("plain", image="/"), role])
    assert job_details(handle, None, given)["checkpoint_dir"] == "/ckpt/d/r/t/-1"
    none = DescribeAppResponse(app_id="app-1", roles=[Role("plain", image="/")])
    assert job_details(handle, None, none)["checkpoint_dir"] is None


def test_a_ladder_jobs_page_links_the_task_instances_jobs_on_the_other_rungs(
    client: Any, auth: Any, local_jobs: Any
) -> None:
    """Jobs carrying the rung label and one task instance's identity link each other (oldest
    first, with their rung and page); a job of the same task instance outside the ladder, one of
    another map index and a job of no ladder are not linked."""
    runner, handles = local_jobs
    ti = _identity("ui_ladder")
    submitted = [  # the job left, the job taken, one of another map index, one of no ladder
        ti | {"torchx.rung": "torchx_box"},
        ti | {"torchx.rung": "torchx_spare"},
        ti | {"airflow.map_index": "3", "torchx.rung": "torchx_box"},
        ti,
    ]
    for labels in submitted:
        handles.append(runner.run(_app(0), "local_cwd", labels=labels))
        time.sleep(0.01)  # distinct submission times: the order shown
    left, taken, other, alone = handles
    viewer = _headers(auth, "viewer")

    linked = client.get("/api/ladder", params={"handle": taken}, headers=viewer).json()["jobs"]
    assert [(j["handle"], j["rung"]) for j in linked] == [(left, "torchx_box")], linked
    assert linked[0]["url"].startswith("/torchx/job?handle=local_cwd%3A%2F%2F") and linked[0]["dag_id"] == "ui_ladder"
    back = client.get("/api/ladder", params={"handle": left}, headers=viewer).json()["jobs"]
    assert [(j["handle"], j["rung"]) for j in back] == [(taken, "torchx_spare")], back
    assert client.get("/api/ladder", params={"handle": alone}, headers=viewer).json() == {"jobs": []}
    assert other not in {j["handle"] for j in linked + back}
    denied = client.get("/api/ladder", params={"handle": taken}, headers=_headers(auth, None))
    assert denied.status_code == 403, denied.text
    assert client.get("/api/ladder", params={"handle": "nope"}, headers=viewer).status_code == 400
