"""What a deferred task's watch needs, as one frozen value: ``WatchSpec``.

``TorchXJobTrigger`` holds one and is rebuilt from its kwargs: ``WatchSpec.to_kwargs`` is the
trigger's serialised form (every value JSON-serialisable), ``WatchSpec(**kwargs)`` reads it
back, and an unknown key is a ``TypeError`` naming it. A setting is added here, once, with its
default: the trigger's constructor, its serialisation and its watcher take it from the spec.
``WatchSpec.for_job`` decides the fields from what the job's scheduler declares
(``Scheduler.capabilities``; docs/architecture.md, "Capabilities, not names").
"""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_provider_torchx.core.cursors import LogPosition
from airflow_provider_torchx.core.guards import Guards
from airflow_provider_torchx.core.identity import TaskIdentity
from airflow_provider_torchx.core.rates import Rates
from airflow_provider_torchx.core.specs import parse_app_handle

if TYPE_CHECKING:
    from airflow_provider_torchx.core.runner import Runner
    from airflow_provider_torchx.hooks.torchx import TorchXSettings


@dataclass(frozen=True)
class WatchSpec:
    """What a watch of the job ``app_handle`` needs.

    ``log_cursors`` (``{"role/k": cursor}``) and ``cursor_seq``: where the task log stood at
    ``defer()``; ``identity``: the task instance's job labels (``TaskIdentity`` in their wire
    form), naming the cursor file and the task instance whose state is read on start and when
    killed; ``deadline``: absolute (epoch seconds); ``host``: the host a job of a host-bound
    scheduler runs on; ``started_at`` (epoch seconds): when the task started, dating progress
    lines and the guards; ``cancel_on_kill``: cancel the job when Airflow kills the deferred task
    and the orphaned-jobs table says so; ``native_id``: the scheduler's own id of the job
    (``Runner.native_id``), so a fresh triggerer finds it without a look-up; ``start_timeout``,
    ``max_gpu_hours``, ``max_cost`` (priced at ``rates``, a ``Rates.to_dict()``): the guards
    (``core/guards.py``) held at each look; ``start_timeout_reason``: the cancel reason of a
    ``start_timeout`` trip, over the guard's own (a capacity ladder's move names the next rung);
    ``until_started``: the watch ends once the job left PENDING (event ``started``: a capacity
    ladder's task that does not wait for completion), serialised only when set.
    """

    app_handle: str
    aws_conn_id: str | None = None
    region_name: str | None = None
    poll_interval: float = 10
    stream_logs: bool = True
    log_cursors: Mapping[str, str] | None = None
    cursor_seq: int = 0
    identity: Mapping[str, str] | None = None
    deadline: float | None = None
    host: str | None = None
    started_at: float | None = None
    cancel_on_kill: bool = False
    native_id: str | None = None
    start_timeout: float | None = None
    max_gpu_hours: float | None = None
    max_cost: float | None = None
    rates: Mapping[str, float] | None = None
    start_timeout_reason: str | None = None
    until_started: bool = False

    @classmethod
    def for_job(
        cls,
        app_handle: str,
        runner: Runner,
        settings: TorchXSettings,
        *,
        poll_interval: float,
        stream_logs: bool,
        position: LogPosition,
        identity: Mapping[str, str],
        deadline: float | None,
        started_at: float,
        cancel_on_kill: bool = False,
        guards: Guards | None = None,
        start_timeout_reason: str | None = None,
        until_started: bool = False,
    ) -> WatchSpec:
        """The spec of a task's job, from what its scheduler declares: the AWS settings for one
        that uses an AWS session; this host for a host-bound one, so that a triggerer elsewhere
        says so instead of watching nothing; the job's native id (may look it up once, here in
        the worker). ``position``: where the task log stands."""
        capabilities = runner.capabilities(parse_app_handle(app_handle).scheduler_backend)
        return cls(
            app_handle,
            aws_conn_id=settings.aws_conn_id if capabilities.aws_session else None,
            region_name=settings.region_name if capabilities.aws_session else None,
            poll_interval=poll_interval,
            stream_logs=stream_logs,
            log_cursors=position.cursors if stream_logs else None,
            cursor_seq=position.seq,
            identity=identity,
            deadline=deadline,
            host=socket.gethostname() if capabilities.host_bound else None,
            started_at=started_at,
            cancel_on_kill=cancel_on_kill,
            native_id=runner.native_id(app_handle),
            start_timeout=guards.start_timeout if guards else None,
            max_gpu_hours=guards.max_gpu_hours if guards else None,
            max_cost=guards.max_cost if guards else None,
            rates=guards.rates.to_dict() if guards and guards.rates else None,
            start_timeout_reason=start_timeout_reason,
            until_started=until_started,
        )

    def to_kwargs(self) -> dict[str, Any]:
        """The trigger's kwargs: every field, its mappings as plain dicts of their own;
        ``until_started`` only when set (the kwargs of every other watch stay as they were)."""
        return {
            f.name: dict(value) if isinstance(value := getattr(self, f.name), Mapping) else value
            for f in dataclasses.fields(self)
            if f.name != "until_started" or self.until_started
        }

    def position(self) -> LogPosition:
        """Where the task log stood at ``defer()``."""
        return LogPosition(seq=self.cursor_seq, cursors=dict(self.log_cursors or {}))

    def task_identity(self) -> TaskIdentity | None:
        """The task instance ``identity`` names (None: none given)."""
        return TaskIdentity.from_labels(self.identity) if self.identity else None

    def guards(self) -> Guards:
        """The guards the watch holds at each look."""
        return Guards(
            self.start_timeout,
            self.max_gpu_hours,
            since=self.started_at,
            max_cost=self.max_cost,
            rates=Rates(**self.rates) if self.rates else None,
        )
