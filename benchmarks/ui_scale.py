"""The job store at scale: 20,000 finished local jobs and 50 live ones (issue 20).

Builds such a store (one real finished job, its files cloned under new ids with spread
submission times and DAG labels; the live jobs are real ``sleep`` jobs), then measures:

1. ``GET /torchx/api/jobs`` (first page, ``limit=100``) through the plugin's app with Airflow's
   auth manager, warm (the api-server's case), median and max of 20 calls;
2. the same while six pages poll at once (six threads, each calling again when its answer came);
3. ``airflow-torchx list`` (the newest 100) and ``list --all`` from a fresh process (the
   CLI's case), median of 3, beside the command's start-up alone (``--help``);
4. the reference, measured in the same run: reading every job's ``request.json`` and
   ``state.json`` once (what a listing without the index costs at least).

Every figure is printed beside its goal (issue 20: first page < 200 ms, each polling call
< 500 ms, CLI ``list`` < 300 ms), its ratio to the reference, and the machine's load average
when it was taken (the figures scale with the load of a shared machine).

Usage: ``.venv/bin/python benchmarks/ui_scale.py [--finished 20000] [--live 50]``. Not run by
CI; everything lives in a temporary directory removed at the end (live jobs cancelled first).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DAGS = 20


def _children_cpu() -> float:
    """CPU seconds (user + system) the finished child processes used so far: what a CLI run
    costs whatever else the machine runs."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _load() -> str:
    """The 1-minute load average, printed with each figure."""
    return f"load {os.getloadavg()[0]:.2f}"


def _setup_env(root: Path) -> None:
    os.environ.update(
        {
            "AIRFLOW_HOME": str(root / "airflow"),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{root / 'airflow.db'}",
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW_TORCHX_STATE_DIR": str(root / "state"),
        }
    )
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True, capture_output=True)


def _build_store(sched: Any, finished: int, live: int) -> list[str]:
    """Clone one finished job ``finished`` times; start ``live`` sleeping jobs; return the
    live ones' ids."""
    from airflow_provider_torchx.core.schedulers.local import store
    from airflow_provider_torchx.core.schedulers.local.render import make_app_id
    from airflow_provider_torchx.core.specs import AppDef, Role

    def app(script: str) -> AppDef:
        return AppDef("bench", roles=[Role("worker", image="/", entrypoint="sh", args=["-c", script])])

    seed = sched.submit(app("echo done"), labels={"airflow.dag_id": "dag_0"})
    while not sched.describe(seed).state.is_terminal():
        time.sleep(0.05)
    seed_dir = Path(sched.store.job_dir(seed))
    rec = json.loads((seed_dir / store.REQUEST).read_text())
    state = (seed_dir / store.STATE).read_bytes()
    now = time.time()
    for i in range(finished):
        app_id = make_app_id("bench")
        job_dir = Path(sched.store.create(app_id))
        labels = {"airflow.dag_id": f"dag_{i % DAGS}", "airflow.task_id": "train", "airflow.run_id": f"run_{i}"}
        (job_dir / store.REQUEST).write_text(json.dumps(rec | {"labels": labels, "created": now - finished + i}))
        (job_dir / store.STATE).write_bytes(state)
    return [sched.submit(app("sleep 600"), labels={"airflow.dag_id": "dag_live"}) for _ in range(live)]


def _timed(call: Any, repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return times


def _reference(root: Path) -> float:
    """Reading every job's request and state files once (the floor without an index)."""
    start = time.perf_counter()
    for name in os.listdir(root):
        for f in ("request.json", "state.json"):
            with contextlib.suppress(OSError, ValueError):
                json.loads((root / name / f).read_bytes())
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--finished", type=int, default=20_000)
    parser.add_argument("--live", type=int, default=50)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="torchx-ui-scale-"))
    live: list[str] = []
    sched = None
    try:
        _setup_env(root)
        from airflow.api_fastapi.app import init_auth_manager
        from fastapi.testclient import TestClient

        from airflow_provider_torchx.core.schedulers.local.scheduler import create_cwd_scheduler
        from airflow_provider_torchx.plugins.app import create_app

        sched = create_cwd_scheduler("bench")
        t0 = time.perf_counter()
        live = _build_store(sched, args.finished, args.live)
        print(f"store: {args.finished} finished + {args.live} live jobs, built in {time.perf_counter() - t0:.0f} s")
        ref = _reference(Path(sched.store.root))
        print(f"reference: reading every job's request and state files once: {ref * 1000:.0f} ms ({_load()})")

        def figure(what: str, seconds: float, goal_ms: float | None, extra: str = "") -> None:
            goal = f"goal < {goal_ms:.0f} ms, " if goal_ms else ""
            print(f"{what}: {seconds * 1000:.0f} ms{extra} ({goal}{seconds / ref:.3f} x reference; {_load()})")

        logging.disable(logging.INFO)  # no line per request
        token = init_auth_manager().generate_jwt(_admin())
        headers = {"Authorization": f"Bearer {token}"}
        app = create_app()
        with TestClient(app) as client:

            def first_page() -> None:
                resp = client.get("/api/jobs", params={"limit": 100}, headers=headers)
                assert resp.status_code == 200 and len(resp.json()["jobs"]) == 100, resp.text[:300]

            cold = _timed(first_page, 1)[0]
            cpu_before = time.process_time()
            warm = _timed(first_page, 20)
            warm_cpu = (time.process_time() - cpu_before) / 20  # the whole process: with the renewals
            size = len(client.get("/api/jobs", params={"limit": 100}, headers=headers).content)
        figure("api/jobs first page, cold", cold, None)
        figure(
            "api/jobs first page, warm median of 20",
            statistics.median(warm),
            200,
            f" (max {max(warm) * 1000:.0f} ms; CPU {warm_cpu * 1000:.0f} ms per call)",
        )
        print(f"api/jobs first page size: {size / 1000:.0f} kB")

        stop = time.monotonic() + 10
        latencies: list[float] = []

        def poller() -> None:
            with TestClient(app) as own:
                while time.monotonic() < stop:
                    start = time.perf_counter()
                    own.get("/api/jobs", params={"limit": 100}, headers=headers)
                    latencies.append(time.perf_counter() - start)

        threads = [threading.Thread(target=poller) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        figure(
            f"six pages polling at once, per call median of {len(latencies)}",
            statistics.median(latencies),
            500,
            f" (max {max(latencies) * 1000:.0f} ms)",
        )

        cli = [str(Path(sys.executable).parent / "airflow-torchx"), "list"]
        cpu_before = _children_cpu()
        noop = _timed(lambda: subprocess.run([*cli[:1], "--help"], capture_output=True, check=True), 3)
        cpu = f" (CPU {(_children_cpu() - cpu_before) / 3 * 1000:.0f} ms per run)"
        figure("CLI start-up alone (`--help`), median of 3", statistics.median(noop), None, cpu)
        for argv, goal in ((cli, 300.0), ([*cli, "--all"], None)):
            lines = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.count("\n")
            cpu_before = _children_cpu()
            cli_times = _timed(lambda a=argv: subprocess.run(a, capture_output=True, check=True), 3)
            cpu = f" (CPU {(_children_cpu() - cpu_before) / 3 * 1000:.0f} ms per run)"
            figure(f"CLI {' '.join(argv[1:])} ({lines - 1} rows), median of 3", statistics.median(cli_times), goal, cpu)
    finally:
        if sched is not None:
            for app_id in live:
                sched.cancel(app_id)
        time.sleep(1)
        shutil.rmtree(root, ignore_errors=True)


def _admin() -> Any:
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    return SimpleAuthManagerUser(username="bench", role="admin")


if __name__ == "__main__":
    main()
