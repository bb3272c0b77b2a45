"""``TorchXJobTrigger``: exact serialisation and ``run()`` against real local jobs."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from airflow_provider_torchx.core.identity import TaskIdentity
from airflow_provider_torchx.core.runner import Runner
from airflow_provider_torchx.core.schedulers.api import CancelledBy
from airflow_provider_torchx.core.specs import AppDef, AppState, Role
from airflow_provider_torchx.triggers.torchx import TorchXJobTrigger
from tests.airflow.helpers import refuse_record, run_deferred, still_running
from tests.fixtures.airflow import assert_lines_once
from tests.fixtures.triggerer import TriggererChannel

#: Every trigger here talks to a stand-in of the triggerer's channel that fails a synchronous send.
# airflow_line: Task SDK calls from a trigger, the pre-3.3 cancel while deferred.
pytestmark = [pytest.mark.usefixtures("triggerer_channel"), pytest.mark.airflow_line]

CLASSPATH = "airflow_provider_torchx.triggers.torchx.TorchXJobTrigger"


def sh_app(script: str, num_replicas: int = 1, env: dict[str, str] | None = None) -> AppDef:
    role = Role(name="w", image="local", entrypoint="sh", args=["-c", script], num_replicas=num_replicas, env=env or {})
    return AppDef(name="trig", roles=[role])


def submit(
    local_jobs: tuple[Runner, list[str]], script: str, num_replicas: int = 1, env: dict[str, str] | None = None
) -> str:
    runner, handles = local_jobs
    handle = runner.run(sh_app(script, num_replicas, env), "local_cwd")
    handles.append(handle)
    return handle


def run_trigger(trigger: TorchXJobTrigger) -> list[dict[str, Any]]:
    async def collect() -> list[dict[str, Any]]:
        return [event.payload async for event in trigger.run()]

    return asyncio.run(collect())


def test_serialize_is_exact_and_round_trips() -> None:
    kwargs: dict[str, Any] = {
        "app_handle": "aws_batch://torchx/queue:abc-123",
        "aws_conn_id": "aws_default",
        "region_name": "eu-west-1",
        "poll_interval": 5.0,
        "stream_logs": True,
        "log_cursors": {"trainer/0": '{"token": "f/1"}'},
        "cursor_seq": 7,
        "identity": {
            "airflow.dag_id": "d",
            "airflow.task_id": "t",
            "airflow.run_id": "manual__2024-01-01T00:00:00+00:00",
            "airflow.map_index": "-1",
        },
        "deadline": 1_900_000_000.5,
        "host": None,
        "started_at": 1_899_999_000.0,
        "cancel_on_kill": True,
        "native_id": "6ba7b810-9dad-11d1-80b4-00c04fd430c8",
        "start_timeout": 600.0,
        "max_gpu_hours": 2.5,
        "max_cost": 40.0,
        "rates": {"gpu_hour": 2.5, "vcpu_hour": 0.04, "memory_gb_hour": 0.005},
        "start_timeout_reason": "moved to torchx_ondemand: it did not start within start_timeout=600s",
    }
    trigger = TorchXJobTrigger(**kwargs)
    assert trigger.serialize() == (CLASSPATH, kwargs)
    classpath, again = TorchXJobTrigger(**kwargs).serialize()
    assert json.loads(json.dumps(again)) == kwargs
    assert TorchXJobTrigger(**again).serialize() == (classpath, kwargs)


def test_serialize_defaults() -> None:
    assert TorchXJobTrigger("local_cwd://torchx/a-1").serialize() == (
        CLASSPATH,
        {
            "app_handle": "local_cwd://torchx/a-1",
            "aws_conn_id": None,
            "region_name": None,
            "poll_interval": 10,
            "stream_logs": True,
            "log_cursors": None,
            "cursor_seq": 0,
            "identity": None,
            "deadline": None,
            "host": None,
            "started_at": None,
            "cancel_on_kill": False,
            "native_id": None,
            "start_timeout": None,
            "max_gpu_hours": None,
            "max_cost": None,
            "rates": None,
            "start_timeout_reason": None,
        },
    )


def test_a_trigger_serialised_by_the_previous_release_still_loads() -> None:
    """Kwargs without ``native_id`` (what triggers deferred before it carried one stored)
    build a trigger that looks its job up by name, as before; it serialises with the field."""
    old = {k: v for k, v in TorchXJobTrigger("aws_batch://torchx/q:a-1").serialize()[1].items() if k != "native_id"}
    trigger = TorchXJobTrigger(**old)
    assert trigger.native_id is None
    assert trigger.serialize() == (CLASSPATH, {**old, "native_id": None})


def test_success_streams_every_line_once(
    local_jobs: tuple[Runner, list[str]], capfd: pytest.CaptureFixture[str]
) -> None:
    handle = submit(local_jobs, "for i in 1 2 3 4; do echo n ${replica_id} $i; sleep 0.1; done", num_replicas=2)
    events = run_deferred(TorchXJobTrigger(handle, poll_interval=0.2, host=socket.gethostname()))
    out = capfd.readouterr().out
    assert len(events) == 1
    event = events[0]
    assert event["status"] == "success" and event["app_handle"] == handle and event["state"] == "SUCCEEDED"
    assert set(event["log_cursors"]) == {"w/0", "w/1"}
    assert_lines_once(out, [f"[w/{k}] n {k} {i}" for k in (0, 1) for i in range(1, 5)])


def test_secrets_are_registered_on_the_loop_never_synchronously(
    local_jobs: tuple[Runner, list[str]], triggerer_channel: TriggererChannel, capfd: pytest.CaptureFixture[str]
) -> None:
    """The job's secret env values reach the supervisor as ``MaskSecret`` through ``asend`` (a
    synchronous ``send`` fails the test: see ``tests/fixtures/triggerer.py``), and the trigger's
    own masker hides them in what it logs and in its event."""
    password, token = "pw-for-the-trigger-0123", "hf-token-for-the-trigger-4567"
    env = {"MY_PASSWORD": password, "HF_TOKEN": token, "PLAIN": "plain-value-89"}
    handle = submit(local_jobs, 'echo "got $MY_PASSWORD $HF_TOKEN $PLAIN"; sleep 2; exit 3', env=env)
    (event,) = run_trigger(TorchXJobTrigger(handle, poll_interval=0.2))  # logs the line while it runs
    out = capfd.readouterr().out
    masked = {(m.name, m.value) for m in triggerer_channel.sent_of("MaskSecret")}
    assert masked == {("MY_PASSWORD", password), ("HF_TOKEN", token)}, triggerer_channel.sent
    assert event["status"] == "failed" and event["tail"] == ["got *** *** plain-value-89"], event
    assert "[w/0] got *** *** plain-value-89" in out
    assert password not in out + json.dumps(event) and token not in out + json.dumps(event)


def test_a_job_whose_supervisor_died_is_reaped_on_the_pool_never_on_the_loop(
    local_jobs: tuple[Runner, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trigger reads the job's status on the loop (``cheap_status``): for a job whose
    supervisor died that read is side-effect free, and the reaping (``finalize``: a ``/proc``
    scan, kills, the store write) runs on the watch pool."""
    from airflow_provider_torchx.core.schedulers.local import procfs, store

    runner, _ = local_jobs
    handle = submit(local_jobs, "echo up; sleep 300")
    deadline = time.monotonic() + 30
    while getattr(runner.status(handle), "state", None) != AppState.RUNNING:
        assert time.monotonic() < deadline, runner.status(handle)
        time.sleep(0.05)
    job_dir = runner.sidecar_dir(handle)
    assert job_dir is not None
    sup = json.loads((job_dir / store.SUPERVISOR).read_text())
    assert procfs.signal_if_same(sup["pid"], sup["start"], signal.SIGKILL)
    reaped_on: list[str] = []
    real_kill_job = procfs.kill_job

    def kill_job(*args: Any, **kwargs: Any) -> Any:
        reaped_on.append(threading.current_thread().name)
        return real_kill_job(*args, **kwargs)

    monkeypatch.setattr(procfs, "kill_job", kill_job)
    (event,) = run_trigger(TorchXJobTrigger(handle, poll_interval=0.2))
    assert event["status"] == "failed" and "died before the job ended; its replicas were stopped" in event["message"]
    assert reaped_on and all(name.startswith("torchx-watch") for name in reaped_on), reaped_on
    assert json.loads((job_dir / store.STATE).read_text())["state"] == "FAILED"  # recorded


def test_the_aws_connection_is_fetched_on_the_loop_and_the_session_built_without_a_lookup(
    monkeypatch: pytest.MonkeyPatch, amazon_provider: Callable[[type], None]
) -> None:
    """With the Amazon provider, the hook builds the Batch scheduler's boto3 session on a pool or
    poller thread, where ``AwsBaseHook`` would look ``aws_conn_id`` up synchronously: the trigger
    fetches it on the loop (``aget_connection``) and the hook answers the lookup from it. The
    Amazon hook is stood in for by what we rely on: ``get_session`` calls ``get_connection``."""
    from concurrent.futures import ThreadPoolExecutor

    from airflow.sdk import BaseHook

    from airflow_provider_torchx.hooks.torchx import TorchXHook

    class AwsBaseHook(BaseHook):
        def __init__(self, aws_conn_id: str | None, region_name: str | None) -> None:
            super().__init__()
            self.aws_conn_id = aws_conn_id

        def get_session(self) -> tuple[str, Any]:
            return "session", self.get_connection(str(self.aws_conn_id))

    amazon_provider(AwsBaseHook)
    fetched: list[str] = []
    connection = object()

    async def aget_connection(cls: type, conn_id: str) -> Any:
        asyncio.get_running_loop()
        fetched.append(conn_id)
        return connection

    monkeypatch.setattr(BaseHook, "aget_connection", classmethod(aget_connection))
    trigger = TorchXJobTrigger("aws_batch://torchx/q:j", aws_conn_id="aws_test", region_name="eu-west-1")
    prefetched = asyncio.run(trigger._aws_connection())
    assert fetched == ["aws_test"]
    hook = TorchXHook(
        None, scheduler="aws_batch", aws_conn_id="aws_test", region_name="eu-west-1", aws_connection=prefetched
    )
    with ThreadPoolExecutor(1) as pool:  # as the watch pool or the Batch poller would
        assert pool.submit(hook.boto3_session).result() == ("session", connection)


def test_resumes_from_cursors(local_jobs: tuple[Runner, list[str]], capfd: pytest.CaptureFixture[str]) -> None:
    from airflow_provider_torchx.core.logstream import LogFollower

    runner, _ = local_jobs
    handle = submit(local_jobs, "echo first; sleep 1; echo second")
    follower = LogFollower(runner, handle)
    deadline = time.monotonic() + 30
    while not follower.poll() and time.monotonic() < deadline:
        time.sleep(0.05)
    capfd.readouterr()
    events = run_deferred(TorchXJobTrigger(handle, poll_interval=0.2, log_cursors=follower.cursors))
    out = capfd.readouterr().out
    assert events[0]["status"] == "success"
    assert "[w/0] second" in out and "[w/0] first" not in out


def test_failure_is_an_event_with_reason_and_tail(local_jobs: tuple[Runner, list[str]]) -> None:
    handle = submit(local_jobs, "for i in $(seq 1 30); do echo l$i; done; exit 7")
    (event,) = run_trigger(TorchXJobTrigger(handle, poll_interval=0.2, stream_logs=False))
    assert event["status"] == "failed" and event["state"] == "FAILED"
    assert "failed replica w/0, exit code 7" in event["message"]
    assert event["tail"] == [f"l{i}" for i in range(11, 31)]
    assert event["log_cursors"] is None


def test_deadline_yields_timeout(local_jobs: tuple[Runner, list[str]]) -> None:
    runner, _ = local_jobs
    handle = submit(local_jobs, "sleep 60")
    (event,) = run_trigger(TorchXJobTrigger(handle, poll_interval=0.2, deadline=time.time() + 1))
    assert event["status"] == "timeout" and event["state"] in ("PENDING", "RUNNING")
    status = runner.status(handle)
    assert status is not None and not status.is_terminal()  # the trigger never cancels; the task does


IDENTITY = {"airflow.dag_id": "d", "airflow.task_id": "t", "airflow.run_id": "r", "airflow.map_index": "-1"}


def answer_state(monkeypatch: pytest.MonkeyPatch, answer: Any) -> list[TaskIdentity]:
    """Stub the Task SDK's answer for the task instance's state (a state, or an exception to
    raise); returns the identities asked about."""
    from airflow_provider_torchx.triggers import torchx as triggers

    asked: list[TaskIdentity] = []

    async def task_state(ident: TaskIdentity) -> str | None:
        asked.append(ident)
        if isinstance(answer, Exception):
            raise answer
        return str(answer) if answer is not None else None

    monkeypatch.setattr(triggers, "task_instance_state", task_state)
    return asked


@pytest.mark.parametrize("cancel_on_kill", [True, False])
def test_on_kill_cancels_only_when_asked(
    local_jobs: tuple[Runner, list[str]], monkeypatch: pytest.MonkeyPatch, cancel_on_kill: bool
) -> None:
    asked = answer_state(monkeypatch, "failed")
    runner, _ = local_jobs
    handle = submit(local_jobs, "sleep 60")
    asyncio.run(TorchXJobTrigger(handle, identity=IDENTITY, cancel_on_kill=cancel_on_kill, poll_interval=0.2).on_kill())
    status = runner.wait(handle, wait_interval=0.2, timeout=30 if cancel_on_kill else 1, cancel_on_signal=False)
    assert status is not None and (status.state == AppState.CANCELLED) is cancel_on_kill
    assert len(asked) == int(cancel_on_kill)  # off: the table keeps the job whatever the state


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param("deferred", id="still-deferred"),
        pytest.param(None, id="cleared"),
        pytest.param("restarting", id="cleared-while-running"),
        pytest.param("up_for_retry", id="retrying"),
        pytest.param(RuntimeError("api server down"), id="unreadable"),
    ],
)
def test_on_kill_keeps_the_job_the_next_try_adopts_or_the_reaper_judges(
    local_jobs: tuple[Runner, list[str]], monkeypatch: pytest.MonkeyPatch, answer: Any
) -> None:
    """The table (``orphans.decide``, killed): a triggerer restart, a cleared or retrying task
    keep the job; an unreadable state leaves it to the reaper."""
    asked = answer_state(monkeypatch, answer)
    runner, _ = local_jobs
    handle = submit(local_jobs, "sleep 60")
    asyncio.run(TorchXJobTrigger(handle, identity=IDENTITY, cancel_on_kill=True, poll_interval=0.2).on_kill())
    assert asked == [TaskIdentity("d", "t", "r")]
    desc = runner.describe_app(handle)
    assert desc is not None and not desc.state.is_terminal() and not desc.cancel_requested, desc


def test_on_kill_after_the_final_event_does_nothing(local_jobs: tuple[Runner, list[str]]) -> None:
    runner, _ = local_jobs
    handle = submit(local_jobs, "sleep 60")
    trigger = TorchXJobTrigger(handle, poll_interval=0.2, deadline=time.time() + 0.5, cancel_on_kill=True)
    (event,) = run_trigger(trigger)
    assert event["status"] == "timeout"
    asyncio.run(trigger.on_kill())
    status = runner.status(handle)
    assert status is not None and not status.is_terminal()


@pytest.mark.parametrize(("state", "cancelled"), [("failed", True), ("success", True), ("deferred", False)])
def test_a_trigger_started_after_its_task_ended_cancels_at_once(
    local_jobs: tuple[Runner, list[str]], monkeypatch: pytest.MonkeyPatch, state: str, cancelled: bool
) -> None:
    """A task marked before its trigger ran gets no on_kill: the trigger reads the task's state
    when it starts (the Task SDK's answer stubbed here; the live path is in
    tests/e2e/test_live_orphans.py) and cancels the job when it is no longer deferred."""
    from airflow_provider_torchx.triggers import torchx as triggers

    async def task_state(identity: dict[str, str]) -> str:
        return state

    monkeypatch.setattr(triggers, "task_instance_state", task_state)
    runner, _ = local_jobs
    handle = submit(local_jobs, "sleep 60")
    identity = {"airflow.dag_id": "d", "airflow.task_id": "t", "airflow.run_id": "r", "airflow.map_index": "-1"}
    trigger = TorchXJobTrigger(
        handle,
        poll_interval=0.2,
        identity=identity,
        cancel_on_kill=True,
        deadline=time.time() + (20 if cancelled else 1),
    )
    (event,) = run_trigger(trigger)
    desc = runner.describe_app(handle)
    assert desc is not None
    if cancelled:
        assert event["status"] == "failed" and desc.state == AppState.CANCELLED, (event, desc)
        assert desc.cancel_reason == f"task d.t of run r ended {state}", desc
        assert desc.cancelled_by == CancelledBy.REAPER, desc  # the orphaned-jobs rule, applied at the start
    else:
        assert event["status"] == "timeout" and not desc.cancel_requested, (event, desc)


def test_the_first_look_does_not_wait_for_the_start_checks_answer(
    local_jobs: tuple[Runner, list[str]], monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """A fresh triggerer answers its first Task SDK request seconds late: the start check runs
    beside the watch, so the job's lines are logged at once and the deadline is kept while the
    task's state is still being asked (stubbed here to answer after a minute)."""
    from airflow_provider_torchx.triggers import torchx as triggers

    asked = asyncio.Event()

    async def slow_task_state(identity: dict[str, str]) -> str:
        asked.set()
        await asyncio.sleep(60)
        return "deferred"

    monkeypatch.setattr(triggers, "task_instance_state", slow_task_state)
    handle = submit(local_jobs, "echo first line; sleep 60")
    identity = {"airflow.dag_id": "d", "airflow.task_id": "t", "airflow.run_id": "r", "airflow.map_index": "-1"}
    trigger = TorchXJobTrigger(
        handle, poll_interval=0.2, identity=identity, cancel_on_kill=True, deadline=time.time() + 2
    )
    began = time.monotonic()
    (event,) = run_trigger(trigger)
    assert time.monotonic() - began < 20 and event["status"] == "timeout", event
    assert asked.is_set()  # the check ran, beside the watch
    assert "[w/0] first line" in capfd.readouterr().out


def test_a_start_check_sent_is_never_cancelled_midway_when_the_watch_ends(
    local_jobs: tuple[Runner, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job ends while the start check's Task SDK request is still unanswered: the
    request is left to finish (Airflow 3.1's channel, cancelled midway, hands its answer to
    the runner's next request, and the trigger runner dies: every deferred task then waits)."""
    from airflow_provider_torchx.triggers import torchx as triggers

    seen: list[str] = []

    async def slow_task_state(identity: dict[str, str]) -> str:
        seen.append("asked")
        try:
            await asyncio.sleep(2)
        except asyncio.CancelledError:
            seen.append("cancelled midway")
            raise
        seen.append("answered")
        return "deferred"

    monkeypatch.setattr(triggers, "task_instance_state", slow_task_state)
    handle = submit(local_jobs, "echo a; sleep 1")
    identity = {"airflow.dag_id": "d", "airflow.task_id": "t", "airflow.run_id": "r", "airflow.map_index": "-1"}
    trigger = TorchXJobTrigger(handle, poll_interval=0.2, identity=identity, cancel_on_kill=True)

    async def main() -> list[dict[str, Any]]:
        events = [event.payload async for event in trigger.run()]
        await asyncio.gather(*triggers._UNFINISHED)  # what the triggerer's loop would go on running
        return events

    (event,) = asyncio.run(main())
    assert event["status"] == "success", event
    assert seen == ["asked", "answered"], seen


def test_a_job_cancelled_by_another_component_is_said_in_the_task_log_with_its_reason(
    local_jobs: tuple[Runner, list[str]], capfd: pytest.CaptureFixture[str]
) -> None:
    """A task marked failed while deferred never resumes: when the trigger finds its job
    cancelled (by the api-server's reaper, say), its last line says so with the reason the
    job's record keeps, before its event."""
    runner, _ = local_jobs
    handle = submit(local_jobs, "sleep 60")
    reason = "task d.t of run r was marked failed"

    async def watch_and_cancel() -> list[dict[str, Any]]:
        async def cancel_soon() -> None:
            await asyncio.sleep(0.5)
            await asyncio.get_running_loop().run_in_executor(None, lambda: runner.cancel(handle, reason=reason))

        canceller = asyncio.create_task(cancel_soon())
        events = [event.payload async for event in TorchXJobTrigger(handle, poll_interval=0.2).run()]
        await canceller
        return events

    (event,) = asyncio.run(watch_and_cancel())
    assert event["status"] == "failed" and event["state"] == "CANCELLED", event
    out = capfd.readouterr().out
    assert f"TorchX job {handle} ended CANCELLED: cancelled by request: {reason}" in out, out[-3000:]


def test_on_kill_says_in_the_task_log_why_it_cancelled(
    local_jobs: tuple[Runner, list[str]], monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    answer_state(monkeypatch, "failed")
    runner, _ = local_jobs
    handle = submit(local_jobs, "sleep 60")
    asyncio.run(TorchXJobTrigger(handle, identity=IDENTITY, cancel_on_kill=True, poll_interval=0.2).on_kill())
    desc = runner.describe_app(handle)
    assert desc is not None and desc.cancel_reason == "task d.t of run r was marked failed", desc
    assert desc.cancelled_by == CancelledBy.TASK, desc  # the task's own cancel: never "from outside"
    assert f"Cancelled TorchX job {handle}: {desc.cancel_reason}" in capfd.readouterr().out


def test_local_job_on_another_host_is_an_error_event() -> None:
    (event,) = run_trigger(TorchXJobTrigger("local_cwd://torchx/x-1", host="some-other-host"))
    assert event["status"] == "error"
    assert "'some-other-host'" in event["message"] and "deferrable=False" in event["message"]


def test_unknown_job_is_an_error_event() -> None:
    (event,) = run_trigger(TorchXJobTrigger("local_cwd://torchx/nosuchjob-1", poll_interval=0.1))
    assert event["status"] == "error" and "no such job" in event["message"]


def test_blocking_calls_run_off_the_event_loop(
    local_jobs: tuple[Runner, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    handle = submit(local_jobs, "sleep 0.5")
    real_read_log = Runner.read_log

    def slow_read_log(self: Runner, *args: Any, **kwargs: Any) -> Any:
        time.sleep(1.0)  # a slow remote call (CloudWatch, say): must not stall the event loop
        return real_read_log(self, *args, **kwargs)

    monkeypatch.setattr(Runner, "read_log", slow_read_log)
    gaps: list[float] = []

    async def main() -> dict[str, Any]:
        async def ticker() -> None:
            last = time.monotonic()
            while True:
                await asyncio.sleep(0.02)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        task = asyncio.create_task(ticker())
        events = [e.payload async for e in TorchXJobTrigger(handle, poll_interval=0.2).run()]
        task.cancel()
        return events[0]

    event = asyncio.run(main())
    assert event["status"] == "success"
    assert max(gaps) < 0.9, f"the event loop stalled for {max(gaps):.2f}s"


class ListLog:
    """A logger stand-in that keeps the formatted lines."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, fmt: str, *args: Any) -> None:
        self.lines.append(fmt % args)


def test_resumed_task_flushes_only_what_the_event_did_not_cover(local_jobs: tuple[Runner, list[str]]) -> None:
    from airflow_provider_torchx.core.logstream import LogFollower
    from airflow_provider_torchx.outcome import End, Outcome
    from airflow_provider_torchx.watch import flush_logs

    runner, _ = local_jobs
    handle = submit(local_jobs, "for i in 1 2 3 4; do echo f$i; done")
    runner.wait(handle, wait_interval=0.2, timeout=30, cancel_on_signal=False)
    follower = LogFollower(runner, handle, max_lines_per_poll=1)
    assert [line.line for line in follower.poll()] == ["f1\n"]
    log = ListLog()
    flush_logs(runner, Outcome(End.SUCCESS, handle, 0, follower.cursors), log)
    assert log.lines == ["[w/0] f2", "[w/0] f3", "[w/0] f4"]
    quiet = ListLog()
    flush_logs(runner, Outcome(End.SUCCESS, handle, 0, None), quiet)  # not streaming: nothing
    assert quiet.lines == []


def test_a_local_jobs_end_is_seen_at_once_not_a_poll_later(local_jobs: tuple[Runner, list[str]]) -> None:
    """The trigger waits on the supervisor's pidfd on the loop between polls: the event comes
    when the job ends, not up to ``poll_interval`` (a minute here) later."""
    handle = submit(local_jobs, "sleep 1; echo done")
    trigger = TorchXJobTrigger(handle, poll_interval=60, host=socket.gethostname())

    async def first_event() -> dict[str, Any]:
        return (await asyncio.wait_for(anext(trigger.run()), timeout=45)).payload

    started = time.monotonic()
    event = asyncio.run(first_event())
    assert event["status"] == "success"
    assert time.monotonic() - started < 45  # a poll would be 60 s


def test_a_local_job_that_ended_before_the_wait_began_is_seen_at_once(local_jobs: tuple[Runner, list[str]]) -> None:
    """The race 500 local triggers met at once in ``benchmarks/triggerer_scale.py``: the
    supervisor exits after the watcher read a live status and before it waits on the pidfd,
    so there is no descriptor left to wait on; the end is read at once, not a poll (a minute
    here) later."""
    from airflow_provider_torchx.watch import TaskWatcher

    runner, _ = local_jobs
    handle = submit(local_jobs, "sleep 600")
    watcher = TaskWatcher(runner, handle, ListLog(), stream_logs=False)
    deadline = time.monotonic() + 60
    while (status := runner.status(handle)) is None or status.state != AppState.RUNNING:
        assert time.monotonic() < deadline, status
        time.sleep(0.1)
    runner.cancel(handle)
    while (fd := runner.change_fd(handle)) is not None:  # until the supervisor is gone
        os.close(fd)
        assert time.monotonic() < deadline, "the supervisor did not exit"
        time.sleep(0.1)

    async def next_status() -> Any:
        return await asyncio.wait_for(watcher.next_status_async(60.0, None), timeout=30)

    status = asyncio.run(next_status())
    assert status is not None and status.state == AppState.CANCELLED


@pytest.mark.parametrize("how", ["state", "dir"])
def test_a_job_whose_record_is_refused_is_stopped_before_the_error_event(
    local_jobs: tuple[Runner, list[str]], how: str, tmp_path: Any
) -> None:
    """A watched job whose ``state.json`` or directory was swapped for a symbolic link cannot
    be described, yet it is still a job: the trigger stops it (its supervisor found without
    the refused file) and yields its ``error`` event, marked ``refused``, only once neither
    its supervisor nor its replicas run."""
    runner, _ = local_jobs
    handle = submit(local_jobs, "echo up; sleep 600")
    processes = refuse_record(runner, handle, how, tmp_path)
    (event,) = run_deferred(TorchXJobTrigger(handle, poll_interval=0.2, identity=IDENTITY))
    assert still_running(processes) == [], "the trigger gave up while the job ran"
    assert event["status"] == "error" and event["refused"] is True, event
    assert f"TorchX job {handle} cannot be watched: job " in event["message"] and "; cancelled it." in event["message"]
    assert "Not retried" in event["message"], event["message"]


def test_a_job_whose_record_is_refused_is_stopped_before_a_worker_gives_up(
    local_jobs: tuple[Runner, list[str]], tmp_path: Any
) -> None:
    """The same in worker mode: the blocking watch stops the job before its outcome."""
    import logging

    from airflow_provider_torchx.outcome import End
    from airflow_provider_torchx.watch import TaskWatcher

    runner, _ = local_jobs
    handle = submit(local_jobs, "sleep 600")
    processes = refuse_record(runner, handle, "state", tmp_path)
    watcher = TaskWatcher(runner, handle, logging.getLogger("test"), stream_logs=True)
    outcome = watcher.wait_for_outcome(0.2, None, time.time())
    assert still_running(processes) == [] and outcome.end is End.ERROR and outcome.refused, outcome
