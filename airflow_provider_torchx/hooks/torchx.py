"""``TorchXHook``: a ``torchx`` connection turned into a configured ``Runner``.

Also holds the blocking job-watching logic shared by the operator (worker mode), the sensor and
the trigger (which runs it off the event loop): status, log streaming with ``[role/k]``
prefixes, progress lines and the final outcome as a JSON-able event payload.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from airflow.exceptions import AirflowException, AirflowNotFoundException
from airflow.sdk import BaseHook

from airflow_provider_torchx.core.errors import InvalidRunConfigError
from airflow_provider_torchx.core.logstream import LogFollower, last_lines
from airflow_provider_torchx.core.runner import DEFAULT_SESSION_NAME, Runner, get_runner
from airflow_provider_torchx.core.specs import AppState, AppStatus, parse_app_handle

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
    """``[operators] default_deferrable``, read through the Task SDK's ``conf`` (Airflow >= 3.2)
    or core's (3.1)."""
    parser: Any
    try:
        from airflow.sdk import conf as parser
    except ImportError:  # Airflow 3.1
        from airflow.configuration import conf as parser
    return bool(parser.getboolean("operators", "default_deferrable", fallback=False))


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
    """``<handle> RUNNING: 2 replicas running, 1 done, 0 pending; elapsed 12s``."""
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
    return f"{app_handle} {status.state.name}: replicas {parts}; elapsed {elapsed:.0f}s"


class JobWatcher:
    """Follows one job for a task: streams its replicas' new log lines into ``log`` (each
    ``[role/k] line``, once, in order per replica), and turns its final status into an
    outcome payload. Blocking; the trigger calls it through ``asyncio.to_thread``."""

    def __init__(
        self,
        runner: Runner,
        app_handle: str,
        log: logging.Logger | Any,
        *,
        stream_logs: bool,
        cursors: Mapping[str, str] | None = None,
    ) -> None:
        self.runner = runner
        self.app_handle = app_handle
        self.log = log
        self.follower = LogFollower(runner, app_handle, cursors) if stream_logs else None

    @property
    def cursors(self) -> dict[str, str] | None:
        """Where each replica's log reading stands (``None`` when not streaming)."""
        return dict(self.follower.cursors) if self.follower else None

    def stream(self, status: AppStatus | None = None) -> int:
        """Log the lines written since the last call; return how many."""
        if self.follower is None:
            return 0
        lines = self.follower.poll(status)
        for line in lines:
            self.log.info("%s", line.format())
        return len(lines)

    def drain(self, status: AppStatus) -> None:
        """Log every remaining line of a terminal job."""
        while self.stream(status):
            pass

    def poll(self) -> AppStatus | None:
        """The job's status, after streaming what its replicas wrote (None: no such job)."""
        status = self.runner.status(self.app_handle)
        if status is not None:
            if status.is_terminal():
                self.drain(status)
            else:
                self.stream(status)
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
            tail = [
                line.rstrip("\n")
                for line in last_lines(self.runner, self.app_handle, rep.role, rep.id, FAILURE_TAIL_LINES)
            ]
        message = f"TorchX job {self.app_handle} ended {status.state.name}: {status.msg or 'no reason given'}{where}"
        return self.event("failed", state=status.state.name, message=message, tail=tail, ui_url=status.ui_url)

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        """An event payload of ``kind`` carrying the handle and the log cursors."""
        payload: dict[str, Any] = {"status": kind, "app_handle": self.app_handle, "log_cursors": self.cursors}
        payload.update(fields)
        return payload


def failure_message(event: Mapping[str, Any]) -> str:
    """The task's error text for a non-success event: the reason plus the log tail."""
    message = str(event.get("message") or f"TorchX job {event.get('app_handle')} did not succeed: {event}")
    tail = event.get("tail") or []
    if tail:
        message += f"\nLast {len(tail)} log lines:\n" + "\n".join(tail)
    return message


def flush_logs(runner: Runner, event: Mapping[str, Any], log: logging.Logger | Any) -> None:
    """Log what the event's cursors have not covered yet (a resumed task's last lines)."""
    cursors = event.get("log_cursors")
    if cursors is None:
        return
    watcher = JobWatcher(runner, str(event["app_handle"]), log, stream_logs=True, cursors=cursors)
    status = runner.status(watcher.app_handle)
    if status is not None:
        watcher.drain(status)


def deadline_from(timeout_seconds: float | None) -> float | None:
    """An absolute deadline (epoch seconds) ``timeout_seconds`` from now."""
    return None if timeout_seconds is None else time.time() + timeout_seconds
