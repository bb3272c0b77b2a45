"""``TorchXHook``: a ``torchx`` connection turned into a configured ``Runner``.

Also holds the blocking job-watching logic shared by the operator (worker mode), the sensor and
the trigger (which runs it off the event loop): a task instance's identity labels, status, log
streaming with ``[role/k]`` prefixes and saved positions (cursor files, ``core/cursors.py``),
progress lines and the final outcome as a JSON-able event payload.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.exceptions import AirflowException, AirflowNotFoundException
from airflow.sdk import BaseHook

from airflow_provider_torchx._compat import conf, connection_form_widgets, ui_field_behaviour
from airflow_provider_torchx.core.cursors import CursorFile, LogPosition, newest
from airflow_provider_torchx.core.errorfile import SUMMARY_LINES, find_root_cause
from airflow_provider_torchx.core.errors import InvalidRunConfigError
from airflow_provider_torchx.core.logstream import LogFollower, LogLine, last_lines
from airflow_provider_torchx.core.runner import DEFAULT_SESSION_NAME, Runner, get_runner
from airflow_provider_torchx.core.specs import AppState, AppStatus, parse_app_handle

if TYPE_CHECKING:
    from airflow.sdk import Context

#: How many lines of the failed replica's log a failure message carries.
FAILURE_TAIL_LINES = 20
_EXTRA_KEYS = ("scheduler", "cfg", "session_name", "aws_conn_id", "region_name")


@dataclass(frozen=True)
class TorchXSettings:
    """What a ``torchx`` connection (or the operator's overrides) says: the scheduler, its
    raw run config (a dict or a ``k=v,...`` string), the session name and AWS settings."""

    scheduler: str
    cfg: Mapping[str, Any] | str | None = None
    session_name: str = DEFAULT_SESSION_NAME
    aws_conn_id: str | None = None
    region_name: str | None = None

    @property
    def runner_key(self) -> tuple[str, str, str | None, str | None]:
        """What distinguishes one configured Runner from another (cfg is per submit)."""
        return (self.scheduler, self.session_name, self.aws_conn_id, self.region_name)


def default_deferrable() -> bool:
    """``[operators] default_deferrable`` (Airflow's config, as this version exposes it)."""
    return bool(conf.getboolean("operators", "default_deferrable", fallback=False))


def _extra_value(extra: Mapping[str, Any], key: str) -> Any:
    """A connection extra, stored plain (``scheduler``) or UI-prefixed (``extra__torchx__scheduler``)."""
    value = extra.get(key, extra.get(f"extra__torchx__{key}"))
    return None if value == "" else value


_RUNNERS: dict[tuple[str, str, str | None, str | None], Runner] = {}
_RUNNERS_LOCK = threading.Lock()


class TorchXHook(BaseHook):
    """Reads the ``torchx`` connection ``torchx_conn_id`` and builds a ``Runner`` from it.

    Explicit ``scheduler``, ``session_name``, ``aws_conn_id`` and ``region_name`` win over the
    connection's. With a ``scheduler`` given, a missing connection (or ``torchx_conn_id=None``)
    is fine: defaults are used, so a local run needs no connection at all.
    """

    conn_name_attr = "torchx_conn_id"
    default_conn_name = "torchx_default"
    conn_type = "torchx"
    hook_name = "TorchX"

    @classmethod
    def get_connection_form_widgets(cls) -> dict[str, Any]:
        """The connection form's extra fields for Airflow 3.1 (later versions read them from the
        provider info and never call this)."""
        return connection_form_widgets(cls.conn_type)

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """The connection form's hidden fields and placeholders for Airflow 3.1 (see above)."""
        return ui_field_behaviour(cls.conn_type)

    def __init__(
        self,
        torchx_conn_id: str | None = default_conn_name,
        *,
        scheduler: str | None = None,
        session_name: str | None = None,
        aws_conn_id: str | None = None,
        region_name: str | None = None,
    ) -> None:
        super().__init__()
        self.torchx_conn_id = torchx_conn_id
        self._overrides = {
            "scheduler": scheduler,
            "session_name": session_name,
            "aws_conn_id": aws_conn_id,
            "region_name": region_name,
        }

    def _connection_extra(self) -> dict[str, Any]:
        if not self.torchx_conn_id:
            return {}
        try:
            conn = self.get_connection(self.torchx_conn_id)
        except AirflowNotFoundException:
            if self._overrides["scheduler"]:
                self.log.info(
                    "No connection %r: using scheduler %s with defaults",
                    self.torchx_conn_id,
                    self._overrides["scheduler"],
                )
                return {}
            raise AirflowNotFoundException(
                f"torchx_conn_id: connection {self.torchx_conn_id!r} is not defined and no scheduler was given; "
                "define a `torchx` connection or pass scheduler= (e.g. local_cwd)"
            ) from None
        extra = conn.extra_dejson
        return {key: _extra_value(extra, key) for key in _EXTRA_KEYS}

    @cached_property
    def settings(self) -> TorchXSettings:
        """The merged settings (explicit arguments over the connection's extras)."""
        values = self._connection_extra()
        values.update({k: v for k, v in self._overrides.items() if v})
        if not values.get("scheduler"):
            raise AirflowException(
                f"scheduler: connection {self.torchx_conn_id!r} names no scheduler; "
                "set its `scheduler` extra (local_cwd, local_dir, aws_batch) or pass scheduler="
            )
        cfg = values.get("cfg")
        if cfg is not None and not isinstance(cfg, str | Mapping):
            raise InvalidRunConfigError(
                f"cfg: connection {self.torchx_conn_id!r} has cfg={cfg!r}; expected a JSON object or a 'k=v,...' string"
            )
        return TorchXSettings(
            scheduler=str(values["scheduler"]),
            cfg=cfg,
            session_name=str(values.get("session_name") or DEFAULT_SESSION_NAME),
            aws_conn_id=values.get("aws_conn_id"),
            region_name=values.get("region_name"),
        )

    # ------------------------------------------------------------------ runner

    def _scheduler_params(self) -> dict[str, Any]:
        """Factory kwargs: a boto3 session for AWS Batch (built only then, boto3 is imported lazily)."""
        if self.settings.scheduler != "aws_batch":
            return {}
        return {"session": self.boto3_session()}

    def boto3_session(self) -> Any:
        """A boto3 session from the Amazon provider's connection ``aws_conn_id`` when that
        provider is installed, else from boto3's default credential chain."""
        settings = self.settings
        if settings.aws_conn_id:
            try:
                from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook
            except ImportError:
                self.log.warning(
                    "aws_conn_id=%r ignored: apache-airflow-providers-amazon is not installed; "
                    "using boto3's default credential chain",
                    settings.aws_conn_id,
                )
            else:
                return AwsBaseHook(aws_conn_id=settings.aws_conn_id, region_name=settings.region_name).get_session()
        import boto3

        return boto3.Session(region_name=settings.region_name)

    def get_runner(self) -> Runner:
        """The process-wide ``Runner`` for these settings (shared, so that many watchers in a
        triggerer share scheduler clients and pollers; never closed by callers)."""
        key = self.settings.runner_key
        with _RUNNERS_LOCK:
            runner = _RUNNERS.get(key)
            if runner is None:
                runner = get_runner(self.settings.session_name, **self._scheduler_params())
                _RUNNERS[key] = runner
            return runner

    def get_conn(self) -> Runner:
        """Same as ``get_runner()``."""
        return self.get_runner()

    def resolve_cfg(self, cfg: Mapping[str, Any] | str | None = None) -> dict[str, Any]:
        """The connection's cfg with ``cfg`` merged over it; strings are parsed and checked with
        ``Runner.cfg_from_str``. Required options are checked later, at submit."""
        merged: dict[str, Any] = {}
        for part in (self.settings.cfg, cfg):
            if isinstance(part, str):
                merged.update(self.get_runner().cfg_from_str(self.settings.scheduler, part) if part.strip() else {})
            elif isinstance(part, Mapping):
                merged.update(part)
            elif part is not None:
                raise InvalidRunConfigError(f"cfg: {part!r} is a {type(part).__name__}; expected a dict or 'k=v,...'")
        return merged

    def test_connection(self) -> tuple[bool, str]:
        """Check the scheduler exists and the cfg is valid; for AWS Batch also that the queue
        exists and is enabled."""
        try:
            settings = self.settings
            cfg = self.get_runner().scheduler_run_opts(settings.scheduler).resolve(self.resolve_cfg())
            if settings.scheduler == "aws_batch":
                return self._test_batch_queue(str(cfg.get("queue")))
            return True, f"scheduler {settings.scheduler} is available; cfg {cfg} is valid"
        except Exception as e:
            return False, f"{type(e).__name__}: {e}"

    def _test_batch_queue(self, queue: str) -> tuple[bool, str]:
        client = self.boto3_session().client("batch")
        queues = client.describe_job_queues(jobQueues=[queue]).get("jobQueues", [])
        if not queues:
            return False, f"queue: AWS Batch job queue {queue!r} does not exist"
        state, status = queues[0].get("state"), queues[0].get("status")
        if state != "ENABLED":
            return False, f"queue: AWS Batch job queue {queue!r} is {state}; it must be ENABLED"
        return True, f"AWS Batch job queue {queue!r} is ENABLED ({status})"


def hook_for_handle(torchx_conn_id: str | None, app_handle: str) -> TorchXHook:
    """A hook for the scheduler and session of ``app_handle`` (the connection, if defined,
    still supplies the AWS settings)."""
    parsed = parse_app_handle(app_handle)
    return TorchXHook(torchx_conn_id, scheduler=parsed.scheduler_backend, session_name=parsed.session_name)


# ---------------------------------------------------------------------- watching a job


def progress_line(app_handle: str, status: AppStatus, elapsed: float) -> str:
    """``<handle> RUNNING: 2 replicas running, 1 done, 0 pending; elapsed 12s``, then what the
    scheduler says of a job not ended yet (``; waiting for 4 GPUs, ...``)."""
    counts = {"running": 0, "done": 0, "pending": 0}
    for role in status.roles:
        for rep in role.replicas:
            if rep.state.is_terminal():
                counts["done"] += 1
            elif rep.state == AppState.RUNNING:
                counts["running"] += 1
            else:
                counts["pending"] += 1
    parts = ", ".join(f"{n} {what}" for what, n in counts.items())
    why = f"; {status.msg}" if status.msg and not status.is_terminal() else ""
    return f"{app_handle} {status.state.name}: replicas {parts}; elapsed {elapsed:.0f}s{why}"


def identity_labels(context: Context) -> dict[str, str]:
    """The task instance's identity (never the try number) as job labels."""
    ti = context["ti"]
    return {
        "airflow.dag_id": ti.dag_id,
        "airflow.task_id": ti.task_id,
        "airflow.run_id": ti.run_id,
        "airflow.map_index": str(ti.map_index),
    }


def cursor_file_for(runner: Runner, app_handle: str, identity: Mapping[str, str]) -> CursorFile:
    """The cursor file of watcher ``identity`` (a task instance's labels) for ``app_handle``:
    beside the job when its scheduler keeps a sidecar dir, else under this host's state dir."""
    return CursorFile.locate(app_handle, identity, runner.sidecar_dir(app_handle))


class JobWatcher:
    """Follows one job for a task: copies its replicas' new log lines into ``log`` (each
    ``[role/k] line``, once, in order per replica), keeps its reading ``position`` (saved to
    ``cursor_file`` after each batch it logged, when given) and turns its final status into an
    outcome payload.

    Reading (``fetch``, ``read``) blocks and has no side effect but advancing the in-memory
    cursors; ``emit`` logs; ``save`` writes the cursor file. The trigger reads in a thread and
    logs on its event loop, so a read interrupted by a cancellation is neither logged nor
    saved; ``poll`` and ``stream`` do all three for the worker and the sensor.
    """

    def __init__(
        self,
        runner: Runner,
        app_handle: str,
        log: logging.Logger | Any,
        *,
        stream_logs: bool,
        position: LogPosition | None = None,
        cursor_file: CursorFile | None = None,
    ) -> None:
        self.runner = runner
        self.app_handle = app_handle
        self.log = log
        self.position = position or LogPosition()
        self.follower = LogFollower(runner, app_handle, self.position.cursors) if stream_logs else None
        self.cursor_file = cursor_file if stream_logs else None
        self._saved_seq = self.position.seq

    @property
    def cursors(self) -> dict[str, str] | None:
        """Where each replica's logged lines end (``None`` when not streaming)."""
        return dict(self.position.cursors) if self.follower else None

    def read(self, status: AppStatus | None) -> list[LogLine]:
        """The lines written since the last read; every remaining line of a terminal job."""
        if self.follower is None or status is None:
            return []
        lines = self.follower.poll(status)
        if status.is_terminal():
            while more := self.follower.poll(status):
                lines.extend(more)
        return lines

    def fetch(self) -> tuple[AppStatus | None, list[LogLine]]:
        """The job's status (None: no such job) and the lines written since the last read."""
        status = self.runner.status(self.app_handle)
        return status, self.read(status)

    def emit(self, lines: list[LogLine]) -> bool:
        """Log ``lines`` and move the position past them; return whether it moved."""
        for line in lines:
            self.log.info("%s", line.format())
        if not lines or self.follower is None:
            return False
        self.position = self.position.advanced(self.follower.cursors)
        return True

    def save(self) -> None:
        """Write the position to the cursor file if it moved since the last save."""
        if (
            self.cursor_file is not None
            and self.position.seq > self._saved_seq
            and self.cursor_file.save(self.position)
        ):
            self._saved_seq = self.position.seq

    def stream(self, status: AppStatus) -> None:
        """Log (and save) the lines written since the last read; all remaining ones of a
        terminal job."""
        self.emit(self.read(status))
        self.save()

    def poll(self) -> AppStatus | None:
        """The job's status, after logging (and saving) what its replicas wrote."""
        status, lines = self.fetch()
        self.emit(lines)
        self.save()
        return status

    def outcome(self, status: AppStatus | None) -> dict[str, Any]:
        """The final event payload of a terminal (or vanished) job: ``status`` is ``success``,
        ``failed`` (with the reason and the failed replica's last lines) or ``error``."""
        if status is None:
            return self.event("error", message=f"no such job {self.app_handle}: the scheduler does not know it")
        if status.state == AppState.SUCCEEDED:
            return self.event("success", state=status.state.name, ui_url=status.ui_url)
        rep = status.failed_replica()
        tail: list[str] = []
        where = ""
        if rep is not None:
            code = f", exit code {rep.exit_code}" if rep.exit_code is not None else ""
            where = f"; failed replica {rep.role}/{rep.id}{code}"
            # read once: the message's tail, and where torchrun's summary is looked for
            lines = [
                line.rstrip("\n") for line in last_lines(self.runner, self.app_handle, rep.role, rep.id, SUMMARY_LINES)
            ]
            tail = lines[-FAILURE_TAIL_LINES:]
        message = f"TorchX job {self.app_handle} ended {status.state.name}: {status.msg or 'no reason given'}{where}"
        root = find_root_cause(self.runner, self.app_handle, status, {(rep.role, rep.id): lines}) if rep else None
        return self.event(
            "failed",
            state=status.state.name,
            message=message,
            tail=tail,
            ui_url=status.ui_url,
            root_cause=root.format() if root else None,
        )

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        """An event payload of ``kind`` carrying the handle and the log position."""
        payload: dict[str, Any] = {
            "status": kind,
            "app_handle": self.app_handle,
            "log_cursors": self.cursors,
            "cursor_seq": self.position.seq,
        }
        payload.update(fields)
        return payload


def event_position(event: Mapping[str, Any]) -> LogPosition:
    """The log position an event carries (empty when it carries none)."""
    return LogPosition(seq=int(event.get("cursor_seq") or 0), cursors=dict(event.get("log_cursors") or {}))


def failure_message(event: Mapping[str, Any]) -> str:
    """The task's error text for a non-success event: the root cause (when torchrun reported
    one, ``core/errorfile.py``), the reason, then the log tail."""
    message = str(event.get("message") or f"TorchX job {event.get('app_handle')} did not succeed: {event}")
    if event.get("root_cause"):
        message = f"{event['root_cause']}\n{message}"
    tail = event.get("tail") or []
    if tail:
        message += f"\nLast {len(tail)} log lines:\n" + "\n".join(tail)
    return message


def flush_logs(
    runner: Runner, event: Mapping[str, Any], log: logging.Logger | Any, cursor_file: CursorFile | None = None
) -> LogPosition:
    """Log what neither the event's position nor the cursor file's (the newer wins) covers yet
    (a resumed task's last lines); save and return the position reached. An event without
    cursors (not streaming) logs nothing."""
    position = newest(event_position(event), cursor_file.load() if cursor_file else None)
    if event.get("log_cursors") is None:
        return position
    watcher = JobWatcher(
        runner, str(event["app_handle"]), log, stream_logs=True, position=position, cursor_file=cursor_file
    )
    status = runner.status(watcher.app_handle)
    if status is not None:
        watcher.stream(status)
    return watcher.position


def deadline_from(timeout_seconds: float | None) -> float | None:
    """An absolute deadline (epoch seconds) ``timeout_seconds`` from now."""
    return None if timeout_seconds is None else time.time() + timeout_seconds
