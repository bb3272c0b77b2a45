"""The TorchX pages and API attacked as a user would, on a live Airflow api-server (multi-team
SimpleAuthManager, two DAG bundles of two teams) and, where a browser is the point, in Chromium.

One deployment (api-server and dag-processor only: the jobs are started by the test itself in
the deployment's job store, labelled with the teams' DAGs):
- a user of team A gets 403 on team B's job (page data, log, cancel, start over) and does not
  see it in the list, as Airflow's own API refuses them team B's DAG; a job of no DAG, or of a
  DAG the deployment does not have, is an admin's only;
- a job's secrets (its sensitive env values, a connection's password, a sensitive variable,
  of the metadata database or only of the api-server's environment) reach nobody: the log,
  the job and the list are masked;
- a cancel (or a "Start over") carrying only the login cookie is refused unless same-origin and
  JSON: a cross-site form, a same-site page on another port (Chromium), a form body; the jobs
  page never has two calls in flight (Chromium, answers slower than its poll);
- a replica that swaps its log, or a job's record, for a symbolic link gets a clear 400, never
  the target;
- no ``openapi.json``, a 400 naming each malformed value, CSP and ``nosniff`` on the pages.
"""

from __future__ import annotations

import contextlib
import http.server
import itertools
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from airflow_provider_torchx.core.specs import AppDef, Role
from tests.e2e.deployment import AirflowDeployment, free_port, wait_until
from tests.e2e.live import AIRFLOW_LINE, ONE_TASK_DAG, LiveAirflow, browse
from tests.fixtures.files import swap_file_for_symlink

pytestmark = [
    pytest.mark.airflow,
    pytest.mark.airflow_line,  # the pages under each line's multi-team auth manager
    # Not a line's failure: Airflow 3.1 has no teams (no `airflow teams`, no team bundles).
    pytest.mark.skipif(AIRFLOW_LINE < (3, 2), reason="multi-team Airflow arrived in 3.2"),
]

TEAMS = ("team_a", "team_b")
USERS = {"admin": ("admin", "admin"), "alice": ("user:team_a", "alice"), "bob": ("user:team_b", "bob")}
#: Secrets the jobs print: env values by sensitive names, a connection's and a variable's.
ENV_SECRETS = {
    "MY_PASSWORD": "Hunter2Password",
    "HF_TOKEN": "hf_TokenValue42",
    "AWS_SECRET_ACCESS_KEY": "AwsSecret+Key/9",
}
CONN_PASSWORD, VAR_SECRET = "ConnSecretPw17", "VarSecret8812"
#: A connection's password and a sensitive variable defined only in the api-server's environment.
ENV_CONN_PASSWORD, ENV_VAR_SECRET = "EnvConnPw4411", "EnvVarTok3391"


def _identity(dag_id: str) -> dict[str, str]:
    return {"airflow.dag_id": dag_id, "airflow.task_id": "job", "airflow.run_id": "manual", "airflow.map_index": "-1"}


@pytest.fixture(scope="module")
def teams(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The multi-team deployment and its jobs: ``a`` and ``b`` (running, of team A's and team
    B's DAG; ``b`` prints its secrets), ``c`` (team B, running: cancelled by the page's own
    request), ``orphan`` (no DAG label) and ``swapped`` (its log becomes a symbolic link)."""
    root = tmp_path_factory.mktemp("live-airflow-teams")
    state_dir = root / "torchx-state"
    state_dir.mkdir()
    bundles = []
    for team in TEAMS:
        folder = root / f"bundle_{team}"
        folder.mkdir()
        (folder / f"{team}_dag.py").write_text(ONE_TASK_DAG.format(dag_id=f"{team}_dag"))
        bundles.append(
            {
                "name": f"bundle_{team}",
                "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
                "kwargs": {"path": str(folder), "refresh_interval": 2},
                "team_name": team,
            }
        )
    env = {
        "AIRFLOW_TORCHX_STATE_DIR": str(state_dir),
        "AIRFLOW__CORE__MULTI_TEAM": "True",
        "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps(bundles),
        "AIRFLOW_CONN_SVC_ENV": f"http://svc:{ENV_CONN_PASSWORD}@svc.example.com/",
        "AIRFLOW_VAR_SVC_TOKEN": ENV_VAR_SECRET,
    }
    deployment = AirflowDeployment(root, [], env=env, users=USERS)
    live = LiveAirflow(deployment, state_dir)
    try:
        deployment.create_database()
        for team in TEAMS:
            cmd = [sys.executable, "-m", "airflow", "teams", "create", team]
            subprocess.run(cmd, env=deployment.env, check=True, capture_output=True)
        deployment.start(["api-server", "dag-processor"])
        for team in TEAMS:
            deployment.wait_for_dag(f"{team}_dag")
        deployment.api("POST", "/connections", {"connection_id": "svc", "conn_type": "http", "password": CONN_PASSWORD})
        deployment.api("POST", "/variables", {"key": "svc_api_key", "value": VAR_SECRET})
        yield {"deployment": deployment, "live": live, "handles": _start_jobs(live, root)}
    finally:
        try:
            deployment.stop()
        finally:
            live.cleanup_jobs()


def _start_jobs(live: LiveAirflow, root: Path) -> dict[str, str]:
    secret_file = root / "not-yours"
    secret_file.write_text("root:SHADOW-HASH:19000:0:99999:7:::\n")
    leak = (
        f'echo "pw=$MY_PASSWORD tok=$HF_TOKEN aws=$AWS_SECRET_ACCESS_KEY conn={CONN_PASSWORD} var={VAR_SECRET}'
        f' envconn={ENV_CONN_PASSWORD} envvar={ENV_VAR_SECRET}"'
    )
    jobs = {
        "a": ("team_a_dag", "echo a-ready; sleep 600", {}),
        "b": ("team_b_dag", f"{leak}; sleep 600 # {ENV_SECRETS['MY_PASSWORD']}", ENV_SECRETS),
        "c": ("team_b_dag", "echo c-ready; sleep 600", {}),
        "orphan": (None, "echo orphan-ready; sleep 600", {}),
        "ghost": ("no_such_dag", "echo ghost-ready; sleep 600", {}),
        "swapped": ("team_a_dag", "echo first; sleep 600", {}),
        "swapped_record": ("team_a_dag", "echo done", {}),
    }
    handles = {}
    for key, (dag_id, script, env) in jobs.items():
        role = Role("worker", image="/", entrypoint="sh", args=["-c", script], env=dict(env))
        app_id = live.scheduler.submit(AppDef(f"sec-{key}", roles=[role]), labels=_identity(dag_id) if dag_id else {})
        handles[key] = f"local_cwd://torchx/{app_id}"
    for key in jobs:
        wait_until(lambda k=key: live.scheduler.read_log(handles[k].rsplit("/", 1)[1], "worker").lines, 60, key)
    # what a replica may do to its own log: make it a symbolic link to a file it cannot read
    rec = json.loads((live.job_dir(handles["swapped"]) / "request.json").read_text())
    log_path = rec["role_params"]["worker"][0]["combined"]
    swap_file_for_symlink(Path(log_path), Path(secret_file))
    # and to the job's record, once it ended: a link to a record carrying a secret
    ended = handles["swapped_record"].rsplit("/", 1)[1]
    wait_until(lambda: live.scheduler.describe(ended).state.is_terminal(), 60, "the swapped_record job to end")
    record = live.job_dir(handles["swapped_record"]) / "request.json"
    forged = root / "forged-request.json"
    forged.write_text(json.dumps(json.loads(record.read_text()) | {"app_name": "SHADOW-RECORD"}))
    swap_file_for_symlink(record, forged)
    return handles


@pytest.fixture(scope="module")
def api(teams: dict[str, Any]) -> Iterator[Any]:
    """``api(user, method, path, **httpx kwargs)``: a call to ``/torchx/...`` with the user's
    bearer token (or none: ``user=None``)."""
    deployment: AirflowDeployment = teams["deployment"]
    tokens = {name: deployment.token(name) for name in USERS}
    with httpx.Client(base_url=deployment.base_url, timeout=60) as client:

        def call(user: str | None, method: str, path: str, **kwargs: Any) -> httpx.Response:
            headers = kwargs.pop("headers", {})
            if user:
                headers = {"Authorization": f"Bearer {tokens[user]}", **headers}
            return client.request(method, "/torchx/" + path, headers=headers, **kwargs)

        call.tokens = tokens  # type: ignore[attr-defined]
        yield call


def _job_state(teams: dict[str, Any], key: str) -> tuple[str, bool]:
    desc = teams["live"].scheduler.describe(teams["handles"][key].rsplit("/", 1)[1])
    return desc.state.name, desc.cancel_requested


def test_a_team_sees_and_cancels_only_its_own_jobs(teams: dict[str, Any], api: Any) -> None:
    h, deployment = teams["handles"], teams["deployment"]
    with httpx.Client(base_url=deployment.base_url) as client:  # Airflow's own API decides the same
        headers = {"Authorization": f"Bearer {api.tokens['alice']}"}
        assert client.get("/api/v2/dags/team_b_dag", headers=headers).status_code == 403
        assert client.get("/api/v2/dags/team_a_dag", headers=headers).status_code == 200

    listed = {user: {j["handle"] for j in api(user, "GET", "api/jobs").json()["jobs"]} for user in USERS}
    assert h["a"] in listed["alice"] and not {h["b"], h["c"], h["orphan"], h["ghost"]} & listed["alice"], listed
    assert {h["b"], h["c"]} <= listed["bob"] and not {h["a"], h["orphan"], h["ghost"]} & listed["bob"], listed
    assert {h["a"], h["b"], h["orphan"], h["ghost"]} <= listed["admin"], listed

    for method, path, kwargs in (
        ("GET", "api/job", {"params": {"handle": h["b"]}}),
        ("GET", "api/log", {"params": {"handle": h["b"], "role": "worker"}}),
        ("POST", "api/cancel", {"json": {"handle": h["b"]}}),
        ("POST", "api/start-over", {"json": {"handle": h["b"]}}),
    ):
        resp = api("alice", method, path, **kwargs)
        assert resp.status_code == 403, (path, resp.text)
        assert "'alice' may not" in resp.json()["detail"] and "DAG 'team_b_dag'" in resp.json()["detail"]
        assert "Hunter2" not in resp.text
    assert _job_state(teams, "b") == ("RUNNING", False), "team A's user cancelled team B's job"
    assert api("alice", "GET", "api/job", params={"handle": h["a"]}).json()["can_cancel"] is True
    assert api("bob", "GET", "api/job", params={"handle": h["c"]}).json()["can_cancel"] is True

    orphan = api("alice", "GET", "api/job", params={"handle": h["orphan"]})
    assert orphan.status_code == 403 and "every DAG (the job has no DAG)" in orphan.json()["detail"], orphan.text
    assert api("alice", "GET", "api/job", params={"handle": h["ghost"]}).status_code == 403, "a DAG nobody has"
    for key in ("orphan", "ghost"):
        assert api("admin", "GET", "api/job", params={"handle": h[key]}).json()["can_cancel"] is True


def test_secrets_never_leave_masked(teams: dict[str, Any], api: Any) -> None:
    h = teams["handles"]
    secrets = [*ENV_SECRETS.values(), CONN_PASSWORD, VAR_SECRET, ENV_CONN_PASSWORD, ENV_VAR_SECRET]
    for user in ("bob", "admin"):
        log = api(user, "GET", "api/log", params={"handle": h["b"], "role": "worker"})
        assert log.status_code == 200, log.text
        want = "pw=*** tok=*** aws=*** conn=*** var=*** envconn=*** envvar=***"
        assert log.json()["lines"][0] == want, log.json()
        job = api(user, "GET", "api/job", params={"handle": h["b"]})
        assert job.status_code == 200 and job.json()["roles"][0]["args"][1].endswith("sleep 600 # ***"), job.text
        listed = api(user, "GET", "api/jobs").text
        for response in (log.text, job.text, listed):
            assert not [s for s in secrets if s in response], response


def _cookie(api: Any, user: str) -> dict[str, str]:
    return {"Cookie": f"_token={api.tokens[user]}"}


def test_cookie_only_cancels_need_the_same_origin_and_json(teams: dict[str, Any], api: Any) -> None:
    """A cancel, and a "Start over" (the same rule), carrying only the cookie."""
    h, base = teams["handles"], teams["deployment"].base_url
    body = json.dumps({"handle": h["c"]})
    for (headers, data, why), path in itertools.product(
        (
            (
                {"Origin": "http://evil.example", "Content-Type": "application/x-www-form-urlencoded"},
                f"handle={h['c']}",
                "from origin 'http://evil.example'",
            ),
            ({"Origin": "http://127.0.0.1:1", "Content-Type": "text/plain"}, body, "from origin 'http://127.0.0.1:1'"),
            ({"Content-Type": "application/json"}, body, "without an Origin header"),
            ({"Origin": base, "Content-Type": "text/plain"}, body, "the body must be JSON"),
        ),
        ("api/cancel", "api/start-over"),
    ):
        resp = api(
            None,
            "POST",
            path,
            headers={**_cookie(api, "bob"), **headers},
            content=data,
            params={"handle": h["c"]},
        )
        assert resp.status_code == 403 and why in resp.json()["detail"], (path, headers, resp.text)
    assert _job_state(teams, "c") == ("RUNNING", False)
    same = {**_cookie(api, "bob"), "Origin": base, "Content-Type": "application/json"}
    resp = api(None, "POST", "api/cancel", headers=same, content=body)
    assert resp.status_code == 202 and resp.json()["cancel_requested"], resp.text
    wait_until(lambda: _job_state(teams, "c")[0] == "CANCELLED", 60, "job c to be cancelled")


class _AttackerSite(http.server.ThreadingHTTPServer):
    """Serves one page (``page``) on its own port: another origin of the same site
    (127.0.0.1) and, as ``localhost``, another site."""

    page = b""


class _AttackerPage(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # http.server's name
        body = self.server.page  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def _attacker_site(target: str, handle: str) -> Iterator[int]:
    """A page that cancels ``handle`` through a form (a JSON-looking text/plain body) and a
    no-cors fetch, as a hostile page would; yields its port."""
    payload = json.dumps({"handle": handle, "pad": ""})[:-2]
    url = f"{target}/torchx/api/cancel?handle={quote(handle, safe='')}"  # the handle in both places
    page = f"""<!doctype html><html><body>
<form id="f" method="POST" action="{url}" enctype="text/plain"><input name='{payload}' value='"}}'></form>
<script>
window.attack = () => fetch({json.dumps(url)}, {{method: "POST", mode: "no-cors", credentials: "include",
  headers: {{"Content-Type": "text/plain"}}, body: JSON.stringify({{handle: {json.dumps(handle)}}})}});
</script>
</body></html>"""
    server = _AttackerSite(("127.0.0.1", free_port()), _AttackerPage)
    server.page = page.encode()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_pages_of_another_origin_cannot_cancel_in_a_browser(teams: dict[str, Any], api: Any) -> None:
    """Right after logging in (Airflow's login sets its cookie from JavaScript, without
    SameSite), a cross-site page and a same-site page on another port post a cancel: both are
    refused and the job runs on."""
    h, base = teams["handles"], teams["deployment"].base_url
    with _attacker_site(base, h["b"]) as port:
        seen = browse(
            {
                "scenario": "csrf",
                "base_url": base,
                "token": api.tokens["bob"],
                "attackers": {"cross_site": f"http://localhost:{port}/", "same_site": f"http://127.0.0.1:{port}/"},
            }
        )
    assert "error" not in seen, seen["error"]
    for name in ("cross_site", "same_site"):
        attempts = seen[name]
        assert isinstance(attempts, dict) and attempts["form"]["status"] == 403, seen
        assert "cross-origin" in attempts["form"]["detail"], seen
        assert attempts["fetch"]["status"] == 403, seen
    assert _job_state(teams, "b") == ("RUNNING", False), "a page of another origin cancelled the job"
    assert seen["jobs_calls"] >= 3 and seen["jobs_max_in_flight"] == 1, "the jobs page overlapped its calls"


def test_a_swapped_log_or_record_is_refused(teams: dict[str, Any], api: Any) -> None:
    resp = api("alice", "GET", "api/log", params={"handle": teams["handles"]["swapped"], "role": "worker"})
    assert resp.status_code == 400 and "refused: it is a symbolic link" in resp.json()["detail"], resp.text
    assert "SHADOW" not in resp.text
    swapped = teams["handles"]["swapped_record"]
    for path, params in (("api/job", {"handle": swapped}), ("api/log", {"handle": swapped, "role": "worker"})):
        resp = api("admin", "GET", path, params=params)
        assert resp.status_code == 400, (path, resp.text)
        assert "request.json is corrupt (refused: it is a symbolic link" in resp.json()["detail"], resp.text
        assert "SHADOW" not in resp.text
    assert "SHADOW" not in api("admin", "GET", "api/jobs").text  # left out, or as the index knew it


def test_no_schema_bad_values_named_and_page_headers(teams: dict[str, Any], api: Any) -> None:
    h = teams["handles"]
    for user in (None, "admin"):
        assert api(user, "GET", "openapi.json").status_code == 404
    for params, named in (
        ({"cursor": '{"stream": "combined", "offset": 1e400}'}, "cursor: "),
        ({"replica": "abc"}, "query parameter 'replica': 'abc'"),
        ({"replica": "-1"}, "query parameter 'replica': '-1'"),
    ):
        resp = api("alice", "GET", "api/log", params={"handle": h["a"], "role": "worker", **params})
        assert resp.status_code == 400 and named in resp.json()["detail"], resp.text
    page = api("alice", "GET", "")
    assert page.status_code == 200
    csp = page.headers["content-security-policy"]
    assert "frame-ancestors 'self'" in csp and "script-src 'nonce-" in csp, csp
    assert page.headers["x-content-type-options"] == "nosniff"
    assert api("alice", "GET", "api/jobs").headers["x-content-type-options"] == "nosniff"
