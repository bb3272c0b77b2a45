"""The one watching path (``watch.py``, ``core/logstream.py``): the same exactly-once and drain
rules for the worker wait, the trigger, the sensor and the CLI; triggers that hold no thread of
the loop's default executor; a third-party scheduler that gets deferral, log streaming and
cancel through its declared capabilities alone."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_provider_torchx import watch
from airflow_provider_torchx.cancels import outside_canceller
from airflow_provider_torchx.core import cli
from airflow_provider_torchx.core.clock import Clock
from airflow_provider_torchx.core.cursors import LogPosition
from airflow_provider_torchx.core.errorfile import find_root_cause
from airflow_provider_torchx.core.errors import InvalidRunConfigError
from airflow_provider_torchx.core.identity import TaskIdentity
from airflow_provider_torchx.core.logstream import BATCH_LINES
from airflow_provider_torchx.core.runner import Runner
from airflow_provider_torchx.core.schedulers.api import CancelledBy
from airflow_provider_torchx.core.specs import AppDef, AppState, Resource, Role
from airflow_provider_torchx.hooks.torchx import close_runners
from airflow_provider_torchx.operators import checks
from airflow_provider_torchx.operators.torchx import TorchXRunOperator
from airflow_provider_torchx.outcome import End, Outcome
from airflow_provider_torchx.sensors.torchx import TorchXJobSensor
from airflow_provider_torchx.triggers.torchx import TorchXJobTrigger
from airflow_provider_torchx.watch import TaskWatcher, cursor_file_for, flush_logs

#: More lines than one poll reads (``BATCH_LINES`` per replica), half of them written while
#: the job runs and half just before it ends (the drain rule).
CHATTY = 200_000
CHATTY_SCRIPT = f"seq 1 {CHATTY // 2}; sleep 1.5; seq {CHATTY // 2 + 1} {CHATTY}"
TASK = TaskIdentity("d", "t", "r")
IDENTITY = TASK.labels()


class ListLog:
    """A logger stand-in keeping every formatted message."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, msg: str, *args: Any) -> None:
        self.lines.append(msg % args if args else msg)

    warning = error = debug = exception = info


def sh_app(script: str, name: str = "watch") -> AppDef:
    return AppDef(name=name, roles=[Role(name="w", image="local", entrypoint="sh", args=["-c", script])])


def context() -> dict[str, Any]:
    ti = SimpleNamespace(dag_id="d", task_id="t", run_id="r", map_index=-1, try_number=1, xcom_push=lambda **_: None)
    return {"ti": ti}


def replica_lines(lines: list[str], replica: str = "w/0") -> list[str]:
    prefix = f"[{replica}] "
    return [line[len(prefix) :] for line in lines if line.startswith(prefix)]


# ---------------------------------------------------------------------- the four watchers


def racing_clock() -> Clock:
    """A clock whose monotonic time runs 10 s further ahead at each reading."""
    looks = itertools.count(1)
    return Clock(monotonic=lambda: time.monotonic() + 10 * next(looks))


def watch_in_worker(runner: Runner, handle: str) -> list[str]:
    log = ListLog()
    operator = TorchXRunOperator(task_id="t", app=sh_app("true"), scheduler="local_cwd", poll_interval=0.3)
    cursor_file = cursor_file_for(runner, handle, TASK)
    watcher = TaskWatcher(runner, handle, log, stream_logs=True, cursor_file=cursor_file, clock=racing_clock())
    outcome = operator._wait_in_worker(watcher, time.time(), None)
    assert outcome.end is End.SUCCESS, outcome
    return log.lines


def watch_deferred(runner: Runner, handle: str) -> list[str]:
    """The trigger, then ``execute_complete``'s flush (what a deferred task logs in all)."""
    log = ListLog()
    trigger = TorchXJobTrigger(handle, poll_interval=0.3, identity=IDENTITY, log_cursors={})
    trigger._log = log

    async def collect() -> list[dict[str, Any]]:
        return [e.payload async for e in trigger.run()]

    (event,) = asyncio.run(collect())
    assert event["status"] == "success", event
    flush_logs(runner, Outcome.from_event(event), log, cursor_file_for(runner, handle, TASK))
    return log.lines


def watch_with_sensor(runner: Runner, handle: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    log = ListLog()
    monkeypatch.setattr(TorchXJobSensor, "log", log)
    sensor = TorchXJobSensor(
        task_id="t", app_handle=handle, stream_logs=True, poke_interval=0.3, deferrable=False, torchx_conn_id=None
    )
    deadline = time.monotonic() + 120
    while not sensor.poke(context()):
        assert time.monotonic() < deadline
        time.sleep(0.3)
    return log.lines


def watch_with_cli(runner: Runner, handle: str, capsys: pytest.CaptureFixture[str]) -> list[str]:
    capsys.readouterr()
    assert cli._attach(runner, handle, stream_logs=True, poll_interval=0.3, mask=str) == cli.EXIT_OK
    return capsys.readouterr().out.splitlines()


@pytest.mark.parametrize("watcher", ["worker", "trigger", "sensor", "cli"])
def test_chatty_job_every_line_once_in_order(
    watcher: str,
    local_jobs: tuple[Runner, list[str]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """200,000 lines (200 polls' worth), half while the job runs, half at its end: each of
    the four watchers logs every line exactly once, in order. The drain has no time limit:
    the worker's holds with its clock running 10 s ahead at each reading (the rule itself:
    ``tests/core/test_watch_rules.py``)."""
    assert CHATTY > 100 * BATCH_LINES
    runner, handles = local_jobs
    handle = runner.run(sh_app(CHATTY_SCRIPT), "local_cwd")
    handles.append(handle)
    watch: dict[str, Callable[[], list[str]]] = {
        "worker": lambda: watch_in_worker(runner, handle),
        "trigger": lambda: watch_deferred(runner, handle),
        "sensor": lambda: watch_with_sensor(runner, handle, monkeypatch),
        "cli": lambda: watch_with_cli(runner, handle, capsys),
    }
    logged = replica_lines(watch[watcher]())
    assert len(logged) == CHATTY, f"{len(logged)} lines logged, expected {CHATTY}"
    assert logged == [str(i) for i in range(1, CHATTY + 1)]


class TimedLog(ListLog):
    """A ``ListLog`` that also keeps when (``time.monotonic()``) each message was logged."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def info(self, msg: str, *args: Any) -> None:
        super().info(msg, *args)
        self.times.append(time.monotonic())

    warning = error = debug = exception = info


def trigger_event(handle: str, log: ListLog) -> tuple[dict[str, Any], float]:
    """Run a trigger for ``handle`` logging into ``log``; its one event and when it came."""
    trigger = TorchXJobTrigger(handle, poll_interval=0.3, identity=IDENTITY, log_cursors={})
    trigger._log = log

    async def collect() -> list[dict[str, Any]]:
        return [e.payload async for e in trigger.run()]

    (event,) = asyncio.run(collect())
    return event, time.monotonic()


def test_trigger_leaves_an_ended_jobs_lines_to_the_resumed_task(local_jobs: tuple[Runner, list[str]]) -> None:
    """The round that finds the job ended logs nothing (the triggerer closes the task's trigger
    log when the event is yielded, so a line logged then would miss it): a job that ended
    before its trigger started gets no line from the trigger, and the event's position lets
    ``flush_logs`` (``execute_complete``) log every line, once."""
    runner, handles = local_jobs
    handle = runner.run(sh_app("seq 1 50"), "local_cwd")
    handles.append(handle)
    status = runner.wait(handle, wait_interval=0.1, timeout=60, cancel_on_signal=False)
    assert status is not None and status.state == AppState.SUCCEEDED
    log = ListLog()
    event, _ = trigger_event(handle, log)
    assert event["status"] == "success", event
    assert log.lines == [], f"the trigger logged {log.lines}"
    assert event["cursor_seq"] == 0 and event["log_cursors"] == {}, event
    cursor_file = cursor_file_for(runner, handle, TASK)
    flush_logs(runner, Outcome.from_event(event), log, cursor_file)
    assert replica_lines(log.lines) == [str(i) for i in range(1, 51)]
    flush_logs(runner, Outcome.from_event(event), log, cursor_file)  # a second flush (a retried resume) adds nothing
    assert replica_lines(log.lines) == [str(i) for i in range(1, 51)]


def test_trigger_lines_have_time_to_arrive_before_its_event(local_jobs: tuple[Runner, list[str]]) -> None:
    """A job that logs while watched and again just before it ends: every line the trigger
    logged (lines, progress) precedes its event by at least the settle time, and the trigger's
    lines then the flush's are every line once, in order."""
    runner, handles = local_jobs
    handle = runner.run(sh_app("seq 1 3; sleep 1.5; seq 4 6"), "local_cwd")
    handles.append(handle)
    log = TimedLog()
    event, at = trigger_event(handle, log)
    assert event["status"] == "success", event
    from_trigger = list(log.lines)
    assert replica_lines(from_trigger)[:3] == ["1", "2", "3"], from_trigger
    settle = min(0.3, watch.LOG_SETTLE)
    assert at - log.times[-1] >= settle, f"last trigger line {at - log.times[-1]:.3f}s before the event"
    flush_logs(runner, Outcome.from_event(event), log, cursor_file_for(runner, handle, TASK))
    assert replica_lines(log.lines) == [str(i) for i in range(1, 7)]


# ---------------------------------------------------------------------- no default executor


@contextlib.contextmanager
def blocked_default_executor(loop: asyncio.AbstractEventLoop) -> Iterator[None]:
    """The loop's default executor cut to one thread, held by a call that waits until the end:
    whatever needs it waits forever."""
    release = threading.Event()
    executor = ThreadPoolExecutor(max_workers=1)
    loop.set_default_executor(executor)
    blocker = loop.run_in_executor(None, release.wait)
    try:
        yield
    finally:
        release.set()
        executor.shutdown(wait=True)
        blocker.cancel()


def run_triggers(
    triggers: list[TorchXJobTrigger], timeout: float, during: Callable[[], None] | None = None
) -> list[Any]:
    """Run the triggers on one loop whose default executor is blocked; return each one's events."""

    async def main() -> list[Any]:
        with blocked_default_executor(asyncio.get_running_loop()):

            async def collect(trigger: TorchXJobTrigger) -> list[dict[str, Any]]:
                trigger._log = ListLog()
                return [e.payload async for e in trigger.run()]

            tasks = [asyncio.create_task(collect(t)) for t in triggers]
            if during is not None:
                await asyncio.sleep(2.0)
                await asyncio.get_running_loop().run_in_executor(ThreadPoolExecutor(1), during)
            return list(await asyncio.wait_for(asyncio.gather(*tasks), timeout))

    return asyncio.run(main())


@pytest.mark.airflow_line  # a trigger beside the triggerer's channel
@pytest.mark.usefixtures("triggerer_channel")
def test_100_local_triggers_need_no_default_executor(local_jobs: tuple[Runner, list[str]]) -> None:
    runner, handles = local_jobs
    for n in range(100):
        handles.append(runner.run(sh_app(f"echo job {n}", name=f"many{n}"), "local_cwd"))
    triggers = [TorchXJobTrigger(h, poll_interval=1.0, host=socket.gethostname()) for h in handles]
    results = run_triggers(triggers, timeout=180)
    for n, (trigger, events) in enumerate(zip(triggers, results, strict=True)):
        assert [e["status"] for e in events] == ["success"], events
        flush_logs(runner, Outcome.from_event(events[0]), trigger._log)  # then execute_complete's, in the worker
        assert replica_lines(trigger._log.lines) == [f"job {n}"]


@pytest.mark.airflow_line  # a trigger beside the triggerer's channel
@pytest.mark.usefixtures("triggerer_channel")
@pytest.mark.docker
def test_100_batch_triggers_need_no_default_executor(aws_env: str, batch_queue: str) -> None:
    """100 Batch jobs kept PENDING (each depends on a job that never ends), watched by 100
    triggers on one loop, then cancelled: every trigger reports the end; the poller batched."""
    import boto3

    from airflow_provider_torchx.core.schedulers.aws_batch import create_scheduler
    from airflow_provider_torchx.core.schedulers.aws_batch.render import queue_name

    batch = boto3.client("batch")
    sched = create_scheduler("torchx", client=batch)
    app = AppDef("pend", roles=[Role("main", image="busybox:local", entrypoint="true", resource=Resource(1, 0, 64))])
    handles = []
    for _ in range(100):
        job = sched.submit_dryrun(app, {"queue": batch_queue}).request
        arn = batch.register_job_definition(**job.job_def)["jobDefinitionArn"]
        batch.submit_job(jobDefinition=arn, dependsOn=[{"jobId": "never-finishes"}], **job.submit_request())
        handles.append(f"aws_batch://torchx/{queue_name(batch_queue)}:{job.name}")
    triggers = [TorchXJobTrigger(h, poll_interval=1.0, stream_logs=False) for h in handles]
    runner = triggers[0]._runner(None)

    def cancel_all() -> None:  # in parallel: each cancel waits for a poller round
        with ThreadPoolExecutor(max_workers=len(handles)) as pool:
            list(pool.map(runner.cancel, handles))

    try:
        results = run_triggers(triggers, timeout=120, during=cancel_all)
    finally:
        cancel_all()
    for events in results:
        assert len(events) == 1 and events[0]["state"] in ("CANCELLED", "FAILED"), events


# ---------------------------------------------------------------------- a third-party scheduler


@pytest.fixture
def acme(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The ``acme`` scheduler of ``tests/plugin`` registered through the entry point group (a
    ``*.dist-info`` on ``sys.path``, as an installed plugin package has); its jobs' dir."""
    dist = tmp_path / "site" / "acme_scheduler-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-scheduler\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[airflow_provider_torchx.schedulers]\nacme = tests.plugin.acme_scheduler:create_scheduler\n"
        "[airflow_provider_torchx.run_options]\nacme = tests.plugin.acme_options:run_opts\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("ACME_JOBS_DIR", str(tmp_path / "jobs"))
    monkeypatch.setenv("AIRFLOW_CONN_TORCHX_ACME", '{"conn_type": "torchx", "extra": {"scheduler": "acme"}}')
    parse_caches = (checks._entry_points, checks._entry_point_names, checks.declared_run_opts)
    for cache in parse_caches:  # read once per process: this process registered acme just now
        cache.cache_clear()
    close_runners()  # none an earlier DAG run's threads built before acme was registered
    yield tmp_path / "jobs"
    for cache in parse_caches:
        cache.cache_clear()
    close_runners()


def test_third_party_scheduler_defers_streams_and_senses(
    acme: Path, run_dag: Any, caplog: pytest.LogCaptureFixture
) -> None:
    dag_run, out = run_dag("torchx_test_thirdparty", deferrable=True)
    assert dag_run.state == "success", out[-3000:]
    # One job per operator; the sensor streams the submitted one, the deferred task its own.
    assert len(list(acme.iterdir())) == 2
    # Both tasks deferred; the trigger, then the resumed task, logged each line once per task.
    assert caplog.text.count("[DAG TEST] running trigger in line") == 2, caplog.text[-3000:]
    for n in (1, 2, 3):
        found = re.findall(rf"\[main/0\] acme {n}\s+\[", out)
        assert len(found) == 2, out[-3000:]


@pytest.mark.airflow_line  # a trigger beside the triggerer's channel
@pytest.mark.usefixtures("triggerer_channel")
def test_third_party_scheduler_cancel_on_kill(acme: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_torchx.hooks.torchx import TorchXHook
    from airflow_provider_torchx.triggers import torchx as triggers

    state, answered = ["deferred"], []  # the start check's answer; the kill's: "failed" (marked so)

    async def task_state(ident: Any) -> str:
        answered.append(state[0])
        return state[0]

    monkeypatch.setattr(triggers, "task_instance_state", task_state)

    runner = TorchXHook(None, scheduler="acme").get_runner()
    handle = runner.run(sh_app("echo started; sleep 60"), "acme")
    hook = TorchXHook(None, scheduler="acme")
    trigger = TorchXJobTrigger.for_job(
        handle,
        runner,
        hook.settings,
        poll_interval=0.2,
        stream_logs=True,
        position=LogPosition(),
        identity=IDENTITY,
        deadline=None,
        started_at=time.time(),
        cancel_on_kill=True,
    )
    assert trigger.host == socket.gethostname()  # declared host-bound: no name check
    trigger._log = ListLog()

    async def main() -> None:
        task = asyncio.create_task(anext(trigger.run()))
        while not replica_lines(trigger._log.lines, "main/0") or not answered:  # the start check asked
            await asyncio.sleep(0.05)
        state[0] = "failed"
        await trigger.on_kill()  # the deferred task was marked failed
        event = await asyncio.wait_for(task, 30)
        assert event.payload["state"] == "CANCELLED"

    asyncio.run(main())
    status = runner.status(handle)
    assert status is not None and status.state == AppState.CANCELLED
    assert replica_lines(trigger._log.lines, "main/0") == ["started"]
    desc = runner.describe_app(handle)
    assert desc is not None and desc.cancel_reason == "task d.t of run r was marked failed", desc
    assert desc.cancelled_by == CancelledBy.TASK, desc  # the plugin keeps who asked
    assert outside_canceller(desc) is None  # the task's own cancel: a retry is not refused


def test_third_party_scheduler_gets_root_causes_from_its_error_files(acme: Path) -> None:
    """``acme`` declares ``error_files``: the failed job's root cause is read from the error
    file its replica wrote (``TORCHELASTIC_ERROR_FILE``), as for a local job."""
    from airflow_provider_torchx.hooks.torchx import TorchXHook

    runner = TorchXHook(None, scheduler="acme").get_runner()
    error = '{"message": {"message": "RuntimeError: acme boom", "extraInfo": {"py_callstack": "", "timestamp": "1"}}}'
    handle = runner.run(sh_app(f"echo '{error}' > \"$TORCHELASTIC_ERROR_FILE\"; exit 3"), "acme")
    status = runner.wait(handle, wait_interval=0.1, timeout=60)
    assert status is not None and status.state == AppState.FAILED, status
    cause = find_root_cause(runner, handle, status)
    assert cause is not None and cause.error == "RuntimeError: acme boom" and cause.replica == "main/0", cause


def test_third_party_scheduler_cfg_is_checked_when_the_dag_is_parsed(acme: Path) -> None:
    """``acme`` declares its run options (entry point group ``airflow_provider_torchx.run_options``):
    a literal ``cfg`` with an unknown key fails the operator's ``__init__``, naming the closest
    option, without loading the scheduler."""
    import sys

    sys.modules.pop("tests.plugin.acme_scheduler", None)
    with pytest.raises(InvalidRunConfigError, match=r"shel.*shell"):
        TorchXRunOperator(task_id="t", app=sh_app("true"), scheduler="acme", cfg={"shel": "bash"})
    with pytest.raises(InvalidRunConfigError, match=r"shel.*shell"):
        TorchXRunOperator(task_id="t", app=sh_app("true"), scheduler="acme", cfg="shel=bash")
    TorchXRunOperator(task_id="t", app=sh_app("true"), scheduler="acme", cfg={"shell": "bash"})
    assert "tests.plugin.acme_scheduler" not in sys.modules


# ---------------------------------------------------------------------- shared state


def test_watch_pool_size_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_torchx import watch

    monkeypatch.setenv("AIRFLOW__TORCHX__WATCH_THREADS", "3")
    assert watch.watch_threads() == 3
    monkeypatch.setenv("AIRFLOW__TORCHX__WATCH_THREADS", "0")
    with pytest.raises(ValueError, match=r"\[torchx\] watch_threads: 0 must be >= 1"):
        watch.watch_threads()
    monkeypatch.delenv("AIRFLOW__TORCHX__WATCH_THREADS")
    assert watch.watch_threads() == watch.DEFAULT_WATCH_THREADS


def test_runner_cache_is_shared_and_can_be_closed() -> None:
    from airflow_provider_torchx.hooks.torchx import TorchXHook

    hook = TorchXHook(None, scheduler="local_cwd", session_name="cache-test")
    first = hook.get_runner()
    assert TorchXHook(None, scheduler="local_cwd", session_name="cache-test").get_runner() is first
    first.scheduler_run_opts("local_cwd")  # makes its scheduler
    close_runners()
    assert first._schedulers == {} and hook.get_runner() is not first  # closed and forgotten
