"""How long the guardrails take to act after their limit, on local jobs with faked GPUs.

For each poll interval and each path (the worker's blocking wait, the trigger on an event
loop): ``start_timeout`` on a job waiting for GPUs another job holds (act delay: the trip's
look minus submission + limit), and ``max_gpu_hours`` on a 2-GPU job (act delay: the GPU-hours
counted at the trip over the budget, in seconds of the job's two GPUs); then how long the
cancel takes to land (CANCELLED). Not run by CI.

    .venv/bin/python benchmarks/guard_latency.py [--polls 1 5] [--reps 2] [--limit 3]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import statistics
import tempfile
import time
from typing import Any

os.environ["AIRFLOW_TORCHX_LOCAL_GPUS"] = "0,1"
os.environ.setdefault("AIRFLOW_TORCHX_STATE_DIR", tempfile.mkdtemp(prefix="guard-latency-"))

from airflow_provider_torchx.core.guards import Guards
from airflow_provider_torchx.core.runner import Runner, get_runner
from airflow_provider_torchx.core.specs import AppDef, Resource, Role
from airflow_provider_torchx.triggers.torchx import TorchXJobTrigger
from airflow_provider_torchx.watch import TaskWatcher

CFG = {"auto_set_cuda_visible_devices": True}
LOG = logging.getLogger("guard-latency")


def gpu_app(name: str, gpus: int) -> AppDef:
    role = Role("g", image="local", entrypoint="sh", args=["-c", "sleep 300"], resource=Resource(1, gpus, 64))
    return AppDef(name, roles=[role])


def wait_state(runner: Runner, handle: str, want: str, timeout: float = 60) -> float:
    """Seconds until the job is in state ``want``."""
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        status = runner.status(handle)
        if status is not None and status.state.name == want:
            return time.monotonic() - began
        time.sleep(0.02)
    raise TimeoutError(f"{handle} not {want} after {timeout}s")


def watch(runner: Runner, handle: str, guards: Guards, poll: float, path: str) -> dict[str, Any]:
    if path == "worker":
        watcher = TaskWatcher(runner, handle, LOG, stream_logs=False, guards=guards)
        return watcher.wait_for_outcome(poll, None, time.time()).to_event()
    trigger = TorchXJobTrigger(
        handle,
        poll_interval=poll,
        stream_logs=False,
        host=socket.gethostname(),
        start_timeout=guards.start_timeout,
        max_gpu_hours=guards.max_gpu_hours,
    )

    async def first() -> dict[str, Any]:
        async for event in trigger.run():
            return dict(event.payload)
        raise RuntimeError("no event")

    return asyncio.run(first())


def one(runner: Runner, guard: str, poll: float, path: str, limit: float) -> tuple[float, float]:
    """(act delay, cancel landing) in seconds for one run."""
    holder = None
    if guard == "start_timeout":
        holder = runner.run(gpu_app("holder", 2), "local_cwd", CFG)
        wait_state(runner, holder, "RUNNING")
        handle = runner.run(gpu_app("waiter", 1), "local_cwd", CFG)
        status = runner.status(handle)
        assert status is not None and status.usage_so_far is not None
        submitted = status.usage_so_far.submitted
        assert submitted is not None
        event = watch(runner, handle, Guards(start_timeout=limit), poll, path)
        act = event["for_s"] - limit
    else:
        budget = 2 * limit / 3600
        handle = runner.run(gpu_app("spender", 2), "local_cwd", CFG)
        event = watch(runner, handle, Guards(max_gpu_hours=budget), poll, path)
        act = (event["gpu_hours"] - budget) * 3600 / 2
    assert event["status"] == "guardrail", event
    landed = wait_state(runner, handle, "CANCELLED")
    if holder:
        runner.cancel(holder)
        wait_state(runner, holder, "CANCELLED")
    return act, landed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--polls", type=float, nargs="+", default=[1.0, 5.0])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--limit", type=float, default=3.0)
    args = parser.parse_args()
    runner = get_runner()
    print(f"{'guard':14} {'path':8} {'poll':>5} {'act after limit (s)':>22} {'cancel lands (s)':>17}")
    for guard in ("start_timeout", "max_gpu_hours"):
        for path in ("worker", "trigger"):
            for poll in args.polls:
                runs = [one(runner, guard, poll, path, args.limit) for _ in range(args.reps)]
                acts, lands = [r[0] for r in runs], [r[1] for r in runs]
                print(
                    f"{guard:14} {path:8} {poll:5g} {statistics.mean(acts):10.2f} (max {max(acts):5.2f})"
                    f" {statistics.mean(lands):10.2f}",
                    flush=True,
                )
    print("load average:", " ".join(f"{x:.1f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
