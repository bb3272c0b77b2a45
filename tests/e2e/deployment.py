"""A real Airflow deployment on loopback for end-to-end tests.

Starts ``airflow api-server``, ``scheduler``, ``dag-processor`` and ``triggerer`` as separate
processes with a fresh ``AIRFLOW_HOME``, a database of its own on PostgreSQL (as production
runs Airflow) and free ports, and drives DAGs through the REST API only, as a user would. Every
process is started in its own session and stopped (process group) by ``stop()``; components can
be stopped and restarted one by one to test restarts.

The PostgreSQL server is the one ``scripts/services.sh start`` runs (``TORCHX_TEST_POSTGRES``).
A deployment's database is a copy (``CREATE DATABASE ... TEMPLATE``) of one migrated template
per Airflow version and auth manager, so a deployment starts without ``airflow db migrate``
(``MetadataDatabases``); it is dropped when the deployment stops.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import importlib.metadata
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psutil

COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
TERMINAL_TI_STATES = {"success", "failed", "skipped", "upstream_failed", "removed"}
#: Settings of the test process's own Airflow that must not leak into the deployment.
_AIRFLOW_ENV_PREFIXES = ("AIRFLOW__", "AIRFLOW_CONN_", "AIRFLOW_VAR_", "AIRFLOW_HOME")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(
    predicate: Callable[[], Any],
    timeout: float,
    what: str,
    interval: float = 0.5,
    seen: Callable[[], object] | None = None,
) -> Any:
    """Poll ``predicate`` until it returns something truthy; on timeout fail naming ``what``
    and what was seen then: ``seen()`` where given (the state the wait is about, component
    logs), else the predicate's last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            saw: object = value
            if seen is not None:
                try:
                    saw = seen()
                except Exception as err:  # a diagnosis must not hide the timeout
                    saw = f"(could not read it: {err!r})"
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}; saw: {saw}")
        time.sleep(interval)


#: The environment variable naming the test PostgreSQL server (a SQLAlchemy URL without a
#: database), set by ``scripts/services.sh``.
POSTGRES_ENV = "TORCHX_TEST_POSTGRES"


class MetadataDatabases:
    """Airflow metadata databases on the test PostgreSQL server.

    ``create(name, env)`` gives a deployment a database of its own as a copy of the template
    for its Airflow version and auth manager (the FAB auth manager adds its own tables), which
    is migrated once, the first time a deployment needs it, and kept with the server (a later
    run on the same ``.ci/state`` reuses it). A template is built under a temporary name and
    renamed when its migration succeeded, under an advisory lock (held by the admin session
    until it closes), so a template is always whole and two test processes never build one
    twice."""

    _LOCK = 0x7470_7874  # pg_advisory_lock key of template builds

    def __init__(self, server: str) -> None:
        match = re.fullmatch(r"postgresql\+psycopg2://(?P<user>[^@/]+)@(?P<host>[^:/]+):(?P<port>\d+)/?", server)
        if match is None:
            raise RuntimeError(f"{POSTGRES_ENV}={server!r} is not postgresql+psycopg2://USER@HOST:PORT")
        self.server = server.rstrip("/")
        self._connect_args = {"user": match["user"], "host": match["host"], "port": int(match["port"])}

    @classmethod
    def from_env(cls) -> MetadataDatabases:
        """The server of ``TORCHX_TEST_POSTGRES``; a clear error when it is not set."""
        server = os.environ.get(POSTGRES_ENV)
        if not server:
            raise RuntimeError(
                f"live deployments run on PostgreSQL and {POSTGRES_ENV} is not set: start it with "
                "`bash scripts/services.sh start` and `source .ci/state/services.env`"
            )
        return cls(server)

    def url(self, name: str) -> str:
        """The SQLAlchemy URL of database ``name``."""
        return f"{self.server}/{name}"

    @contextlib.contextmanager
    def _admin(self) -> Iterator[Any]:
        import psycopg2

        con = psycopg2.connect(dbname="postgres", connect_timeout=10, **self._connect_args)
        con.autocommit = True
        try:
            with con.cursor() as cur:
                yield cur
        finally:
            con.close()

    @staticmethod
    def template_name(env: Mapping[str, str]) -> str:
        """The template of an Airflow version (the running interpreter's) and auth manager."""
        version = re.sub(r"\W", "_", importlib.metadata.version("apache-airflow"))
        auth = env.get("AIRFLOW__CORE__AUTH_MANAGER", "")
        return f"airflow_{version}_{hashlib.sha1(auth.encode()).hexdigest()[:8]}"

    def create(self, name: str, env: Mapping[str, str]) -> None:
        """Create database ``name``, migrated for ``env``'s Airflow, from its template (built
        first with ``airflow db migrate`` when there is none yet)."""
        template = self.template_name(env)
        with self._admin() as cur:
            cur.execute("SELECT pg_advisory_lock(%s)", (self._LOCK,))
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (template,))
            if cur.fetchone() is None:
                building = f"{template}_building"
                cur.execute(f'DROP DATABASE IF EXISTS "{building}"')
                cur.execute(f'CREATE DATABASE "{building}"')
                migrate = [sys.executable, "-m", "airflow", "db", "migrate"]
                done = subprocess.run(
                    migrate,
                    env={**env, "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.url(building)},
                    capture_output=True,
                    text=True,
                )
                if done.returncode != 0:
                    raise RuntimeError(f"airflow db migrate of the template {template} failed:\n{done.stderr[-3000:]}")
                cur.execute(f'ALTER DATABASE "{building}" RENAME TO "{template}"')
            cur.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')

    def drop(self, name: str) -> None:
        """Drop database ``name``, ending any session still connected to it."""
        with self._admin() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


_DATABASE_NUMBERS = itertools.count(1)


class AirflowDeployment:
    """Airflow's components as real processes under ``root``, with DAG files from ``dags``."""

    def __init__(
        self,
        root: Path,
        dags: Iterable[Path],
        env: Mapping[str, str] | None = None,
        users: Mapping[str, tuple[str, str]] | None = None,
    ) -> None:
        self.root = root
        self.home = root / "airflow"
        self.dags_folder = root / "dags"
        self.logs = root / "component-logs"
        for path in (self.home, self.dags_folder, self.logs):
            path.mkdir(parents=True, exist_ok=True)
        for dag in dags:
            shutil.copy(dag, self.dags_folder / dag.name)
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.databases = MetadataDatabases.from_env()
        self.database = f"live_{os.getpid()}_{next(_DATABASE_NUMBERS)}"
        self._database_created = False
        bin_dir = str(Path(sys.executable).parent)
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(_AIRFLOW_ENV_PREFIXES)},
            "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.databases.url(self.database),
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__BASE_URL": self.base_url,
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base_url}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "2",
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "2",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
            "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": "120",
            "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "1",
            "AIRFLOW__SCHEDULER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "10",
            # The secrets every component must share, as in any deployment of several processes:
            # left unset, each component that finds no airflow.cfg writes one with its own
            # random keys (the components start at once), and task tokens fail to verify.
            "AIRFLOW__API_AUTH__JWT_SECRET": base64.b64encode(os.urandom(32)).decode(),
            "AIRFLOW__API__SECRET_KEY": base64.b64encode(os.urandom(32)).decode(),
            "AIRFLOW__CORE__FERNET_KEY": base64.urlsafe_b64encode(os.urandom(32)).decode(),
            **(env or {}),
        }
        if users:
            # SimpleAuthManager with these users (name -> (role, password)); the API is called as
            # the first one. Without users, every request is an admin's.
            passwords = root / "passwords.json"
            passwords.write_text(json.dumps({name: pw for name, (_, pw) in users.items()}))
            self.env |= {
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(f"{n}:{r}" for n, (r, _) in users.items()),
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
            }
        self.users = dict(users or {})
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._client = httpx.Client(base_url=self.base_url, timeout=30)
        self._token: str | None = None

    # ------------------------------------------------------------------ processes

    def create_database(self) -> None:
        """Give the deployment its migrated database (once; ``start`` calls it)."""
        if not self._database_created:
            self.databases.create(self.database, self.env)
            self._database_created = True

    def start(self, components: Iterable[str] = COMPONENTS) -> None:
        """Create the database, start ``components`` and wait until the API answers."""
        self.create_database()
        for name in components:
            self.start_component(name)
        wait_until(self._api_up, 90, "the API server", seen=lambda: self.log_tails("api-server"))

    def start_component(self, name: str) -> subprocess.Popen[bytes]:
        """Start one component (``triggerer``, ...) in its own session; log to a file."""
        assert name not in self.procs or self.procs[name].poll() is not None, f"{name} is already running"
        out = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - the child keeps it open
        proc = subprocess.Popen(
            [sys.executable, "-m", "airflow", name],
            env=self.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        out.close()
        self.procs[name] = proc
        return proc

    def stop_component(self, name: str, sig: signal.Signals = signal.SIGTERM, timeout: float = 60) -> None:
        """Stop one component with ``sig`` and wait for its whole process group to exit."""
        proc = self.procs.pop(name)
        _signal_group(proc.pid, sig)
        _reap_group(proc, timeout)

    def stop(self, grace: float = 5) -> None:
        """Stop every component still running, to throw the deployment away: all are sent
        SIGTERM at once, and the process groups of those still there after ``grace`` seconds
        are SIGKILLed (an api-server that has shut down spends seconds more in the
        interpreter's last garbage collection; a scheduler waits for its running tasks)."""
        procs = list(self.procs.values())
        self.procs.clear()
        for proc in procs:
            _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in procs:
            _reap_group(proc, max(0.0, deadline - time.monotonic()))
        self._client.close()
        if self._database_created:
            self.databases.drop(self.database)
            self._database_created = False

    def started(self, pid: int) -> bool:
        """Whether ``pid`` is a component or a descendant of one (a task process of the
        LocalExecutor, say): a process this deployment may signal."""
        for proc in self.procs.values():
            with contextlib.suppress(psutil.Error):
                if pid == proc.pid or pid in {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}:
                    return True
        return False

    def component_log(self, name: str) -> str:
        """What a component printed so far (for failure messages)."""
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def log_tails(self, *names: str, lines: int = 20) -> str:
        """The last ``lines`` lines of each named component's log (all four by default), for
        the message of a wait that timed out."""
        return "".join(
            f"\n--- the {name}'s log ends:\n" + "\n".join(self.component_log(name).splitlines()[-lines:])
            for name in names or COMPONENTS
        )

    # ------------------------------------------------------------------ REST API

    def _api_up(self) -> bool:
        try:
            return self._client.get("/api/v2/version").status_code == 200
        except httpx.HTTPError:
            return False

    def api(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        """Call the REST API (``/api/v2`` + ``path``) as an admin; return the JSON answer. A
        read that times out (an api-server slowed by a loaded machine) is asked again, up to
        three times in all: it changes nothing, and the tests poll through it."""
        if self._token is None:
            self._token = self.token(next(iter(self.users), None))
        for attempt in range(1, 4):
            try:
                resp = self._client.request(
                    method,
                    "/api/v2" + path,
                    json=body,
                    headers={"Authorization": f"Bearer {self._token}", "Accept": "application/json"},
                )
                break
            except httpx.TimeoutException:
                if method != "GET" or attempt == 3:
                    raise
        if resp.status_code >= 400:
            raise RuntimeError(f"{method} {path} -> {resp.status_code}: {resp.text}")
        return resp.json() if resp.content else None

    def token(self, user: str | None = None) -> str:
        """A JWT for ``user`` (one of ``users``), or an admin's when every user is one."""
        if user is None:
            resp = self._client.get("/auth/token")
        else:
            resp = self._client.post("/auth/token", json={"username": user, "password": self.users[user][1]})
        if resp.status_code >= 400:
            raise RuntimeError(f"/auth/token for {user!r} -> {resp.status_code}: {resp.text}")
        token: str = resp.json()["access_token"]
        return token

    def wait_for_dag(self, dag_id: str, timeout: float = 120) -> None:
        """Wait until the dag-processor has parsed ``dag_id``, then unpause it."""

        def parsed() -> bool:
            try:
                self.api("GET", f"/dags/{dag_id}")
            except RuntimeError:
                return False
            return True

        wait_until(parsed, timeout, f"DAG {dag_id} to be parsed", seen=lambda: self.log_tails("dag-processor"))
        self.api("PATCH", f"/dags/{dag_id}", {"is_paused": False})

    def trigger(self, dag_id: str, run_id: str, conf: Mapping[str, Any] | None = None) -> None:
        """Start a manual DAG run (``conf`` overrides the DAG's params)."""
        self.api("POST", f"/dags/{dag_id}/dagRuns", {"dag_run_id": run_id, "logical_date": None, "conf": conf or {}})

    def task_instance(self, dag_id: str, run_id: str, task_id: str) -> dict[str, Any]:
        """The task instance as the API shows it (state, try_number, ...)."""
        ti: dict[str, Any] = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}")
        return ti

    def wait_for_state(
        self, dag_id: str, run_id: str, task_id: str, states: set[str], timeout: float = 120
    ) -> dict[str, Any]:
        """Wait until the task instance is in one of ``states``; return it. Fails at once
        when it ends in another state."""

        def reached() -> dict[str, Any] | None:
            ti = self.task_instance(dag_id, run_id, task_id)
            if ti["state"] in TERMINAL_TI_STATES and ti["state"] not in states:
                raise AssertionError(
                    f"{dag_id}.{task_id} ended {ti['state']!r}, not in {sorted(states)}; its log ends:\n"
                    + self._log_tail(dag_id, run_id, task_id, ti["try_number"])
                    + self._known_races(run_id)
                )
            return ti if ti["state"] in states else None

        try:
            result: dict[str, Any] = wait_until(reached, timeout, f"{dag_id}.{task_id} to reach {sorted(states)}")
        except TimeoutError as err:
            ti = self.task_instance(dag_id, run_id, task_id)
            tail = self._log_tail(dag_id, run_id, task_id, ti["try_number"])
            raise TimeoutError(
                f"{err}; it is {ti['state']!r}; its log ends:\n{tail}\n{self._scheduling_note(dag_id, run_id)}"
            ) from None
        return result

    def _scheduling_note(self, dag_id: str, run_id: str, lines: int = 30) -> str:
        """The run's state, the deployment's active task instances and the scheduler's last
        lines, for a task that never got where it should (was it scheduled at all?)."""
        try:
            run_state = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}")["state"]
            active = self.api("GET", "/dags/~/dagRuns/~/taskInstances?state=queued&state=running&limit=100")
            busy = [f"{t['dag_id']}.{t['task_id']} {t['state']}" for t in active["task_instances"]]
        except RuntimeError as err:
            run_state, busy = f"(unknown: {err})", []
        scheduler = "\n".join(self.component_log("scheduler").splitlines()[-lines:])
        return f"its run is {run_state!r}; queued or running: {busy}; the scheduler's log ends:\n{scheduler}"

    def deferrals_taken_in(self, run_id: str) -> set[int]:
        """The map indexes of the run whose first try's exit (a deferral, say) the scheduler has
        taken in (its "Received executor event" line). A trigger that fires before that makes
        the scheduler fail the resumed task on the stale event (apache/airflow#72716)."""
        pattern = re.compile(
            r"Received executor event with state success for task instance "
            rf"TaskInstanceKey\(.*run_id='{re.escape(run_id)}', try_number=1, map_index=(-?\d+)\)"
        )
        return {int(m[1]) for m in pattern.finditer(self.component_log("scheduler"))}

    def _known_races(self, run_id: str) -> str:
        """The scheduler's complaint when it failed a resumed deferred task because of a stale
        executor event (apache/airflow#72716, open for 3.3.x), for failure messages."""
        lines = [
            line
            for line in self.component_log("scheduler").splitlines()
            if run_id in line and "but the task instance's state attribute is" in line
        ]
        if not lines:
            return ""
        return "\nthe scheduler failed it on a stale executor event (apache/airflow#72716):\n" + "\n".join(lines)

    def _log_tail(self, dag_id: str, run_id: str, task_id: str, try_number: int, lines: int = 40) -> str:
        """The last ``lines`` events of a try's log, for failure messages."""
        try:
            return "\n".join(self.task_log(dag_id, run_id, task_id, max(try_number, 1))[-lines:])
        except RuntimeError as err:
            return f"(no log: {err})"

    def set_state(self, dag_id: str, run_id: str, task_id: str, state: str) -> None:
        """Mark the task instance ``state`` (``failed``, ``success``) as a user in the UI."""
        self.api("PATCH", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}", {"new_state": state})

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value") -> Any:
        """The value of one XCom of the task instance (``None`` when there is none)."""
        try:
            entry = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/{key}")
        except RuntimeError as err:
            if "-> 404" in str(err):
                return None
            raise
        return entry["value"]

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        """Every task instance of the run (mapped ones one by one), as the API shows them."""
        found: list[dict[str, Any]] = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances?limit=1000")[
            "task_instances"
        ]
        return found

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int, map_index: int = -1) -> list[str]:
        """The events (messages) of one try's task log, as the UI reads them."""
        return [event for _, event in self.timed_task_log(dag_id, run_id, task_id, try_number, map_index)]

    def timed_task_log(
        self, dag_id: str, run_id: str, task_id: str, try_number: int, map_index: int = -1
    ) -> list[tuple[datetime | None, str]]:
        """``task_log`` with each event's timestamp (when the component that logged it did;
        None for the log's source headers)."""
        path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}?full_content=true"
        if map_index >= 0:
            path += f"&map_index={map_index}"
        content = self.api("GET", path)["content"]
        if isinstance(content, str):
            return [(None, line) for line in content.splitlines()]
        return [
            (_timestamp(item.get("timestamp")), str(item.get("event", "")))
            if isinstance(item, dict)
            else (None, str(item))
            for item in content
        ]


def _timestamp(value: object) -> datetime | None:
    """A log event's ISO timestamp (``2026-01-01T10:00:00.123456Z``) as a datetime."""
    if not isinstance(value, str) or not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _reap_group(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Wait for a signalled component to exit (SIGKILL its group after ``timeout``), then
    SIGKILL whatever is left of its process group."""
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        _signal_group(proc.pid, signal.SIGKILL)
        proc.wait(10)
    _signal_group(proc.pid, signal.SIGKILL)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)
