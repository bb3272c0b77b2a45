"""Stand-ins for the Airflow objects an operator reads outside a task run (the task instance,
the AIP-103 task state store) and small helpers shared by the Airflow tests."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from airflow_provider_torchx.core.specs import AppDef, AppState, Resource, Role, macros


class FakeTI:
    """The task-instance attributes the operator reads, and the XComs it pushes."""

    def __init__(
        self, try_number: int = 1, map_index: int = -1, run_id: str = "manual__2024-01-01T00:00:00+00:00"
    ) -> None:
        self.dag_id, self.task_id, self.run_id = "dag", "task", run_id
        self.map_index, self.try_number = map_index, try_number
        self.xcoms: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[key] = value


#: The local ledger hands out GPUs only with this run option.
CFG = {"auto_set_cuda_visible_devices": True}


def gpu_app(name: str, gpus: int, seconds: int = 60) -> AppDef:
    """One replica asking for ``gpus`` GPUs that prints its devices, then sleeps."""
    script = f'echo "devices $CUDA_VISIBLE_DEVICES"; sleep {seconds}'
    return AppDef(
        name=name,
        roles=[Role("g", image="local", entrypoint="sh", args=["-c", script], resource=Resource(1, gpus, 64))],
    )


class Counter:
    """The stats client's ``incr`` calls (the ``two_gpus`` fixture's)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, str]]] = []

    def incr(self, name: str, tags: dict[str, str] | None = None, **_: Any) -> None:
        self.calls.append((name, dict(tags or {})))

    def of(self, name: str) -> list[dict[str, str]]:
        """The tags of the ``name`` counts."""
        return [tags for called, tags in self.calls if called == name]

    def __getattr__(self, name: str) -> Any:  # timing, gauge: not counted here
        return lambda *a, **k: None


def ended(runner: Any, handle: str) -> AppState:
    """The state the job ends in (a cancel is delivered, then lands)."""
    status = wait_until(lambda: (s := runner.status(handle)) and s.is_terminal() and s, what=f"{handle} to end")
    return AppState(status.state)


class FakeTaskStateStore:
    """``context["task_state_store"]`` (Airflow >= 3.3) kept in a dict."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def set(self, key: str, value: Any, **kwargs: Any) -> None:
        self.values[key] = value


def wait_until(condition: Callable[[], Any], timeout: float = 30, what: str = "a condition") -> Any:
    """Poll ``condition`` until it is truthy; return its value or fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def gated_app(directory: str, num_replicas: int = 1, name: str = "gated") -> AppDef:
    """Each replica records its pid in ``<directory>/pids-<k>``, writes ``w<k> line 1..2``,
    waits for the file ``<directory>/gate``, then writes ``w<k> line 3..4``."""
    k = macros.replica_id
    script = (
        f"echo $$ >> {directory}/pids-{k}; echo w{k} line 1; echo w{k} line 2; "
        f"while [ ! -e {directory}/gate ]; do sleep 0.05; done; echo w{k} line 3; echo w{k} line 4"
    )
    return AppDef(
        name=name,
        roles=[Role(name="w", image="local", entrypoint="sh", args=["-c", script], num_replicas=num_replicas)],
    )


def gated_lines(num_replicas: int = 1, upto: int = 4) -> list[str]:
    """The task-log lines ``gated_app`` writes, ``[w/k] wk line i``."""
    return [f"[w/{k}] w{k} line {i}" for k in range(num_replicas) for i in range(1, upto + 1)]


def run_deferred(trigger: Any, log: Any = None) -> list[dict[str, Any]]:
    """What a deferred task logs in all: run ``trigger`` (a ``TorchXJobTrigger``) to its end,
    then, as ``execute_complete`` does, flush what its event's position left (the lines the
    job wrote once the trigger saw it end) into ``log`` (default: the trigger's own logger).
    Returns the trigger's events."""
    import asyncio

    from airflow_provider_torchx.core.identity import TaskIdentity
    from airflow_provider_torchx.outcome import Outcome
    from airflow_provider_torchx.watch import cursor_file_for, flush_logs

    async def collect() -> list[dict[str, Any]]:
        return [event.payload async for event in trigger.run()]

    events = asyncio.run(collect())
    runner = trigger._runner(None)
    ident = TaskIdentity.from_labels(trigger.identity or {})
    cursor_file = cursor_file_for(runner, trigger.app_handle, ident) if ident is not None else None
    for event in events:
        if event.get("log_cursors") is not None:
            flush_logs(runner, Outcome.from_event(event), trigger.log if log is None else log, cursor_file)
    return events


def refuse_record(runner: Any, handle: str, how: str, elsewhere: Any) -> list[tuple[int, int]]:
    """Swap the running job's ``state.json`` (``how`` "state") or its directory ("dir") for a
    symbolic link, atomically; return the ``(pid, start)`` of its supervisor and replicas."""
    from airflow_provider_torchx.core.schedulers.local import store
    from airflow_provider_torchx.core.specs import parse_app_handle
    from tests.fixtures.files import swap_dir_for_symlink, swap_file_for_symlink

    sched: Any = runner._scheduler("local_cwd")
    app_id = parse_app_handle(handle).app_id
    deadline = time.monotonic() + 30
    while (st := runner.status(handle)) is None or st.state != AppState.RUNNING:
        assert time.monotonic() < deadline, st
        time.sleep(0.05)
    st = json.loads((sched.job_dir(app_id) / store.STATE).read_text())
    sup = json.loads((sched.job_dir(app_id) / store.SUPERVISOR).read_text())
    processes = [(sup["pid"], sup["start"])] + [(r["pid"], r["start"]) for rs in st["replicas"].values() for r in rs]
    if how == "state":
        (elsewhere / "state.json").write_text(json.dumps(st))
        swap_file_for_symlink(sched.job_dir(app_id) / store.STATE, elsewhere / "state.json")
    else:
        swap_dir_for_symlink(sched.job_dir(app_id), elsewhere / "moved")
    return processes


def still_running(processes: list[tuple[int, int]]) -> list[int]:
    from airflow_provider_torchx.core.schedulers.local import procfs

    return [pid for pid, start in processes if procfs.start_time(pid) == start]
