"""The status call a trigger makes on the triggerer's event loop for a local job whose
supervisor died, with many other processes on the host (issue 19).

A local job's status is read on the loop (``cheap_status``): ``describe`` must stay a few small
file reads even for a job whose supervisor died, whatever the host runs. The script starts
``--others`` idle processes, a 2-replica job, kills the job's supervisor, then times
``Runner.status`` of that job from inside a running event loop (``--calls`` calls), next to
the same call for a running job (the reference, same run). It then times ``finalize`` once:
the reaping (a ``/proc`` scan, kills, a store write) that runs off the loop, on the watch
pool, and that ``describe`` did itself before.

Usage: ``.venv/bin/python benchmarks/orphan_status.py [--others 2000] [--calls 200]``. Not run
by CI. The job store is a temporary directory, removed at the end with every process started.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from airflow_provider_torchx.core.runner import get_runner
from airflow_provider_torchx.core.schedulers.local import procfs, store
from airflow_provider_torchx.core.specs import AppDef, AppState, Role, parse_app_handle


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


def time_on_loop(call: Callable[[], object], calls: int) -> tuple[list[float], list[float]]:
    """Per-call wall and CPU seconds of ``call()`` made from a coroutine on a running event
    loop (CPU time: what the call itself costs, without the waits of a loaded host)."""

    async def main() -> tuple[list[float], list[float]]:
        wall, cpu = [], []
        for _ in range(calls):
            t0, c0 = time.perf_counter(), time.thread_time()
            call()
            wall.append(time.perf_counter() - t0)
            cpu.append(time.thread_time() - c0)
            await asyncio.sleep(0)
        return wall, cpu

    return asyncio.run(main())


def summary(times: tuple[list[float], list[float]]) -> str:
    parts = []
    for name, values in zip(("wall", "CPU"), times, strict=True):
        ordered = sorted(values)
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
        parts.append(f"{name} median {statistics.median(values) * 1000:.3f} ms, p99 {p99 * 1000:.3f} ms")
    return "; ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--others", type=int, default=2000, help="idle processes started on the host")
    parser.add_argument("--calls", type=int, default=200, help="status calls timed per job")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="torchx-orphan-bench-"))
    others: list[subprocess.Popen[bytes]] = []
    os.environ["AIRFLOW_TORCHX_STATE_DIR"] = str(root)
    runner = get_runner("bench")
    try:
        for _ in range(args.others):
            others.append(subprocess.Popen(["sleep", "3600"], stdin=subprocess.DEVNULL))
        print(f"{len(procfs.scan())} processes on the host")
        app = AppDef("b", roles=[Role("r", entrypoint="sh", args=["-c", "sleep 3600"], num_replicas=2)])
        orphan, running = runner.run(app, "local_cwd"), runner.run(app, "local_cwd")
        for handle in (orphan, running):
            wait_for(lambda h=handle: getattr(runner.status(h), "state", None) == AppState.RUNNING, 60, handle)
        job_dir = root / "local" / parse_app_handle(orphan).app_id
        sup = json.loads((job_dir / store.SUPERVISOR).read_text())
        procfs.signal_if_same(sup["pid"], sup["start"], signal.SIGKILL)
        wait_for(lambda: not procfs.is_alive(sup["pid"], sup["start"]), 10, "the supervisor to die")

        before = (job_dir / store.STATE).read_text()
        orphan_times = time_on_loop(lambda: runner.status(orphan), args.calls)
        status = runner.status(orphan)
        assert status is not None and status.state == AppState.FAILED, status
        assert (job_dir / store.STATE).read_text() == before, "describe wrote the store"
        running_times = time_on_loop(lambda: runner.status(running), args.calls)

        t0 = time.perf_counter()
        settled = runner.finalize(orphan)
        reap = time.perf_counter() - t0
        assert settled is not None and settled.state == AppState.FAILED, settled

        print(f"status on the loop, job whose supervisor died: {summary(orphan_times)}")
        print(f"status on the loop, running job (reference):   {summary(running_times)}")
        ratio = statistics.median(orphan_times[0]) / statistics.median(running_times[0])
        print(f"ratio (median) dead-supervisor / running: {ratio:.2f}")
        print(f"finalize (off the loop: /proc scan, kills, store write), once: {reap * 1000:.1f} ms")
    finally:
        for proc in others:
            proc.kill()
        for proc in others:
            proc.wait()
        for app in runner.list("local_cwd"):
            runner.delete(app.app_handle)
        runner.close()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
