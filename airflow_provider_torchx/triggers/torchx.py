"""``TorchXJobTrigger``: watches a submitted job from the triggerer for a deferred task.

It streams every replica's new log lines into the task log, prints a progress line every
``poll_interval`` and yields exactly one event: ``success``, ``failed`` (with the reason and the
failed replica's last lines), ``timeout`` (the absolute ``deadline`` passed) or ``error``. It
never raises for a job's failure: the task's ``execute_complete`` raises. Blocking client calls
run in a thread, off the triggerer's event loop.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_torchx.core.specs import parse_app_handle
from airflow_provider_torchx.hooks.torchx import JobWatcher, TorchXHook, progress_line


def is_local_scheduler(scheduler: str) -> bool:
    """Whether jobs of ``scheduler`` run on the submitting host (and can be watched only there)."""
    return scheduler.startswith("local")


class TorchXJobTrigger(BaseTrigger):
    """Waits for the job ``app_handle`` to end (see the module docstring).

    Every argument is JSON-serialisable: ``log_cursors`` (``{"role/k": cursor}``) say where
    the task log stands, ``deadline`` is absolute (epoch seconds), ``host`` is the host a local
    job runs on, ``started_at`` (epoch seconds) dates the progress lines' elapsed time.
    ``cancel_on_kill``: cancel the job when Airflow (>= 3.3) kills the deferred task (marked
    failed or success, cleared); never on a triggerer restart, never in ``cleanup()``.
    """

    def __init__(
        self,
        app_handle: str,
        *,
        aws_conn_id: str | None = None,
        region_name: str | None = None,
        poll_interval: float = 10,
        stream_logs: bool = True,
        log_cursors: dict[str, str] | None = None,
        deadline: float | None = None,
        host: str | None = None,
        started_at: float | None = None,
        cancel_on_kill: bool = False,
    ) -> None:
        super().__init__()
        self.app_handle = app_handle
        self.aws_conn_id = aws_conn_id
        self.region_name = region_name
        self.poll_interval = poll_interval
        self.stream_logs = stream_logs
        self.log_cursors = log_cursors
        self.deadline = deadline
        self.host = host
        self.started_at = started_at
        self.cancel_on_kill = cancel_on_kill
        self._final_event_fired = False

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """The class path and the kwargs that rebuild this trigger."""
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "app_handle": self.app_handle,
                "aws_conn_id": self.aws_conn_id,
                "region_name": self.region_name,
                "poll_interval": self.poll_interval,
                "stream_logs": self.stream_logs,
                "log_cursors": self.log_cursors,
                "deadline": self.deadline,
                "host": self.host,
                "started_at": self.started_at,
                "cancel_on_kill": self.cancel_on_kill,
            },
        )

    def _watcher(self) -> JobWatcher:
        parsed = parse_app_handle(self.app_handle)
        hook = TorchXHook(
            None,
            scheduler=parsed.scheduler_backend,
            session_name=parsed.session_name,
            aws_conn_id=self.aws_conn_id,
            region_name=self.region_name,
        )
        return JobWatcher(
            hook.get_runner(), self.app_handle, self.log, stream_logs=self.stream_logs, cursors=self.log_cursors
        )

    def _wrong_host(self) -> str | None:
        here = socket.gethostname()
        if self.host and self.host != here and is_local_scheduler(parse_app_handle(self.app_handle).scheduler_backend):
            return (
                f"local job {self.app_handle} runs on host {self.host!r} but this triggerer runs on {here!r}: "
                "a local job can only be watched from its own host; run a triggerer there or use deferrable=False"
            )
        return None

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Poll and stream until the job ends or the deadline passes; yield one event."""
        watcher: JobWatcher | None = None
        try:
            wrong_host = self._wrong_host()
            if wrong_host:
                yield TriggerEvent({"status": "error", "app_handle": self.app_handle, "message": wrong_host})
                return
            watcher = await asyncio.to_thread(self._watcher)
            next_progress = time.monotonic() + self.poll_interval
            while True:
                status = await asyncio.to_thread(watcher.poll)
                if status is None or status.is_terminal():
                    event = await asyncio.to_thread(watcher.outcome, status)
                    self._final_event_fired = True
                    yield TriggerEvent(event)
                    return
                now = time.time()
                if self.deadline is not None and now >= self.deadline:
                    message = f"TorchX job {self.app_handle} still {status.state.name} at its deadline"
                    self._final_event_fired = True
                    yield TriggerEvent(watcher.event("timeout", state=status.state.name, message=message))
                    return
                if time.monotonic() >= next_progress:
                    self.log.info(progress_line(self.app_handle, status, now - (self.started_at or now)))
                    next_progress = time.monotonic() + self.poll_interval
                pause = self.poll_interval if self.deadline is None else min(self.poll_interval, self.deadline - now)
                await asyncio.sleep(max(pause, 0.0))
        except Exception as e:
            self.log.exception("watching %s failed", self.app_handle)
            cursors = watcher.cursors if watcher else self.log_cursors
            yield TriggerEvent(
                {
                    "status": "error",
                    "app_handle": self.app_handle,
                    "message": f"watching {self.app_handle} failed: {type(e).__name__}: {e}",
                    "log_cursors": cursors,
                }
            )

    async def on_kill(self) -> None:
        """Cancel the job when the deferred task is killed (Airflow >= 3.3 calls this), unless
        ``cancel_on_kill`` is off or the final event has already fired. Idempotent."""
        if not self.cancel_on_kill or self._final_event_fired:
            return
        self.log.info("Task killed while deferred: cancelling %s", self.app_handle)
        watcher = await asyncio.to_thread(self._watcher)
        await asyncio.to_thread(watcher.runner.cancel, self.app_handle)
