"""``TorchXJobSensor``: wait for a TorchX job submitted elsewhere (e.g. by a
``TorchXRunOperator(wait_for_completion=False)`` whose return value is templated in).

Succeeds when the job SUCCEEDED, fails with the reason (failed replica, exit code or Batch
reason, last log lines) otherwise, raising the failure kind's ``TorchXJobFailed``
(``failures.py``). It never cancels the job: it does not own it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator

from airflow_provider_torchx._compat import AirflowSensorTimeout
from airflow_provider_torchx.core.specs import parse_app_handle
from airflow_provider_torchx.failures import failure_error
from airflow_provider_torchx.hooks.torchx import TorchXHook, default_deferrable, hook_for_handle
from airflow_provider_torchx.metrics import emit_failed
from airflow_provider_torchx.usage_report import report_usage

# The watching path and the trigger (with Airflow's ``airflow.triggers``) are imported where
# they are used: a DAG file that imports this module does not pay for them.
if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_torchx.core.runner import Runner
    from airflow_provider_torchx.outcome import Outcome
    from airflow_provider_torchx.watch import TaskWatcher


class TorchXJobSensor(BaseSensorOperator):
    """Waits for the job ``app_handle`` (templated) to end, polling every ``poke_interval``.

    :param app_handle: the job's handle, ``scheduler://session/app_id``
    :param torchx_conn_id: the ``torchx`` connection (for AWS settings; optional)
    :param deferrable: wait in the triggerer (default ``[operators] default_deferrable``)
    :param stream_logs: copy the replicas' log lines into this task's log
    """

    template_fields: Sequence[str] = ("app_handle",)

    def __init__(
        self,
        *,
        app_handle: str,
        torchx_conn_id: str = TorchXHook.default_conn_name,
        deferrable: bool = default_deferrable(),
        stream_logs: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.app_handle = app_handle
        self.torchx_conn_id = torchx_conn_id
        self.deferrable = deferrable
        self.stream_logs = stream_logs
        self._watcher: TaskWatcher | None = None

    def hook(self) -> TorchXHook:
        """A hook for the handle's scheduler (the connection only adds AWS settings)."""
        return hook_for_handle(self.torchx_conn_id, self.app_handle)

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        from airflow_provider_torchx.core.cursors import LogPosition
        from airflow_provider_torchx.triggers.torchx import TorchXJobTrigger
        from airflow_provider_torchx.watch import task_identity

        hook = self.hook()
        now = time.time()
        self.defer(
            trigger=TorchXJobTrigger.for_job(
                self.app_handle,
                hook.get_runner(),
                hook.settings,
                poll_interval=float(self.poke_interval),
                stream_logs=self.stream_logs,
                position=LogPosition(),
                identity=task_identity(context).labels(),  # the trigger's kwargs: the wire form
                deadline=now + float(self.timeout) if self.timeout is not None else None,
                started_at=now,
            ),
            method_name="execute_complete",
        )

    def poke(self, context: Context) -> bool:
        from airflow_provider_torchx.watch import TaskWatcher, cursor_file_for, task_identity

        if self._watcher is None:
            runner = self.hook().get_runner()
            cursor_file = cursor_file_for(runner, self.app_handle, task_identity(context))
            self._watcher = TaskWatcher(
                runner,
                self.app_handle,
                self.log,
                stream_logs=self.stream_logs,
                position=cursor_file.load() if self.stream_logs else None,
                cursor_file=cursor_file,
            )
        status = self._watcher.current_status()
        self._watcher.stream(status, budget=float(self.poke_interval))
        if status is not None and not status.is_terminal():
            self.log.info("%s is %s", self.app_handle, status.state.name)
            return False
        self._end(self._watcher.runner, self._watcher.outcome(status), context)
        return True

    def execute_complete(self, context: Context, event: dict[str, Any]) -> str:
        """Resume after the trigger's event: flush the remaining log lines, then succeed or raise."""
        from airflow_provider_torchx.outcome import End, Outcome
        from airflow_provider_torchx.watch import cursor_file_for, flush_logs, task_identity

        outcome = Outcome.from_event(event)
        runner = self.hook().get_runner()
        if self.stream_logs:
            flush_logs(runner, outcome, self.log, cursor_file_for(runner, self.app_handle, task_identity(context)))
        if outcome.end is End.TIMEOUT:
            raise AirflowSensorTimeout(f"{self.app_handle} did not end within {self.timeout}s: {outcome.message}")
        self._end(runner, outcome, context)
        return self.app_handle

    def _end(self, runner: Runner, outcome: Outcome, context: Context) -> None:
        """The job ended: report its usage (with a failure's kind), then succeed or raise its
        kind's ``TorchXJobFailed`` (``failures.failure_error``; a cancel from outside too is
        retried, as it always was for the sensor: it does not own the job)."""
        from airflow_provider_torchx.outcome import End

        failure = None
        if outcome.end is not End.SUCCESS:
            failure = outcome.reported_failure(runner.describe_app(self.app_handle))
        if outcome.end in (End.SUCCESS, End.FAILED):
            report_usage(runner, self.app_handle, context, self.log, failure_kind=failure.kind if failure else None)
        if failure is not None:
            self.log.error("Failure kind: %s (%s)", failure.kind.value, failure.why)
            scheduler = parse_app_handle(self.app_handle).scheduler_backend
            emit_failed(scheduler=scheduler, dag_id=self.dag_id, task_id=self.task_id, kind=failure.kind.value)
            raise failure_error(
                outcome.failure_message(),
                failure,
                no_retry=False,
                app_handle=self.app_handle,
                root_cause=outcome.root_cause,
            )
        self.log.info("TorchX job %s SUCCEEDED", self.app_handle)
