"""The trigger's cursor file and cancelling while deferred, with real local jobs and triggers
run directly on an event loop: a triggerer restart resumes the log from the saved position
(each line once) and never cancels; on Airflow < 3.3 a cancelled trigger cancels the job only
when the table says so (``orphans.decide``, killed: the task instance ended; not while it is
still deferred, cleared or unreadable; ``get_task_states`` stubbed)."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_torchx import watch
from airflow_provider_torchx.cancels import outside_canceller
from airflow_provider_torchx.core.identity import TaskIdentity
from airflow_provider_torchx.core.runner import Runner
from airflow_provider_torchx.core.schedulers.api import CancelledBy
from airflow_provider_torchx.core.specs import AppDef, AppState, Role
from airflow_provider_torchx.orphans import task_name
from airflow_provider_torchx.triggers import torchx as triggers
from airflow_provider_torchx.triggers.torchx import TorchXJobTrigger, task_instance_state
from airflow_provider_torchx.watch import cursor_file_for
from tests.airflow.helpers import gated_app, gated_lines, run_deferred, wait_until
from tests.fixtures.airflow import assert_lines_once

#: Every trigger here talks to a stand-in of the triggerer's channel that fails a synchronous send.
# airflow_line: the pre-3.3 cancel while deferred.
pytestmark = [pytest.mark.usefixtures("triggerer_channel"), pytest.mark.airflow_line]

TASK = TaskIdentity("dag", "task", "manual__cursor-tests")
IDENTITY = TASK.labels()
SLEEP = AppDef(name="sleeper", roles=[Role(name="s", image="local", entrypoint="sleep", args=["60"])])


def submit(local_jobs: tuple[Runner, list[str]], app: AppDef) -> str:
    runner, handles = local_jobs
    handle = runner.run(app, "local_cwd", labels=IDENTITY)
    handles.append(handle)
    return handle


def trigger_for(handle: str, **kwargs: Any) -> TorchXJobTrigger:
    """The trigger the operator defers to, as the triggerer rebuilds it from its kwargs."""
    kwargs = {"poll_interval": 0.1, "identity": IDENTITY, "host": socket.gethostname(), **kwargs}
    return TorchXJobTrigger(**TorchXJobTrigger(handle, **kwargs).serialize()[1])


async def run_then_cancel(trigger: TorchXJobTrigger, until: Any) -> None:
    """Run ``trigger`` until ``until()`` holds, then cancel it as a triggerer does on
    shutdown (or, before Airflow 3.3, when the task is killed); wait for it to finish."""

    async def consume() -> None:
        async for event in trigger.run():
            raise AssertionError(f"unexpected event {event.payload}")

    task = asyncio.create_task(consume())
    while not until():
        assert not task.done(), task
        await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def run_to_end(trigger: TorchXJobTrigger) -> list[dict[str, Any]]:
    async def collect() -> list[dict[str, Any]]:
        return [event.payload async for event in trigger.run()]

    return asyncio.run(collect())


class TaskStates:
    """A stand-in for the Task SDK's ``get_task_states``: the trigger's check when it starts
    (``started``) finds the task deferred, as a triggerer does; later calls (``calls``) are
    answered ``answer`` (a state, or an exception to raise) for any task instance."""

    def __init__(self) -> None:
        self.answer: Any = "deferred"
        self.started: list[tuple[str, str, str, int]] = []
        self.calls: list[tuple[str, str, str, int]] = []

    async def __call__(self, dag_id: str, task_id: str, run_id: str, map_index: int) -> dict[str, Any]:
        if not self.started:
            self.started.append((dag_id, task_id, run_id, map_index))
            return {run_id: {task_id: "deferred"}}
        self.calls.append((dag_id, task_id, run_id, map_index))
        if isinstance(self.answer, Exception):
            raise self.answer
        return {run_id: {task_id: self.answer}}


@pytest.fixture
def pre_33(monkeypatch: pytest.MonkeyPatch) -> TaskStates:
    """Behave as on Airflow < 3.3 (no ``BaseTrigger.on_kill``), with stubbed task states."""
    stub = TaskStates()
    monkeypatch.setattr(triggers, "TRIGGER_HAS_ON_KILL", False)
    monkeypatch.setattr(triggers, "get_task_states", stub)
    return stub


def test_a_restarted_trigger_resumes_from_the_cursor_file_and_logs_each_line_once(
    local_jobs: tuple[Runner, list[str]], tmp_path: Path, capfd: pytest.CaptureFixture[str], pre_33: TaskStates
) -> None:
    runner, _ = local_jobs
    handle = submit(local_jobs, gated_app(str(tmp_path), 2))
    cursor_file = cursor_file_for(runner, handle, TASK)

    def saved_lines_1_2() -> bool:
        position = cursor_file.load()
        return (
            position is not None
            and set(position.cursors) == {"w/0", "w/1"}
            and all(
                len(runner.read_log(handle, "w", k).lines) == 2
                and not runner.read_log(handle, "w", k, cursor=position.cursors[f"w/{k}"]).lines
                for k in (0, 1)
            )
        )

    # The first triggerer logs lines 1-2 of both replicas, then shuts down (SIGTERM).
    asyncio.run(run_then_cancel(trigger_for(handle, cancel_on_kill=True), saved_lines_1_2))
    first = capfd.readouterr().out
    assert pre_33.calls == [("dag", "task", "manual__cursor-tests", -1)]  # asked; still deferred
    assert "leaving" in first and "(task instance still deferred: a triggerer restart or reassignment)" in first
    saved = cursor_file.load()
    assert saved is not None and saved.seq >= 1
    # A new triggerer rebuilds the trigger from the same kwargs (seq 0) and finds the file.
    (tmp_path / "gate").touch()
    (event,) = run_deferred(trigger_for(handle, cancel_on_kill=True))
    second = capfd.readouterr().out
    assert event["status"] == "success" and event["cursor_seq"] >= saved.seq
    assert f"Resuming the log of {handle} from its saved position #{saved.seq}" in second
    assert_lines_once(first + second, gated_lines(2))  # the second trigger's lines, then the flush's
    done = cursor_file.load()
    assert done is not None and done.seq > saved.seq and done.seq >= event["cursor_seq"]


def test_a_trigger_cancelled_before_its_save_ran_saves_what_it_logged(
    local_jobs: tuple[Runner, list[str]], tmp_path: Path, pre_33: TaskStates, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A triggerer stopped after the trigger logged a batch and before its save ran (queued
    for a thread, which a cancelled future never runs): the cursor file still ends up past
    that batch, so the next trigger never logs its lines again (a live 3.1 run logged a line
    twice so)."""
    runner, _ = local_jobs
    handle = submit(local_jobs, gated_app(str(tmp_path), 2))
    cursor_file = cursor_file_for(runner, handle, TASK)
    run_blocking = watch.run_blocking
    held: list[Any] = []

    async def saves_never_run(fn: Any, *args: Any) -> Any:
        if getattr(fn, "__name__", "") == "save":
            held.append(fn)
            await asyncio.Event().wait()  # still queued when the triggerer stops
        return await run_blocking(fn, *args)

    monkeypatch.setattr(watch, "run_blocking", saves_never_run)
    asyncio.run(run_then_cancel(trigger_for(handle, cancel_on_kill=True), lambda: bool(held)))
    saved = cursor_file.load()  # no save ran but the one made as the trigger was cancelled
    assert saved is not None and saved.seq >= 1 and saved.cursors, saved


def test_kwargs_newer_than_the_file_win(
    local_jobs: tuple[Runner, list[str]], capfd: pytest.CaptureFixture[str]
) -> None:
    from airflow_provider_torchx.core.cursors import LogPosition
    from airflow_provider_torchx.core.logstream import LogFollower

    runner, _ = local_jobs
    handle = submit(
        local_jobs,
        AppDef(name="two", roles=[Role(name="e", image="local", entrypoint="sh", args=["-c", "echo one; echo two"])]),
    )
    runner.wait(handle, wait_interval=0.1, timeout=30, cancel_on_signal=False)
    follower = LogFollower(runner, handle, max_lines_per_poll=1)
    assert [line.line for line in follower.poll()] == ["one\n"]
    cursor_file_for(runner, handle, TASK).save(LogPosition(seq=3))  # older: would repeat "one"
    capfd.readouterr()
    (event,) = run_deferred(trigger_for(handle, log_cursors=follower.cursors, cursor_seq=4))
    out = capfd.readouterr().out
    assert "[e/0] two" in out and "[e/0] one" not in out and "Resuming" not in out
    # the trigger found the job ended and logged nothing; the flush went on from the kwargs
    saved = cursor_file_for(runner, handle, TASK).load()
    assert event["cursor_seq"] == 4 and saved is not None and saved.seq == 5


@pytest.mark.parametrize(
    ("answer", "cancelled"),
    [
        pytest.param("deferred", False, id="still-deferred"),
        pytest.param("failed", True, id="marked-failed"),
        pytest.param("success", True, id="marked-success"),
        pytest.param(None, False, id="cleared"),
        pytest.param("restarting", False, id="cleared-while-running"),
        pytest.param(RuntimeError("api server down"), False, id="call-fails"),
        pytest.param(KeyError("other"), False, id="not-found"),
    ],
)
def test_before_airflow_3_3_a_cancelled_trigger_cancels_only_the_job_of_an_ended_task(
    local_jobs: tuple[Runner, list[str]], pre_33: TaskStates, answer: Any, cancelled: bool
) -> None:
    runner, _ = local_jobs
    handle = submit(local_jobs, SLEEP)
    pre_33.answer = answer
    trigger = trigger_for(handle, cancel_on_kill=True)
    asyncio.run(run_then_cancel(trigger, lambda: runner.status(handle).state == AppState.RUNNING))  # type: ignore[union-attr]
    assert len(pre_33.calls) == 1
    if cancelled:
        assert wait_until(lambda: runner.status(handle).is_terminal(), 30, "the cancel")  # type: ignore[union-attr]
        desc = runner.describe_app(handle)
        assert desc is not None and desc.state == AppState.CANCELLED
        # the task's own cancel (not one from outside), naming its run and state as the reaper's do
        assert desc.cancel_reason == f"{task_name(TaskIdentity.from_labels(IDENTITY))} was marked {answer}"
        assert desc.cancelled_by == CancelledBy.TASK and outside_canceller(desc) is None
    else:
        desc = runner.describe_app(handle)
        assert desc is not None and desc.state == AppState.RUNNING and not desc.cancel_requested


@pytest.mark.parametrize("case", ["cancel_on_kill=False", "airflow>=3.3", "after-final-event"])
def test_a_cancelled_trigger_never_asks_or_cancels(
    local_jobs: tuple[Runner, list[str]], pre_33: TaskStates, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    runner, _ = local_jobs
    handle = submit(local_jobs, SLEEP)
    pre_33.answer = "failed"
    trigger = trigger_for(handle, cancel_on_kill=case != "cancel_on_kill=False")
    if case == "airflow>=3.3":
        monkeypatch.setattr(triggers, "TRIGGER_HAS_ON_KILL", True)  # on_kill does it there
    if case == "after-final-event":
        trigger._final_event_fired = True
    asyncio.run(run_then_cancel(trigger, lambda: runner.status(handle).state == AppState.RUNNING))  # type: ignore[union-attr]
    assert pre_33.calls == []
    desc = runner.describe_app(handle)
    assert desc is not None and desc.state == AppState.RUNNING and not desc.cancel_requested


def test_task_instance_state_reads_plain_and_mapped_instances(monkeypatch: pytest.MonkeyPatch) -> None:
    async def get_task_states(dag_id: str, task_id: str, run_id: str, map_index: int) -> dict[str, Any]:
        return {"r": {"t": "deferred", "m_2": "failed", "c": None}}

    monkeypatch.setattr(triggers, "get_task_states", get_task_states)
    assert asyncio.run(task_instance_state(TaskIdentity("d", "t", "r"))) == "deferred"
    assert asyncio.run(task_instance_state(TaskIdentity("d", "m", "r", 2))) == "failed"
    assert asyncio.run(task_instance_state(TaskIdentity("d", "c", "r"))) is None
    with pytest.raises(LookupError, match="no task instance 'x'"):
        asyncio.run(task_instance_state(TaskIdentity("d", "x", "r")))


def test_get_task_states_asks_the_supervisor_asynchronously(monkeypatch: pytest.MonkeyPatch) -> None:
    """The message it sends and the answer it reads are the installed Task SDK's own types."""
    from airflow.sdk.execution_time import task_runner
    from airflow.sdk.execution_time.comms import ErrorResponse, GetTaskStates, TaskStatesResult

    sent: list[Any] = []

    class Comms:
        answer: Any = TaskStatesResult(task_states={"r": {"t_3": "deferred"}})

        async def asend(self, msg: Any) -> Any:
            sent.append(msg)
            return self.answer

    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", Comms(), raising=False)
    assert asyncio.run(triggers.get_task_states("d", "t", "r", 3)) == {"r": {"t_3": "deferred"}}
    assert sent == [GetTaskStates(dag_id="d", task_ids=["t"], run_ids=["r"], map_index=3)]
    Comms.answer = ErrorResponse()
    with pytest.raises(RuntimeError, match="unexpected answer"):
        asyncio.run(triggers.get_task_states("d", "t", "r", 3))


def test_the_cursor_file_goes_in_the_schedulers_sidecar_dir(
    local_jobs: tuple[Runner, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_provider_torchx.core.schedulers.local.scheduler import LocalScheduler

    runner, _ = local_jobs
    handle = submit(local_jobs, SLEEP)
    assert cursor_file_for(runner, handle, TASK).path.is_relative_to(Path(os.environ["AIRFLOW_TORCHX_STATE_DIR"]))
    monkeypatch.setattr(LocalScheduler, "sidecar_dir", lambda self, app_id: tmp_path / app_id)
    assert cursor_file_for(runner, handle, TASK).path.parent == tmp_path / handle.rsplit("/", 1)[1]
