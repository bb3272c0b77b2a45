"""What the live-deployment tests check with: a running deployment with its job store
(``LiveAirflow``) or its moto Batch queue (``LiveBatch``), a local job's record and processes,
and the replica lines of a task log read through the REST API.

The DAGs in ``dags/`` run ``utils.sh`` jobs whose replica ``k`` prints ``rk line i``; in a task
log these show as ``[sh/k] rk line i``.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import itertools
import json
import os
import re
import signal
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from airflow_provider_torchx.core.runner import Runner, get_runner
from airflow_provider_torchx.core.schedulers.local import store
from airflow_provider_torchx.core.schedulers.local.scheduler import LocalScheduler, create_cwd_scheduler
from airflow_provider_torchx.core.specs import AppStatus, parse_app_handle
from tests.e2e.deployment import AirflowDeployment, wait_until

E2E_DAGS = sorted((Path(__file__).parent / "dags").glob("*.py"))
#: The value of the Variable ``torchx_e2e_setting`` of ``live_airflow`` (a job's ``MY_PASSWORD``).
E2E_SETTING = "e2e-variable-password-5mK9"
#: ``[torchx] orphan_grace`` of ``live_airflow_heartbeat`` (seconds; the default is 30): how
#: long the reaper's loop waits after a task's end before it cancels the task's job.
ORPHAN_GRACE = 10.0
#: The Airflow line the tests run on (the pinned 3.3 or an older one, scripts/test-airflow-line.sh).
AIRFLOW_LINE = tuple(int(part) for part in importlib.metadata.version("apache-airflow").split(".")[:2])
#: How many mapped tasks the secrets DAG defers at once (``TORCHX_E2E_SECRET_TASKS`` of
#: ``live_airflow``): 50 on the pinned line, where the triggerer's capacity is the point; 8 on
#: the older lines, where the point is the path that differs there (Task SDK calls from a
#: trigger beside other triggers' messages: 8 deferred jobs with secrets crashed 3.1's
#: triggerer when that path was wrong).
SECRET_TASKS = 50 if AIRFLOW_LINE >= (3, 3) else 8
REPLICA_LINE = re.compile(r"^\[sh/(\d+)\] r\d+ line \d+$")
#: What the triggerer logs into the task log once it runs the task's trigger.
TRIGGER_STARTED = re.compile(r"^trigger .+ starting$")
_RUN_IDS = itertools.count(1)


#: A DAG file with one task that does nothing (``.format(dag_id=...)``): a DAG the UI tests
#: label their jobs with, for Airflow's access checks.
ONE_TASK_DAG = """
from airflow.sdk import DAG, task

with DAG({dag_id!r}, schedule=None):
    @task
    def job() -> None:
        pass

    job()
"""


def task_labels(dag_id: str, run_id: str, task_id: str = "job") -> dict[str, str]:
    """The labels a task instance (not mapped) gives its job: its Airflow identity."""
    return {"airflow.dag_id": dag_id, "airflow.task_id": task_id, "airflow.run_id": run_id, "airflow.map_index": "-1"}


def expected_lines(lines: int, replicas: int) -> list[str]:
    """The task-log lines the lines job (see the DAGs) writes: ``[sh/k] rk line i``."""
    return [f"[sh/{k}] r{k} line {i}" for k in range(replicas) for i in range(1, lines + 1)]


def replica_lines(events: list[str]) -> list[str]:
    """The replica output lines among a task log's events, in log order."""
    return [e for e in events if REPLICA_LINE.match(e)]


def assert_each_line_once(events: list[str], expected: list[str], where: str) -> None:
    """Every expected replica line is in the log exactly once, in order per replica, and the
    log holds no other replica line."""
    got = replica_lines(events)
    counts = Counter(got)
    wrong = {line: counts[line] for line in expected if counts[line] != 1}
    extra = sorted(set(got) - set(expected))
    assert not wrong and not extra, f"{where}: lines not exactly once {wrong}; unexpected {extra}\n" + "\n".join(
        events[-200:]
    )
    for k in {line.split("]")[0] for line in expected}:
        mine = [line for line in got if line.startswith(k + "]")]
        assert mine == [line for line in expected if line.startswith(k + "]")], f"{where}: {k}] out of order: {mine}"


@dataclass
class LiveAirflow:
    """A running deployment, its job store, and helpers for the tests' checks."""

    deployment: AirflowDeployment
    state_dir: Path
    scheduler: LocalScheduler = field(init=False)

    def __post_init__(self) -> None:
        self.scheduler = create_cwd_scheduler("e2e", state_dir=str(self.state_dir))

    def trigger(self, dag_id: str, conf: dict[str, Any]) -> str:
        """Start a run of ``dag_id`` with ``conf`` (the job's params); return its run id."""
        self.deployment.wait_for_dag(dag_id)
        run_id = f"e2e-{next(_RUN_IDS)}-{os.urandom(3).hex()}"
        self.deployment.trigger(dag_id, run_id, conf)
        return run_id

    def start_watched(self, dag_id: str, conf: dict[str, Any]) -> tuple[str, str]:
        """Start a run of ``dag_id`` (task ``job``) and wait until the task is deferred and its
        trigger is watching the job (replica lines in the log); return the run id and the job's
        handle."""
        run_id = self.trigger(dag_id, conf)
        self.deployment.wait_for_state(dag_id, run_id, "job", {"deferred"})
        handle = self.app_handle(dag_id, run_id)
        self.wait_for_log(dag_id, run_id, "deferred")
        return run_id, handle

    def app_handle(self, dag_id: str, run_id: str, timeout: float = 120) -> str:
        """The handle the task recorded (XCom ``app_handle``) once it has submitted."""
        handle: str = wait_until(
            lambda: self.deployment.xcom(dag_id, run_id, "job", "app_handle"),
            timeout,
            f"{run_id}'s app handle",
            seen=lambda: (
                f"the task is {self.deployment.task_instance(dag_id, run_id, 'job')['state']!r}"
                + self.deployment.log_tails("scheduler")
            ),
        )
        return handle

    def log(self, dag_id: str, run_id: str, try_number: int = 1) -> list[str]:
        """The events of one try's task log (REST API)."""
        return self.deployment.task_log(dag_id, run_id, "job", try_number)

    def wait_for_log(
        self, dag_id: str, run_id: str, state: str, pattern: re.Pattern[str] = REPLICA_LINE, timeout: float = 120
    ) -> int:
        """Wait until the first try's log shows events matching ``pattern`` (by default replica
        lines) while the task is still ``state`` (the log is read first, then the state);
        return how many there were."""

        def shown() -> int:
            n = sum(1 for event in self.log(dag_id, run_id) if pattern.match(event))
            ti = self.deployment.task_instance(dag_id, run_id, "job")
            assert ti["state"] == state, f"the task left {state!r} (now {ti['state']!r}) before its log showed it"
            return n

        count: int = wait_until(shown, timeout, f"{pattern.pattern!r} in {run_id}'s log while {state}")
        return count

    # ------------------------------------------------------------------ local jobs

    def job_dir(self, handle: str) -> Path:
        """The local job's directory in the deployment's job store."""
        return self.scheduler.job_dir(parse_app_handle(handle).app_id)

    def job_state(self, handle: str) -> dict[str, Any]:
        """The job's ``state.json`` as the supervisor wrote it."""
        state: dict[str, Any] = json.loads((self.job_dir(handle) / store.STATE).read_text())
        return state

    def replica_processes(self, handle: str) -> set[tuple[int, int]]:
        """``(pid, start)`` of every replica the job's record names."""
        reps = self.job_state(handle).get("replicas") or {}
        return {(r["pid"], r["start"]) for role in reps.values() for r in role if r.get("pid")}

    def long_lived_processes(self, handle: str) -> list[psutil.Process]:
        """The job's supervisor and replica processes (not their short-lived children)."""
        supervisor = json.loads((self.job_dir(handle) / store.SUPERVISOR).read_text())
        return [psutil.Process(pid) for pid in [supervisor["pid"], *(pid for pid, _ in self.replica_processes(handle))]]

    def job_processes(self, handle: str) -> list[psutil.Process]:
        """Every live process of the job: its supervisor and whatever carries the job's
        environment marker (replicas and their children)."""
        return processes_of(self.job_dir(handle))

    def cancel_jobs(self) -> list[Path]:
        """Ask every live local job to stop (returns at once); return every job's directory."""
        apps = self.scheduler.list()
        for app in apps:
            if not app.state.is_terminal():
                self.scheduler.cancel(app.app_id)
        return [self.scheduler.job_dir(app.app_id) for app in apps]

    def cleanup_jobs(self) -> None:
        """Cancel every live local job, give the cancels 15 s, then SIGKILL what is left."""
        job_dirs = self.cancel_jobs()
        if not job_dirs:
            return
        with contextlib.suppress(TimeoutError):
            wait_until(lambda: not processes_of(*job_dirs), 15, "the jobs' processes to stop")
        for proc in processes_of(*job_dirs):
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGKILL)


def still_running(procs: list[psutil.Process]) -> list[psutil.Process]:
    """Those of ``procs`` that still run (the same processes: pid and start time; zombies count
    as gone)."""
    running = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                running.append(proc)
    return running


def processes_of(*job_dirs: Path) -> list[psutil.Process]:
    """Live processes of the jobs in ``job_dirs``: those whose command line names a job
    directory (the supervisor) or whose environment holds ``AIRFLOW_TORCHX_LOCAL_JOB=<job dir>``
    (the replicas and their children)."""
    wanted = {str(d) for d in job_dirs}
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if wanted & set(proc.cmdline()) or proc.environ().get(store.JOB_ENV) in wanted:
                found.append(proc)
    return found


@dataclass
class LiveBatch:
    """A live deployment whose tasks reach the moto server, and a Batch client for checks."""

    live: LiveAirflow
    queue: str
    docker_host: str
    client: Any

    def batch_job(self, handle: str) -> dict[str, Any]:
        """DescribeJobs' view of the one Batch job behind ``handle`` (``<queue>:<job name>``)."""
        queue, _, name = parse_app_handle(handle).app_id.partition(":")
        filters = [{"name": "JOB_NAME", "values": [name]}]
        summaries = self.client.list_jobs(jobQueue=queue, filters=filters)["jobSummaryList"]
        assert len(summaries) == 1, f"{len(summaries)} Batch jobs named {name}: {summaries}"
        job: dict[str, Any] = self.client.describe_jobs(jobs=[summaries[0]["jobId"]])["jobs"][0]
        return job

    def terminate_live_jobs(self) -> None:
        """Terminate the jobs of the e2e DAGs (tagged with their dag id) that have not ended."""
        for status in ("SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING"):
            summaries = self.client.list_jobs(jobQueue=self.queue, jobStatus=status)["jobSummaryList"]
            if not summaries:
                continue
            for job in self.client.describe_jobs(jobs=[j["jobId"] for j in summaries])["jobs"]:
                if any(str(v).startswith("torchx_e2e_") for v in job.get("tags", {}).values()):
                    self.client.terminate_job(jobId=job["jobId"], reason="e2e test cleanup")

    def runner(self) -> Runner:
        """A runner in this process, against moto."""
        import boto3

        return get_runner("e2e", session=boto3.Session(region_name=self.client.meta.region_name))

    def torchx_status(self, handle: str) -> AppStatus | None:
        """The job's status as TorchX reports it."""
        return self.runner().status(handle)

    def running_containers(self, job_id: str) -> list[str]:
        """Names of the running containers moto started for the Batch job ``job_id``."""
        import docker

        client = docker.DockerClient(base_url=self.docker_host)
        try:
            return [c.name for c in client.containers.list() if job_id in c.name]
        finally:
            client.close()


#: The browser's virtualenv (``scripts/browser-venv.sh``: Playwright, driving Debian's Chromium).
BROWSER_PYTHON = Path(__file__).resolve().parents[2] / ".venv-browser" / "bin" / "python"


def browse(spec: dict[str, object]) -> dict[str, object]:
    """Run the browser scenario with the browser virtualenv's Python; return what it saw."""
    if not BROWSER_PYTHON.exists() or not Path("/usr/bin/chromium").exists():
        pytest.fail("no browser: run scripts/browser-venv.sh (Debian's chromium + Playwright in .venv-browser)")
    proc = subprocess.run(
        [str(BROWSER_PYTHON), str(Path(__file__).with_name("browser_ui.py"))],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    seen: dict[str, object] = json.loads(proc.stdout)
    return seen
