"""The Runner: submits ``AppDef`` jobs to schedulers and watches, tails and stops them.

It is the one door to the schedulers: it validates before anything is submitted, works on a
deep copy of the caller's app, injects ``TORCHX_JOB_ID`` (the job's own, parseable handle) and
turns app handles (``scheduler://session/app_id``) into calls on the right backend. Schedulers
are found through the entry-point group ``airflow_provider_torchx.schedulers`` and created
lazily, so importing the runner never imports a backend's client library.
"""

from __future__ import annotations

import builtins
import concurrent.futures
import copy
import dataclasses
import logging
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from importlib import metadata
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from airflow_provider_torchx.core.clock import SYSTEM_CLOCK, Clock
from airflow_provider_torchx.core.errors import RecordRefusedError, UnknownAppError, UnknownSchedulerError
from airflow_provider_torchx.core.rates import rates_of
from airflow_provider_torchx.core.runopts import Cfg, CfgVal, did_you_mean, runopts
from airflow_provider_torchx.core.schedulers.api import (
    CancelledBy,
    DescribeAppResponse,
    ListAppResponse,
    LogChunk,
    Scheduler,
    SchedulerCapabilities,
    Stream,
)
from airflow_provider_torchx.core.specs import (
    AppDef,
    AppDryRunInfo,
    AppStatus,
    Role,
    macros,
    make_app_handle,
    parse_app_handle,
    validate_app,
)

if TYPE_CHECKING:
    import asyncio

    from airflow_provider_torchx.core.checkpoint_prune import Use as CheckpointUse

log = logging.getLogger(__name__)

SCHEDULER_ENTRY_POINT_GROUP = "airflow_provider_torchx.schedulers"
#: Where a scheduler names a light function returning its run options, under its own name,
#: for the parse-time checks of a DAG file (``SchedulerCapabilities``).
RUN_OPTIONS_ENTRY_POINT_GROUP = "airflow_provider_torchx.run_options"
DEFAULT_SESSION_NAME = "torchx"
#: How long ``Runner.stop_refused`` waits for a job whose record is refused to stop (a local
#: supervisor kills its replicas after its grace period, 10 s by default), and how often it
#: looks.
REFUSED_STOP_TIMEOUT, REFUSED_STOP_POLL = 60.0, 0.5
#: The env var every replica gets: the job's own handle, parseable with ``parse_app_handle``.
JOB_ID_ENV = "TORCHX_JOB_ID"
PARENT_RUN_ID_ENV = "TORCHX_PARENT_RUN_ID"

SchedulerFactory = Callable[..., Scheduler[Any]]


def _entry_point_factories() -> dict[str, SchedulerFactory]:
    """Factories of every registered scheduler; each loads its module on first call only."""

    def lazy(ep: metadata.EntryPoint) -> SchedulerFactory:
        def factory(session_name: str, **kwargs: Any) -> Scheduler[Any]:
            factory_fn: SchedulerFactory = ep.load()
            return factory_fn(session_name, **kwargs)

        return factory

    return {ep.name: lazy(ep) for ep in metadata.entry_points(group=SCHEDULER_ENTRY_POINT_GROUP)}


def _copy_app(app: AppDef) -> AppDef:
    """A deep copy of ``app`` whose roles share the caller's ``overrides`` dicts (as TorchX)."""
    return copy.deepcopy(app, memo={id(role.overrides): role.overrides for role in app.roles})


class Runner:
    """Submits, monitors and manages jobs on the registered schedulers.

    ``name`` is the session name that goes into every app handle. Scheduler instances are
    created on first use with ``scheduler_params`` and closed by ``close()`` (or ``with``).
    """

    def __init__(
        self,
        name: str,
        scheduler_factories: Mapping[str, SchedulerFactory] | None = None,
        component_defaults: Mapping[str, Mapping[str, str]] | None = None,
        scheduler_params: Mapping[str, object] | None = None,
    ) -> None:
        self._name = name
        self._factories = dict(scheduler_factories if scheduler_factories is not None else _entry_point_factories())
        self._component_defaults = {k: dict(v) for k, v in (component_defaults or {}).items()}
        self._scheduler_params = dict(scheduler_params or {})
        self._schedulers: dict[str, Scheduler[Any]] = {}
        self._lock = threading.Lock()

    @property
    def session_name(self) -> str:
        """The session name in every handle this runner makes."""
        return self._name

    # ------------------------------------------------------------------ schedulers

    def scheduler_backends(self) -> list[str]:
        """Names of every registered scheduler backend."""
        return sorted(self._factories)

    def _scheduler(self, scheduler: str) -> Scheduler[Any]:
        with self._lock:
            sched = self._schedulers.get(scheduler)
            if sched is None:
                factory = self._factories.get(scheduler)
                if factory is None:
                    raise UnknownSchedulerError(
                        f"scheduler: unknown scheduler {scheduler!r}; known: {', '.join(self.scheduler_backends())}."
                        f"{did_you_mean(scheduler, self._factories)}"
                    )
                sched = factory(self._name, **self._scheduler_params)
                self._schedulers[scheduler] = sched
            return sched

    def _scheduler_app_id(self, app_handle: str) -> tuple[Scheduler[Any], str]:
        parsed = parse_app_handle(app_handle)
        return self._scheduler(parsed.scheduler_backend), parsed.app_id

    def capabilities(self, scheduler: str) -> SchedulerCapabilities:
        """What watchers need to know of ``scheduler`` (``Scheduler.capabilities``)."""
        return self._scheduler(scheduler).capabilities

    def check_settings(self, scheduler: str, cfg: Cfg | None = None) -> str:
        """Resolve ``cfg`` for ``scheduler`` and check it there (``Scheduler.check_settings``);
        return what was checked."""
        sched = self._scheduler(scheduler)
        return sched.check_settings(sched.run_opts().resolve(cfg))

    def default_checkpoint_root(self, scheduler: str) -> str | None:
        """Where ``scheduler``'s jobs checkpoint when no root is configured
        (``Scheduler.default_checkpoint_root``; None: nowhere)."""
        return self._scheduler(scheduler).default_checkpoint_root()

    def scheduler_run_opts(self, scheduler: str) -> runopts:
        """The run options of ``scheduler``."""
        return self._scheduler(scheduler).run_opts()

    def cfg_from_str(self, scheduler: str, *cfg_literal: str) -> dict[str, CfgVal]:
        """Parse ``key=value`` literals (each may hold ``a=1,b=2``) into ``scheduler``'s typed
        cfg; unknown keys and wrong types raise ``InvalidRunConfigError``."""
        return self.scheduler_run_opts(scheduler).cfg_from_str(*cfg_literal)

    # ------------------------------------------------------------------ submit

    def dryrun(
        self,
        app: AppDef,
        scheduler: str,
        cfg: Cfg | None = None,
        workspace: str | None = None,
        parent_run_id: str | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> AppDryRunInfo[Any]:
        """Validate ``app`` and render the request ``scheduler`` would get, without submitting.

        Works on a deep copy (returned as ``info.app``): builds workspaces into images,
        injects ``TORCHX_JOB_ID``. Raises a ``ValueError`` subclass naming the field for an
        invalid app, an unknown scheduler or a bad cfg, before anything is built.
        """
        sched = self._scheduler(scheduler)
        resolved_cfg = sched.run_opts().resolve(cfg)  # required options too, before any build
        app = _copy_app(app)
        if workspace is not None:
            warnings.warn(
                "the workspace argument is deprecated: set Role.workspace instead", DeprecationWarning, stacklevel=2
            )
            if app.roles:
                app.roles[0].workspace = workspace
        validate_app(app)
        for role in app.roles:
            if role.workspace:
                built = sched.build_workspace_image(role, resolved_cfg)
                if built is None:
                    log.warning("%s cannot build workspaces; role %s runs %s as is", scheduler, role.name, role.image)
                else:
                    role.image = built
            role.env[JOB_ID_ENV] = make_app_handle(scheduler, self._name, macros.app_id)
            if parent_run_id:
                role.env[PARENT_RUN_ID_ENV] = parent_run_id
        return sched.submit_dryrun(app, cfg, labels)

    def schedule(self, dryrun_info: AppDryRunInfo[Any]) -> str:
        """Submit a dry-run request (``dryrun_info.request`` as is); return the app handle."""
        if dryrun_info.scheduler is None:
            raise ValueError("dryrun_info: carries no scheduler; make it with Runner.dryrun")
        app_id = self._scheduler(dryrun_info.scheduler).schedule(dryrun_info)
        return make_app_handle(dryrun_info.scheduler, self._name, app_id)

    def run(
        self,
        app: AppDef,
        scheduler: str,
        cfg: Cfg | None = None,
        workspace: str | None = None,
        parent_run_id: str | None = None,
        dryrun: bool = False,
        labels: Mapping[str, str] | None = None,
    ) -> Any:
        """Submit ``app`` and return its handle (``dryrun=True``: return the dry-run info)."""
        info = self.dryrun(app, scheduler, cfg, workspace, parent_run_id, labels)
        return info if dryrun else self.schedule(info)

    def component_app(self, component: str, component_args: list[str] | dict[str, Any]) -> AppDef:
        """The app ``component`` returns for ``component_args`` (with this runner's defaults for
        it), to adjust before ``dryrun``."""
        from airflow_provider_torchx.core.components import get_app

        return get_app(component, component_args, self._component_defaults.get(component))

    def dryrun_component(
        self,
        component: str,
        component_args: list[str] | dict[str, Any],
        scheduler: str,
        cfg: Cfg | None = None,
        workspace: str | None = None,
        parent_run_id: str | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> AppDryRunInfo[Any]:
        """Resolve ``component`` with ``component_args`` and dry-run the app it returns."""
        app = self.component_app(component, component_args)
        return self.dryrun(app, scheduler, cfg, workspace, parent_run_id, labels)

    def run_component(
        self,
        component: str,
        component_args: list[str] | dict[str, Any],
        scheduler: str,
        cfg: Cfg | None = None,
        workspace: str | None = None,
        parent_run_id: str | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> str:
        """Resolve ``component`` with ``component_args`` and submit the app; return its handle."""
        return self.schedule(
            self.dryrun_component(component, component_args, scheduler, cfg, workspace, parent_run_id, labels)
        )

    def build_workspace(
        self, app_or_role: AppDef | Role, scheduler: str, cfg: Cfg | None = None
    ) -> str | dict[tuple[str, str], str] | None:
        """Build workspaces into images without submitting (see the runner seed).

        A ``Role`` gives its built image, or None without a workspace (or without workspace
        support). An ``AppDef`` gives ``{(image, workspace): built}`` for its roles with a
        workspace, each pair built once; empty when the scheduler cannot build.
        """
        sched = self._scheduler(scheduler)
        if isinstance(app_or_role, Role):
            role = copy.deepcopy(app_or_role)
            return sched.build_workspace_image(role, cfg or {}) if role.workspace else None
        built: dict[tuple[str, str], str] = {}
        for role in copy.deepcopy(app_or_role.roles):
            if not role.workspace or (role.image, role.workspace) in built:
                continue
            image = sched.build_workspace_image(role, cfg or {})
            if image is None:
                return {}
            built[(role.image, role.workspace)] = image
        return built

    # ------------------------------------------------------------------ observe

    def status(self, app_handle: str) -> AppStatus | None:
        """How the app is doing (state, replicas, the scheduler's message): what watchers
        look at. None if the scheduler does not know it."""
        sched, app_id = self._scheduler_app_id(app_handle)
        return _app_status(sched.describe(app_id))

    def finalize(self, app_handle: str) -> AppStatus | None:
        """Settle an app that ended without its scheduler recording it (``Scheduler.finalize``:
        a local job whose supervisor died is stopped and recorded); its status then, or None
        when there was nothing to settle. Blocking: never on an event loop."""
        sched, app_id = self._scheduler_app_id(app_handle)
        return _app_status(sched.finalize(app_id))

    def status_on_loop(self, app_handle: str, period: float | None = None) -> asyncio.Future[AppStatus | None] | None:
        """The app's status as a future of the running event loop, which the scheduler
        resolves from a thread of its own (``Scheduler.describe_on_loop_as``, mapped there:
        one future per look; ``period`` asks for its next scheduled look); None: call
        ``status`` instead. Call it on the loop; never blocks."""
        import asyncio

        sched, app_id = self._scheduler_app_id(app_handle)
        return sched.describe_on_loop_as(app_id, _app_status, asyncio.get_running_loop(), period)

    def describe_app_future(
        self, app_handle: str, period: float | None = None
    ) -> concurrent.futures.Future[DescribeAppResponse | None] | None:
        """``describe_app`` as a future (``Scheduler.describe_future``); None: call
        ``describe_app`` instead. Never blocks."""
        sched, app_id = self._scheduler_app_id(app_handle)
        return sched.describe_future(app_id) if period is None else sched.describe_future(app_id, period)

    def describe(self, app_handle: str) -> AppDef | None:
        """The app's definition (``AppDef``: roles, images, env) rebuilt from what the
        scheduler keeps, to show or re-run it (completeness varies), or None."""
        sched, app_id = self._scheduler_app_id(app_handle)
        desc = sched.describe(app_id)
        return None if desc is None else AppDef(name=app_id, roles=desc.roles)

    def describe_native(self, app_handle: str) -> AppDryRunInfo[Any] | None:
        """The request as the scheduler got it (its own form, e.g. Batch's job definition),
        read back to inspect it, or None."""
        sched, app_id = self._scheduler_app_id(app_handle)
        return sched.describe_native(app_id)

    def describe_app(self, app_handle: str) -> DescribeAppResponse | None:
        """Everything the scheduler says of the app in one answer (``DescribeAppResponse``:
        status, roles, labels, whether a cancel was requested), for callers that need more
        than ``status`` (labels to adopt a job, its env to find its secrets), or None if it
        does not know it. Its usage is priced at the rates the job carries."""
        sched, app_id = self._scheduler_app_id(app_handle)
        desc = sched.describe(app_id)
        return None if desc is None else _priced(desc)

    def native_id(self, app_handle: str) -> str | None:
        """The scheduler's own id of the app, for a watcher elsewhere (``Scheduler.native_id``);
        may block for one look-up."""
        sched, app_id = self._scheduler_app_id(app_handle)
        return sched.native_id(app_id)

    def wait_reason(self, app_handle: str) -> str:
        """Why the app has not started, in its scheduler's words (``Scheduler.wait_reason``);
        may block for a few calls: asked once, when a guard trips (``core/guards.py``)."""
        sched, app_id = self._scheduler_app_id(app_handle)
        return sched.wait_reason(app_id)

    def adopt_native_id(self, app_handle: str, native_id: str) -> None:
        """Tell the scheduler the app's own id (``Scheduler.adopt_native_id``). Never blocks."""
        sched, app_id = self._scheduler_app_id(app_handle)
        sched.adopt_native_id(app_id, native_id)

    def change_fd(self, app_handle: str) -> int | None:
        """A descriptor readable when the app may have changed (``Scheduler.change_fd``); the
        caller closes it. None: poll."""
        sched, app_id = self._scheduler_app_id(app_handle)
        return sched.change_fd(app_id)

    def read_error_file(self, app_handle: str, role_name: str, k: int) -> tuple[str, float] | None:
        """The replica's torchrun error file and when it was written
        (``Scheduler.read_error_file``); None: none readable here."""
        sched, app_id = self._scheduler_app_id(app_handle)
        return sched.read_error_file(app_id, role_name, k)

    def rank_stderr(self, app_handle: str, role_name: str, k: int, local_rank: int, n: int) -> list[str] | None:
        """The last ``n`` lines a local rank of the replica wrote to its own stderr
        (``Scheduler.rank_stderr``); None: none readable here."""
        sched, app_id = self._scheduler_app_id(app_handle)
        return sched.rank_stderr(app_id, role_name, k, local_rank, n)

    def sidecar_dir(self, app_handle: str) -> Path | None:
        """Where watchers may keep their own files beside the job (``Scheduler.sidecar_dir``);
        None: under the host's state dir."""
        sched, app_id = self._scheduler_app_id(app_handle)
        return sched.sidecar_dir(app_id)

    def wait(
        self,
        app_handle: str,
        wait_interval: float = 10,
        timeout: float | None = None,
        cancel_on_signal: bool | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> AppStatus | None:
        """Block until the app is terminal; return its status (None: no such app).

        Looks every ``wait_interval`` seconds, but a scheduler that can be notified (local)
        ends the wait as soon as the job ends. On ``timeout`` returns the last, non-terminal
        status. With ``cancel_on_signal`` (default: when called in the main thread) SIGTERM
        and SIGINT cancel the job and re-raise (as ``SignalException``); the previous
        handlers are restored afterwards. The watching rules are ``core/logstream.py``'s,
        on ``clock``.
        """
        from airflow_provider_torchx.core.logstream import JobWatch  # when watching: the CLI's list needs none

        deadline = None if timeout is None else clock.wall() + timeout
        return JobWatch(self, app_handle, stream_logs=False, clock=clock).wait(
            wait_interval, deadline, cancel_on_signal=cancel_on_signal
        )

    def wait_for_change(self, app_handle: str, timeout: float) -> None:
        """Block up to ``timeout`` seconds or until the app may have changed
        (``Scheduler.wait_for_change``; local: its end cuts the wait short)."""
        sched, app_id = self._scheduler_app_id(app_handle)
        sched.wait_for_change(app_id, timeout)

    def list(
        self,
        scheduler: str,
        cfg: Cfg | None = None,
        labels: Mapping[str, str] | None = None,
        *,
        limit: int | None = None,
    ) -> list[ListAppResponse]:
        """The apps on ``scheduler`` carrying every ``labels`` pair, with their handles, oldest
        first; ``limit``: only the newest ``limit`` of them (``Scheduler.list``)."""
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise ValueError(f"limit: {limit!r} is not allowed; an integer >= 0, or None for every app")
        apps = self._scheduler(scheduler).list(cfg, labels, limit=limit)
        for app in apps:
            app.app_handle = make_app_handle(scheduler, self._name, app.app_id)
        return apps

    def count(self, scheduler: str, cfg: Cfg | None = None, labels: Mapping[str, str] | None = None) -> int:
        """How many apps ``list(scheduler, cfg, labels)`` returns (``Scheduler.count``)."""
        return self._scheduler(scheduler).count(cfg, labels)

    def list_live(self, scheduler: str, cfg: Cfg | None = None) -> builtins.list[ListAppResponse]:
        """The apps on ``scheduler`` that have not ended (``Scheduler.list_live``), with their handles."""
        apps = self._scheduler(scheduler).list_live(cfg)
        for app in apps:
            app.app_handle = make_app_handle(scheduler, self._name, app.app_id)
        return apps

    def prune(
        self, scheduler: str, older_than: float, states: Iterable[str] = (), dry_run: bool = False
    ) -> builtins.list[tuple[str, int]]:
        """Remove ``scheduler``'s jobs that ended more than ``older_than`` seconds ago
        (``Scheduler.prune``): ``(app_id, bytes freed)`` per job, oldest first."""
        return self._scheduler(scheduler).prune(older_than, states, dry_run)

    def pruning_schedulers(self) -> tuple[builtins.list[str], dict[str, Exception]]:
        """The registered schedulers with the ``prune`` capability (the ones that keep their
        jobs' records), and each one that failed to load with why (a plugin missing or
        broken: its jobs are not ours to judge)."""
        names: builtins.list[str] = []
        failed: dict[str, Exception] = {}
        for name in self.scheduler_backends():
            try:
                if self.capabilities(name).prune:
                    names.append(name)
            except Exception as err:
                failed[name] = err
        return names, failed

    def checkpoint_uses(self, schedulers: Iterable[str]) -> dict[str, builtins.list[CheckpointUse]]:
        """The local checkpoint locations the kept jobs of ``schedulers`` name, with those jobs
        (``Scheduler.checkpoint_uses``)."""
        found: dict[str, builtins.list[CheckpointUse]] = {}
        for name in schedulers:
            for location, uses in self._scheduler(name).checkpoint_uses().items():
                found.setdefault(location, []).extend(uses)
        return found

    # ------------------------------------------------------------------ logs

    def log_lines(
        self,
        app_handle: str,
        role_name: str,
        k: int = 0,
        regex: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        should_tail: bool = False,
        streams: Stream | None = None,
    ) -> Iterable[str]:
        """Lines (each ending in ``"\\n"``) of replica ``k`` of ``role_name``; follows the
        log until the app ends with ``should_tail``. Unknown app: ``UnknownAppError``."""
        sched, app_id = self._scheduler_app_id(app_handle)
        if not sched.exists(app_id):
            raise UnknownAppError(f"app_handle: no app {app_handle!r}")
        return sched.log_iter(app_id, role_name, k, regex, since, until, should_tail, streams)

    def read_log(
        self,
        app_handle: str,
        role_name: str,
        k: int = 0,
        cursor: str | None = None,
        streams: Stream | None = None,
        max_lines: int | None = None,
    ) -> LogChunk:
        """Lines of replica ``k`` of ``role_name`` after ``cursor`` and the cursor to go on
        from (see ``Scheduler.read_log``). Unknown app: ``UnknownAppError``."""
        sched, app_id = self._scheduler_app_id(app_handle)
        return sched.read_log(app_id, role_name, k, cursor, streams, max_lines)

    # ------------------------------------------------------------------ stop

    def cancel(self, app_handle: str, *, reason: str | None = None, by: CancelledBy | None = None) -> None:
        """Ask for the app to stop; it ends CANCELLED asynchronously. Idempotent. ``reason``
        (who or what asks) and ``by`` (who, in ``CancelledBy``'s vocabulary) are recorded
        where the scheduler can (``Scheduler.cancel``)."""
        sched, app_id = self._scheduler_app_id(app_handle)
        sched.cancel(app_id, reason=reason, by=by)

    def stop_refused(
        self,
        app_handle: str,
        *,
        reason: str,
        by: CancelledBy | None = None,
        timeout: float = REFUSED_STOP_TIMEOUT,
        clock: Clock = SYSTEM_CLOCK,
    ) -> bool:
        """Stop a job whose record the scheduler refuses (``RecordRefusedError``: it cannot be
        described, yet may still run) and wait until nothing of it runs, so that whoever
        watched it gives up only once it stopped. The cancel reaches such a job all the same
        (the refusal raised says ``delivered``) and is asked again every ``REFUSED_STOP_POLL``
        seconds until the scheduler finds nothing of it running (the refusal without
        ``delivered``, or its record readable again and ended). Returns whether it stopped
        within ``timeout``. Blocks."""
        deadline = clock.monotonic() + timeout
        while True:
            try:
                self.cancel(app_handle, reason=reason, by=by)
                status = self.status(app_handle)  # readable again: its end was written over the refused file
                if status is None or status.is_terminal():
                    return True
            except RecordRefusedError as e:
                if not e.delivered:
                    return True
            if clock.monotonic() >= deadline:
                return False
            clock.sleep(REFUSED_STOP_POLL)

    def stop(self, app_handle: str) -> None:
        """Deprecated alias of ``cancel``."""
        warnings.warn("Runner.stop is deprecated: use Runner.cancel", DeprecationWarning, stacklevel=2)
        self.cancel(app_handle)

    def delete(self, app_handle: str) -> None:
        """Cancel the app if needed and remove it from the scheduler. Idempotent."""
        sched, app_id = self._scheduler_app_id(app_handle)
        sched.delete(app_id)

    def close(self) -> None:
        """Close every scheduler this runner created. Safe to call twice."""
        with self._lock:
            schedulers, self._schedulers = list(self._schedulers.values()), {}
        for sched in schedulers:
            sched.close()

    def __enter__(self) -> Runner:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _priced(desc: DescribeAppResponse) -> DescribeAppResponse:
    """``desc`` with its usage priced at the rates the job carries (``core/rates.py``), if any."""
    rates = rates_of(desc.labels)
    if rates is None:
        return desc
    return dataclasses.replace(
        desc,
        usage=None if desc.usage is None else dataclasses.replace(desc.usage, rates=rates),
        usage_so_far=None if desc.usage_so_far is None else dataclasses.replace(desc.usage_so_far, rates=rates),
    )


def _app_status(desc: DescribeAppResponse | None) -> AppStatus | None:
    """A scheduler's answer as the runner's ``AppStatus`` (None: no such app), its usage priced
    at the job's rates."""
    if desc is None:
        return None
    desc = _priced(desc)
    return AppStatus(
        state=desc.state,
        num_restarts=desc.num_restarts,
        msg=desc.msg,
        structured_error_msg=desc.structured_error_msg,
        ui_url=desc.ui_url,
        roles=desc.roles_statuses,
        usage=desc.usage,
        usage_so_far=desc.usage_so_far,
        guard_trip=desc.guard_trip,
    )


def get_runner(
    name: str | None = None,
    component_defaults: Mapping[str, Mapping[str, str]] | None = None,
    **scheduler_params: Any,
) -> Runner:
    """A ``Runner`` with every registered scheduler; ``scheduler_params`` go to each
    scheduler's factory (e.g. ``session=`` a boto3 session for ``aws_batch``)."""
    return Runner(
        name or DEFAULT_SESSION_NAME,
        component_defaults=component_defaults,
        scheduler_params=scheduler_params,
    )
