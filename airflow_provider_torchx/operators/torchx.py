"""``TorchXRunOperator``: submit a TorchX app (an ``AppDef`` or a component) and wait for it.

The task dry-runs (``dryrun=True``: logs the native request and returns it) or submits, records
the app handle (return value, XCom, extra links), then waits in the worker or deferred to
``TorchXJobTrigger``, streaming every replica's log lines into the task log as
``[role/k] line``. It fails with the failed replica, its exit code or reason and its last log
lines; ``on_kill`` cancels the job (as the one decision table, ``orphans.decide``, says). boto3
and docker are only imported by the backends that need them, when they are used.
"""

from __future__ import annotations

import copy
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeGuard

from airflow.sdk import BaseOperator

from airflow_provider_torchx import checkpointing
from airflow_provider_torchx._compat import AirflowFailException
from airflow_provider_torchx.core.checkpoints import check_root
from airflow_provider_torchx.core.errors import InvalidRunConfigError
from airflow_provider_torchx.core.failures import Failure
from airflow_provider_torchx.core.guards import (
    MAX_COST,
    MAX_GPU_HOURS,
    START_TIMEOUT,
    Guards,
    Trip,
    guard_cfg,
    positive_limit,
    smaller,
)
from airflow_provider_torchx.core.identity import TaskIdentity
from airflow_provider_torchx.core.numbers import positive_number
from airflow_provider_torchx.core.schedulers.api import CancelledBy
from airflow_provider_torchx.core.specs import AppDef, parse_app_handle
from airflow_provider_torchx.failures import FailureKind, TorchXJobFailed, failure_block, failure_error
from airflow_provider_torchx.hooks.torchx import TorchXHook, default_deferrable, hook_for_handle
from airflow_provider_torchx.ladder import conn_ids, handover_line, rung_start_timeout
from airflow_provider_torchx.links.torchx import TorchXConsoleLink, TorchXJobLink, absolute_url, job_links
from airflow_provider_torchx.masking import MaskedLog, redact, redact_request, register_app_secrets
from airflow_provider_torchx.metrics import emit_failed, emit_guardrail
from airflow_provider_torchx.operators import adopt
from airflow_provider_torchx.operators.checks import check_literal_arguments, fail_without_retry, request_dict
from airflow_provider_torchx.retention import apply_retention
from airflow_provider_torchx.usage_report import report_usage

# What only a running task uses (the watching path, the trigger and through it Airflow's
# ``airflow.triggers``, the cancel reasons) is imported where it is used: a DAG file that
# imports this module does not pay for it (benchmarks/import_time.py).
if TYPE_CHECKING:
    from airflow.providers.openlineage.extractors import OperatorLineage
    from airflow.sdk import Context

    from airflow_provider_torchx.core.cursors import CursorFile, LogPosition
    from airflow_provider_torchx.core.runner import Runner
    from airflow_provider_torchx.core.usage import Usage
    from airflow_provider_torchx.operators.climb import Climb
    from airflow_provider_torchx.outcome import Outcome
    from airflow_provider_torchx.watch import TaskWatcher


@dataclass(frozen=True)
class _TaskJob:
    """The job a task watches: its handle, the task instance's identity, its cursor file
    and the log position to go on from, and whether it ended already (an adopted one)."""

    handle: str
    identity: TaskIdentity
    cursor_file: CursorFile
    position: LogPosition
    ended: bool


def _seconds(value: timedelta | float | None) -> float | None:
    return value.total_seconds() if isinstance(value, timedelta) else value


class TorchXRunOperator(BaseOperator):
    """Runs a TorchX app on a scheduler and waits for it (see the module docstring).

    :param app: the ``AppDef`` to run (or give ``component``)
    :param component: a component name (``utils.sh``, ``dist.spmd``, ``file.py:fn``)
    :param component_args: the component's arguments: a CLI-style list or a dict (templated)
    :param app_name: overrides the app's name (templated)
    :param env: environment variables added to every role (templated)
    :param scheduler: scheduler backend, over the connection's
    :param cfg: run options merged over the connection's, a dict or ``k=v,...`` (templated)
    :param torchx_conn_id: the ``torchx`` connection (optional when ``scheduler`` is given), or
        a list of them: a capacity ladder, tried in order; the job moves to the next rung when
        it cannot start (the rung's ``start_timeout``, else the task's) or after the rung's
        ``max_infra_failures`` (docs/architecture.md, "Capacity ladder")
    :param dryrun: log and return the native request; submit nothing
    :param wait_for_completion: wait for the job (else return the handle once submitted; with a
        ladder, once the job left PENDING on a rung it may still leave: a sensor on the handle
        watches the job's last rung, and the ladder moves it no more)
    :param deferrable: wait in the triggerer (default ``[operators] default_deferrable``)
    :param poll_interval: seconds between status polls, log reads and progress lines
    :param stream_logs: copy every replica's log lines into the task log
    :param cancel_on_kill: cancel the job when the task is killed (worker; deferred on Airflow >= 3.3)
    :param reattach_on_retry: a retried task adopts its still-running job instead of submitting
    :param timeout: bound on the wait (also deferred); on timeout the job is cancelled
    :param retry_after_outside_cancel: retry the task after a cancel from outside it (the CLI,
        the UI's jobs page, AWS by hand); by default such a cancel fails the task without retry
    :param checkpoint_root: where the task instance's checkpoint location is made, over the
        connection's and ``[torchx] checkpoint_root`` (an absolute path or a URI such as
        ``s3://bucket/prefix``): every replica gets ``TORCHX_CHECKPOINT_DIR`` and ``TORCHX_ATTEMPT``
        (docs/checkpoints.md)
    :param fresh_start: on the first try of a DAG run or of a clear (never a retry), set what
        the task instance's local checkpoint location holds aside (renamed beside it, kept) so the
        job starts over instead of resuming; the task log names both paths
    :param start_timeout: seconds (or a ``timedelta``) the job may take from its submission
        until a replica runs; then it is cancelled and the task fails without retry (default:
        the connection's extra ``start_timeout``; ``core/guards.py``)
    :param max_gpu_hours: the job's GPU budget, counted as its usage summary counts it; over
        it, the job is cancelled and the task fails without retry (the connection's extra
        ``max_gpu_hours`` too: the smaller wins)
    :param max_cost: the job's budget in US dollars, its cost so far priced at the connection's
        ``rates`` (else ``[torchx] rates``; docs/cost-and-lineage.md); over it, the job is
        cancelled and the task fails without retry (the connection's extra ``max_cost`` too:
        the smaller wins). A job that cannot be priced fails before it is submitted.
    """

    template_fields: Sequence[str] = ("component_args", "app_name", "env", "cfg")
    template_fields_renderers = {"component_args": "json", "env": "json", "cfg": "json"}
    operator_extra_links = (TorchXJobLink(), TorchXConsoleLink())
    ui_color = "#ee4c2c"

    def __init__(
        self,
        *,
        app: AppDef | None = None,
        component: str | None = None,
        component_args: list[str] | dict[str, Any] | None = None,
        app_name: str | None = None,
        env: dict[str, str] | None = None,
        scheduler: str | None = None,
        cfg: Mapping[str, Any] | str | None = None,
        torchx_conn_id: str | Sequence[str] = TorchXHook.default_conn_name,
        dryrun: bool = False,
        wait_for_completion: bool = True,
        deferrable: bool = default_deferrable(),
        poll_interval: float = 10,
        stream_logs: bool = True,
        cancel_on_kill: bool = True,
        reattach_on_retry: bool = True,
        timeout: timedelta | float | None = None,
        retry_after_outside_cancel: bool = False,
        checkpoint_root: str | None = None,
        fresh_start: bool = False,
        start_timeout: timedelta | float | None = None,
        max_gpu_hours: float | None = None,
        max_cost: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if (app is None) == (component is None):
            raise ValueError(
                f"app/component: give exactly one of app= (an AppDef) or component= (a name), got "
                f"app={app!r}, component={component!r}"
            )
        if app is not None and not isinstance(app, AppDef):
            raise TypeError(f"app: expected an AppDef, got {type(app).__name__}")
        if positive_number(poll_interval) is None:
            raise ValueError(f"poll_interval: {poll_interval!r} is not allowed: expected a number of seconds > 0")
        check_literal_arguments(
            app=app, component=component, scheduler=scheduler, cfg=cfg, component_args=component_args
        )
        self.app = app
        self.component = component
        self.component_args = component_args if component_args is not None else []
        self.app_name = app_name
        self.env = env
        #: The connection of each rung (one: no ladder); ``torchx_conn_id`` is the rung's in use.
        self.rungs = conn_ids(torchx_conn_id)
        if scheduler is not None and len(self.rungs) > 1:
            raise ValueError(
                f"scheduler: {scheduler!r} is not allowed with a ladder (torchx_conn_id={list(self.rungs)!r}): "
                "each rung's connection names its scheduler"
            )
        self.scheduler = scheduler
        self.cfg = cfg
        self.torchx_conn_id = self.rungs[0]
        self.dryrun = dryrun
        self.wait_for_completion = wait_for_completion
        self.deferrable = deferrable
        self.poll_interval = poll_interval
        self.stream_logs = stream_logs
        self.cancel_on_kill = cancel_on_kill
        self.reattach_on_retry = reattach_on_retry
        self.timeout = timeout
        self.retry_after_outside_cancel = retry_after_outside_cancel
        self.checkpoint_root = None if checkpoint_root is None else check_root(checkpoint_root, "checkpoint_root")
        self.fresh_start = fresh_start
        #: The task instance's checkpoint location (None: none), once known.
        self.checkpoint_dir: str | None = None
        self.start_timeout = positive_limit(START_TIMEOUT, start_timeout, seconds=True)
        self.max_gpu_hours = positive_limit(MAX_GPU_HOURS, max_gpu_hours, seconds=False)
        self.max_cost = positive_limit(MAX_COST, max_cost, seconds=False, unit="US dollars")
        self.app_handle: str | None = None
        self._runner: Runner | None = None
        #: The task instance whose job ``app_handle`` is (what ``on_kill`` hands the table).
        self._identity: TaskIdentity | None = None
        #: The ended job's usage summary (``core/usage.py``) and final state, once the task reported it.
        self.usage: Usage | None = None
        self.job_state: str | None = None
        #: This try's way down a capacity ladder (``operators/climb.py``; None: no ladder).
        self._climb: Climb | None = None

    # ------------------------------------------------------------------ building the job

    def hook(self) -> TorchXHook:
        """The hook for this task's connection (the rung's in use) and scheduler override."""
        return TorchXHook(self.torchx_conn_id, scheduler=self.scheduler)

    def build_app(self) -> AppDef:
        """The app to submit: ``app`` (copied) or the component's, with ``app_name`` and ``env``."""
        if self.app is not None:
            app = copy.deepcopy(self.app)
        else:
            from airflow_provider_torchx.core.components import get_app

            assert self.component is not None
            app = get_app(self.component, self.component_args)
        if self.app_name:
            app.name = self.app_name
        for role in app.roles:
            role.env.update({str(k): str(v) for k, v in (self.env or {}).items()})
        return app

    def _wait_seconds(self) -> float | None:
        """The bound on the wait: the smaller of ``timeout`` and ``execution_timeout``."""
        bounds = [s for s in (_seconds(self.timeout), _seconds(self.execution_timeout)) if s is not None]
        return min(bounds) if bounds else None

    def guards(self, hook: TorchXHook, since: float) -> Guards:
        """The guards the wait holds the job to: this task's, else the connection's
        ``start_timeout``; the smaller ``max_gpu_hours`` and ``max_cost``, the latter priced at
        the connection's rates. ``since``: when this try began (counted from only where the
        scheduler does not date the job's submission). ``InvalidRunConfigError`` for a
        ``max_cost`` with nothing to price the job: no rates, and a scheduler without the
        ``prices_attempts`` capability."""
        settings = hook.settings
        if len(self.rungs) > 1:  # a rung's own limit first: it says how long to wait there
            start = rung_start_timeout(settings.start_timeout, self.start_timeout)
        else:
            start = self.start_timeout if self.start_timeout is not None else settings.start_timeout
        guards = Guards(
            start,
            smaller(self.max_gpu_hours, settings.max_gpu_hours),
            since=since,
            max_cost=smaller(self.max_cost, settings.max_cost),
            rates=settings.rates,
        )
        prices_attempts = (
            guards.max_cost is not None
            and guards.rates is None
            and hook.get_runner().capabilities(settings.scheduler).prices_attempts
        )
        try:
            guards.require_priced(
                f"the `rates` extra of connection {self.torchx_conn_id!r} or [torchx] rates", prices_attempts
            )
        except ValueError as e:
            raise InvalidRunConfigError(str(e)) from None
        return guards

    # ------------------------------------------------------------------ execute

    def execute(self, context: Context) -> str | dict[str, Any]:
        with fail_without_retry(self.component):
            return self._execute(context)

    def _execute(self, context: Context) -> str | dict[str, Any]:
        """Submit (or, on a retry, adopt) the job, then return at once, defer or wait; with a
        ladder, move the job down it as ``ladder.decide`` says (``operators/climb.py``)."""
        from airflow_provider_torchx.operators.climb import Climb
        from airflow_provider_torchx.watch import TaskWatcher

        started_at = time.time()
        climb = self._climb = Climb.check(self, context) if len(self.rungs) > 1 else None  # before submitting
        if climb is not None and self.reattach_on_retry and not self.dryrun:
            climb.locate(context)
        hook = self.hook()
        guards = self.guards(hook, started_at)  # a bad connection extra fails before anything is submitted
        runner = self._runner = hook.get_runner()
        job = self._submit_or_adopt(context, hook, runner, guards, climb=climb)
        if isinstance(job, dict):  # a dry run: the rendered request
            return job
        if not self.wait_for_completion and climb is None:
            return self._report_success(context, job.cursor_file, job.position, job.handle)
        wait_seconds = self._wait_seconds()
        deadline = None if wait_seconds is None else started_at + wait_seconds
        while True:
            if self._returns_at_once(climb):
                return self._hand_over(context, job.cursor_file, job.position, job.handle, climb)
            if self.deferrable and not job.ended:
                self._defer(hook, runner, job, deadline, started_at, guards, climb)
            watcher = TaskWatcher(
                runner,
                job.handle,
                MaskedLog(self.log),
                stream_logs=self.stream_logs,
                position=job.position,
                cursor_file=job.cursor_file,
                guards=guards,
                start_timeout_reason=climb.start_timeout_reason() if climb is not None else None,
                until_started=not self.wait_for_completion,
            )
            outcome = self._wait_in_worker(watcher, started_at, deadline)
            moved = climb.next_rung(context, outcome) if climb is not None else None
            if moved is None:
                return self._finish(outcome, context, job.cursor_file, watcher.position, climb)
            hook, runner, guards, job = moved

    def _returns_at_once(self, climb: Climb | None) -> TypeGuard[Climb]:
        """Whether a ladder's task that does not wait for completion returns its job's handle
        as soon as it is submitted: on the last rung, where nothing moves it, as without a
        ladder; on the others it watches the job until it left PENDING (``until_started``)."""
        return climb is not None and climb.last and not self.wait_for_completion

    def _hand_over(
        self,
        context: Context,
        cursor_file: CursorFile,
        position: LogPosition,
        handle: str,
        climb: Climb,
        state: str | None = None,
    ) -> str:
        """Return the handle of a ladder's job to a task that does not wait for completion (a
        sensor watches it from here: ``ladder.handover_line`` says so in the task log); the
        job is disowned now, not at submit: until here the task may still move it."""
        from airflow_provider_torchx.orphans import DISOWNED_XCOM

        self.log.info("%s", handover_line(climb.rungs, climb.index, handle, state))
        context["ti"].xcom_push(key=DISOWNED_XCOM, value=handle)  # not to be cancelled with the task
        return self._report_success(context, cursor_file, position, handle)

    def _submit_or_adopt(
        self,
        context: Context,
        hook: TorchXHook,
        runner: Runner,
        guards: Guards,
        *,
        climb: Climb | None = None,
        moving: bool = False,
    ) -> _TaskJob | dict[str, Any]:
        """The task's job: on a retry the earlier try's one it adopts (``adopt.find_earlier``,
        whose listing also gives the attempts a new job continues past),
        else a new one submitted with the ``guards`` its scheduler holds itself
        (``guards.guard_cfg``); recorded for the task (state store, XCom, links; with a ladder,
        ``climb``'s record and the rung's label). ``moving``: the job moves to ``climb``'s
        rung: never adopted, its checkpoints never set aside, its attempts continued. A dry run
        submits nothing and returns the rendered request instead."""
        from airflow_provider_torchx.core.cursors import LogPosition, newest
        from airflow_provider_torchx.orphans import DISOWNED_XCOM
        from airflow_provider_torchx.watch import cursor_file_for, task_identity

        scheduler = hook.settings.scheduler
        cfg = hook.resolve_cfg(self.cfg)
        held = climb.scheduler_guards(guards) if climb is not None else guards
        cfg.update(guard_cfg(held, runner.scheduler_run_opts(scheduler)))
        identity = task_identity(context)
        rates = hook.settings.rates
        labels = identity.labels() | ({} if rates is None else rates.labels())  # what the job carries
        if climb is not None:
            labels |= climb.labels()
        earlier = None
        if self.reattach_on_retry and not self.dryrun and not moving and context["ti"].try_number > 1:
            earlier = adopt.find_earlier(runner, scheduler, cfg, identity, context, self.log)
        adopted = earlier.chosen if earlier is not None else None
        app = self.build_app()
        register_app_secrets(app)  # before anything is logged
        if adopted is None:
            self.checkpoint_dir = checkpointing.prepare(
                app,
                operator_root=self.checkpoint_root,
                hook=hook,
                runner=runner,
                scheduler=scheduler,
                cfg=cfg,
                identity=identity,
                try_number=context["ti"].try_number,
                dryrun=self.dryrun,
                fresh_start=not moving
                and self.fresh_start
                and checkpointing.first_try_of_run(context["ti"], self.retries or 0),
                moved_attempts=climb.attempts if climb is not None else (),
                earlier=earlier.attempts if earlier is not None else None,
            )
            with warnings.catch_warnings(record=True) as caught:  # into the task log, once
                warnings.simplefilter("always")
                info = runner.dryrun(app, scheduler, cfg, labels=labels)
            for warning in caught:
                self.log.warning("%s", warning.message)
            if self.dryrun:
                rendered = redact_request(str(info), cfg)
                self.log.info("Dry run on %s, nothing submitted. Request:\n%s", scheduler, rendered)
                return request_dict(rendered)
            handle = runner.schedule(info)
            self.log.info("Submitted %s", handle)
            apply_retention(runner, scheduler, self.log)  # [torchx] retain_finished; off by default
            cursor_file = cursor_file_for(runner, handle, identity)
            position = LogPosition()
            cursor_file.save(position)  # "watched by this task instance, not reported yet"
        else:
            handle = adopted.app_handle
            cursor_file = cursor_file_for(runner, handle, identity)
            position = newest(cursor_file.load())
            self.checkpoint_dir = checkpointing.location_of(runner, handle)  # as it was given
        self.app_handle, self._identity = handle, identity
        adopt.remember_job(context, handle, reported=False)
        context["ti"].xcom_push(key="app_handle", value=handle)
        if climb is not None:
            climb.submitted(context, handle)
        checkpointing.report(context, self.checkpoint_dir, self.log)
        self._persist_links(context, runner, handle)
        if (not self.wait_for_completion and climb is None) or not self.cancel_on_kill:
            context["ti"].xcom_push(key=DISOWNED_XCOM, value=handle)  # not to be cancelled with the task
        ended = adopted is not None and adopted.state.is_terminal()
        return _TaskJob(handle, identity, cursor_file, position, ended)

    def _defer(
        self,
        hook: TorchXHook,
        runner: Runner,
        job: _TaskJob,
        deadline: float | None,
        started_at: float,
        guards: Guards | None = None,
        climb: Climb | None = None,
    ) -> None:
        """Hand the wait to ``TorchXJobTrigger`` (raises ``TaskDeferred``); a ladder's
        ``climb`` travels in the deferral's kwargs to ``execute_complete``."""
        from airflow_provider_torchx.triggers.torchx import TorchXJobTrigger

        self.defer(
            trigger=TorchXJobTrigger.for_job(
                job.handle,
                runner,
                hook.settings,
                poll_interval=self.poll_interval,
                stream_logs=self.stream_logs,
                position=job.position,
                identity=job.identity.labels(),  # the trigger's kwargs: the wire form
                deadline=deadline,
                started_at=started_at,
                cancel_on_kill=self.cancel_on_kill,
                guards=guards,
                start_timeout_reason=climb.start_timeout_reason() if climb is not None else None,
                until_started=not self.wait_for_completion,
            ),
            method_name="execute_complete",
            kwargs=climb.to_kwargs(deadline, started_at) if climb is not None else None,
        )

    def _persist_links(self, context: Context, runner: Runner, handle: str) -> None:
        """Record the job's page (and its scheduler's console, if any) for the task's extra links."""
        status = runner.status(handle)
        for link, url in job_links(handle, status.ui_url if status else None, self.torchx_conn_id):
            link.persist(context, url)
            if url:
                self.log.info("%s: %s", link.name, absolute_url(url))

    def _wait_in_worker(self, watcher: TaskWatcher, started_at: float, deadline: float | None) -> Outcome:
        """Wait for the job in the worker on the one watching path (``watch.py``); return the
        outcome."""
        return watcher.wait_for_outcome(self.poll_interval, deadline, started_at)

    def _finish(
        self,
        outcome: Outcome,
        context: Context,
        cursor_file: CursorFile,
        position: LogPosition,
        climb: Climb | None = None,
    ) -> str:
        """Return the handle of a succeeded job (recording that this try reported it), or of a
        ladder's job that left PENDING (``started``: ``_hand_over``); otherwise cancel on
        timeout and raise. A ladder's ``climb`` records the end first."""
        from airflow_provider_torchx.cancels import outside_canceller, task_cancel_reason
        from airflow_provider_torchx.outcome import End
        from airflow_provider_torchx.watch import task_identity

        handle = outcome.app_handle
        state = outcome.state.name if outcome.state is not None else None
        if climb is not None and outcome.end is End.STARTED:  # a ladder's task that does not wait
            return self._hand_over(context, cursor_file, position, handle, climb, state)
        if climb is not None:
            assert self._runner is not None
            climb.finish(context, outcome, self._runner)
        if outcome.trip is not None:
            self._guardrail(outcome, outcome.trip, context)
        if outcome.refused:  # its record refused: stopped before this (watch.py, refused_outcome)
            raise AirflowFailException(redact(str(outcome.message)))
        if outcome.end is End.SUCCESS:
            self._report_usage(handle, context)
            self.job_state = state
            self.log.info("TorchX job %s SUCCEEDED", handle)
            return self._report_success(context, cursor_file, position, handle)
        assert self._runner is not None
        desc = self._runner.describe_app(handle) if outcome.end is not End.TIMEOUT else None
        failure = outcome.reported_failure(desc)
        if outcome.end is End.FAILED:
            self._report_usage(handle, context, failure=failure)
            self.job_state = state
        if outcome.end is End.TIMEOUT:
            within = f"did not end within {self._wait_seconds():.0f}s"
            reason = task_cancel_reason(task_identity(context), f"timed out ({within})")
            self._runner.cancel(handle, reason=reason, by=CancelledBy.TASK)
            message = f"TorchX job {handle} {within} (still {state}); cancelled it"
            raise self._failed(message, failure, handle, outcome)
        message = str(redact(outcome.failure_message()))
        if outcome.end is End.FAILED and failure.kind is FailureKind.TIMEOUT:  # the attempt's own time limit
            self._guardrail_line("attempt_timeout", message.splitlines()[0], handle)
        who = None if self.retry_after_outside_cancel else outside_canceller(desc)
        if who:
            message = (
                f"{message}\nThe job was cancelled from outside this task, by {redact(who)}: not retried "
                "(retry_after_outside_cancel=True retries after such a cancel)"
            )
        raise self._failed(message, failure, handle, outcome, no_retry=bool(who))

    def _failed(
        self, message: str, failure: Failure, handle: str, outcome: Outcome, *, no_retry: bool = False
    ) -> TorchXJobFailed:
        """The exception for the job's failure (``failures.failure_error``), its kind written to
        the task log (``Failure kind: app (ValueError on trainer/0)``) and counted
        (``torchx.job.failed``, tag ``kind``)."""
        failure = Failure(failure.kind, str(redact(failure.why)))  # a reason may quote a secret
        self.log.error("%s", redact(failure_block(failure, outcome)))  # the log's closing block
        emit_failed(
            scheduler=parse_app_handle(handle).scheduler_backend,
            dag_id=self.dag_id,
            task_id=self.task_id,
            kind=failure.kind.value,
        )
        root = outcome.root_cause
        return failure_error(
            message, failure, no_retry=no_retry, app_handle=handle, root_cause=str(redact(root)) if root else None
        )

    def _guardrail(self, outcome: Outcome, trip: Trip, context: Context) -> None:
        """A guard stopped the job (the watcher cancelled it): one line in the task log, the
        metric, the usage summary (saying when the GPU budget was hit), then the failure,
        without retry (a ``start_timeout``, kind ``capacity``, is left to the task's retry
        policy when it has one: ``failures.py``)."""
        handle = outcome.app_handle
        message = str(redact(str(outcome.message)))
        self._guardrail_line(trip.guard, message, handle)
        failure = outcome.reported_failure(None)
        budget = trip if trip.guard in (MAX_GPU_HOURS, MAX_COST) else None
        self._report_usage(handle, context, budget=budget, failure=failure)
        self.job_state = trip.state.name
        policy = getattr(self, "retry_policy", None)  # Airflow >= 3.3
        no_retry = failure.kind != FailureKind.CAPACITY or policy is None
        raise self._failed(message, failure, handle, outcome, no_retry=no_retry)

    def _report_usage(
        self,
        handle: str,
        context: Context,
        budget: Trip | None = None,
        failure: Failure | None = None,
    ) -> None:
        """The ended (or guard-stopped) job's usage summary: logged, pushed, emitted
        (``usage_report.report_usage``), with the kind of its ``failure``."""
        assert self._runner is not None
        self.usage = report_usage(
            self._runner,
            handle,
            context,
            self.log,
            self.app_name or getattr(self.app, "name", None),
            checkpoint_dir=self.checkpoint_dir,
            budget=budget,
            failure_kind=failure.kind if failure else None,
            ladder=self._climb.totals() if self._climb is not None else None,
        )

    def _guardrail_line(self, guard: str, message: str, handle: str) -> None:
        """The guard's one line in the task log and its ``torchx.job.guardrail`` count."""
        self.log.error("Guardrail %s tripped: %s", guard, message)
        emit_guardrail(
            scheduler=parse_app_handle(handle).scheduler_backend, dag_id=self.dag_id, task_id=self.task_id, guard=guard
        )

    def _report_success(self, context: Context, cursor_file: CursorFile, position: LogPosition, handle: str) -> str:
        """Mark the job as reported by a try (so a later clear submits a new one) and return it."""
        cursor_file.mark_reported(position)
        adopt.remember_job(context, handle, reported=True)
        return handle

    def execute_complete(self, context: Context, event: dict[str, Any], ladder: Mapping[str, Any] | None = None) -> str:
        """Resume after the trigger's event: flush the remaining log lines (from the newest of
        the event's and the cursor file's positions), then return the handle or raise. With
        a ``ladder`` (``Climb.to_kwargs``), a job that moves is submitted to the next rung and
        the task defers again."""
        from airflow_provider_torchx.core.cursors import newest
        from airflow_provider_torchx.operators.climb import Climb
        from airflow_provider_torchx.outcome import Outcome
        from airflow_provider_torchx.watch import cursor_file_for, flush_logs, task_identity

        outcome = Outcome.from_event(event)
        climb = self._climb = Climb.resume(self, ladder) if ladder is not None else None
        self.app_handle = outcome.app_handle
        self._identity = task_identity(context)
        self._runner = hook_for_handle(self.torchx_conn_id, self.app_handle).get_runner()
        cursor_file = cursor_file_for(self._runner, self.app_handle, self._identity)
        self.checkpoint_dir = checkpointing.location_of(self._runner, self.app_handle)
        if self.stream_logs:
            position = flush_logs(self._runner, outcome, self.log, cursor_file)
        else:
            position = newest(outcome.position, cursor_file.load())
        moved = climb.next_rung(context, outcome) if climb is not None else None
        if moved is not None:
            assert ladder is not None
            hook, runner, guards, job = moved
            if self._returns_at_once(climb):
                return self._hand_over(context, job.cursor_file, job.position, job.handle, climb)
            self._defer(hook, runner, job, ladder["deadline"], ladder["started_at"], guards, climb)
        return self._finish(outcome, context, cursor_file, position, climb)

    def on_kill(self) -> None:
        """The task was killed in the worker: cancel its job as the table decides
        (``orphans.decide``, killed in the worker: the state is not at hand, so
        ``cancel_on_kill`` says)."""
        from airflow_provider_torchx.orphans import Killed, Verdict
        from airflow_provider_torchx.reaper.decisions import own_decision

        if not self.app_handle or self._runner is None:
            return
        decision = own_decision(self._identity, None, killed=Killed(in_worker=True, cancel_on_kill=self.cancel_on_kill))
        if decision.verdict == Verdict.CANCEL:
            self.log.info("Task killed: cancelling %s", self.app_handle)
            self._runner.cancel(self.app_handle, reason=decision.detail, by=CancelledBy.TASK)

    # ------------------------------------------------------------------ OpenLineage (lineage.py)

    def get_openlineage_facets_on_start(self) -> OperatorLineage:
        """The app, its scheduler and the task's inlets/outlets, before anything is submitted."""
        return self._lineage()

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> OperatorLineage:
        """As on start, plus the app handle, the job's final state and its usage summary."""
        return self._lineage()

    def get_openlineage_facets_on_failure(self, task_instance: Any) -> OperatorLineage:
        """As on complete (the usage of a failed job is reported too)."""
        return self._lineage()

    def _lineage(self) -> OperatorLineage:
        from airflow_provider_torchx.lineage import operator_lineage

        if self.app_handle:
            scheduler = parse_app_handle(self.app_handle).scheduler_backend
        else:
            scheduler = self.scheduler or self.hook().settings.scheduler
        return operator_lineage(
            self.build_app(),
            scheduler,
            self.inlets,
            self.outlets,
            self.app_handle,
            self.job_state,
            self.usage,
            checkpoint_dir=self.checkpoint_dir,
        )
