"""``TorchXJobTrigger``: watches a submitted job from the triggerer for a deferred task.

It streams every replica's new log lines into the task log while the job runs (the lines
left when it ends are the resumed task's: ``watch.py``, ``TaskWatcher.await_outcome``), logs a
progress line when the job's state changes (else once a minute) and yields exactly one event:
``success``, ``failed`` (with the reason and the failed replica's last lines), ``timeout``
(the absolute ``deadline`` passed), ``error`` (also for a job whose record the scheduler
refuses, once it stopped it: ``TaskWatcher.refused_outcome``) or, for a spec
``until_started``, ``started`` (the job left PENDING): an ``Outcome``'s payload
(``outcome.py``, ``to_event``). It never raises for a job's
failure: the task's ``execute_complete`` raises. It follows the one watching path (``watch.py``): waiting
for a status holds no thread, and the blocking calls left run on the provider's own thread
pool, never on the loop's default executor.

Exactly-once logs across triggerer restarts: kwargs are fixed at ``defer()``, so after logging
each batch the trigger saves its position in the cursor file of its task instance and job
(``core/cursors.py``); a restarted trigger goes on from the highest-numbered position of its
kwargs and the file. Cancelling while deferred: Airflow >= 3.3 calls ``on_kill``; older
versions only cancel the trigger's task, as on a triggerer restart. Either way the trigger
reads its task instance's state through the Task SDK and the one decision table
(``orphans.decide``, killed) decides: cancel when the task instance ended, keep it while still
deferred (a triggerer restart), cleared or retrying. Whichever cancel ends the job, the
trigger's last word in the task log says so and why (a task marked while deferred never
resumes to say it). The first look never waits for a Task SDK
answer (a fresh triggerer takes seconds to give its first): the start check runs beside the
watch (docs/architecture.md, "In the triggerer").
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import socket
from collections.abc import AsyncIterator
from typing import Any

from airflow.exceptions import AirflowNotFoundException
from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_torchx.core.cursors import newest
from airflow_provider_torchx.core.errors import RecordRefusedError
from airflow_provider_torchx.core.identity import TaskIdentity
from airflow_provider_torchx.core.runner import Runner
from airflow_provider_torchx.core.schedulers.api import CancelledBy, DescribeAppResponse
from airflow_provider_torchx.core.specs import AppDef, AppState, parse_app_handle
from airflow_provider_torchx.hooks.torchx import (
    PrefetchedConnection,
    TorchXHook,
    TorchXSettings,
    amazon_provider_installed,
)
from airflow_provider_torchx.masking import MaskedLog, amask_secrets, job_secrets, redact
from airflow_provider_torchx.metrics import emit_orphan_cancelled
from airflow_provider_torchx.orphans import Killed, TaskView, Verdict
from airflow_provider_torchx.outcome import End, Outcome
from airflow_provider_torchx.reaper.decisions import own_decision
from airflow_provider_torchx.triggers.watchspec import WatchSpec
from airflow_provider_torchx.watch import LOG_SETTLE, TaskWatcher, cursor_file_for, run_blocking

#: Airflow >= 3.3 calls ``BaseTrigger.on_kill`` when a deferred task is killed; older versions
#: have no such hook and only cancel the trigger's task, as they do on a triggerer restart.
TRIGGER_HAS_ON_KILL = hasattr(BaseTrigger, "on_kill")
#: The trigger's keyword arguments besides ``app_handle``: the fields of its ``WatchSpec``.
_SPEC_FIELDS = frozenset(f.name for f in dataclasses.fields(WatchSpec)) - {"app_handle"}
#: Start checks whose Task SDK request outlives their trigger's watch, held until they end.
_UNFINISHED: set[asyncio.Future[None]] = set()


async def get_task_states(dag_id: str, task_id: str, run_id: str, map_index: int) -> dict[str, Any]:
    """``RuntimeTaskInstance.get_task_states`` for one task instance, sent through the
    triggerer's Task SDK channel with ``asend``: the synchronous call cannot run inside a
    trigger on Airflow 3.1/3.2. Returns ``{run_id: {task_id | f"{task_id}_{map_index}": state}}``."""
    from airflow.sdk.execution_time import task_runner
    from airflow.sdk.execution_time.comms import GetTaskStates

    comms = getattr(task_runner, "SUPERVISOR_COMMS", None)
    if comms is None:
        raise RuntimeError("this process has no Task SDK supervisor channel")
    answer = await comms.asend(GetTaskStates(dag_id=dag_id, task_ids=[task_id], run_ids=[run_id], map_index=map_index))
    states = getattr(answer, "task_states", None)
    if not isinstance(states, dict):
        raise RuntimeError(f"unexpected answer to GetTaskStates: {answer!r}")
    return states


async def task_instance_state(ident: TaskIdentity) -> str | None:
    """The current state of the task instance ``ident``; None is Airflow's "no state" (e.g.
    just cleared). Raises if it cannot be read."""
    dag_id, task_id, run_id, map_index = ident
    states = await get_task_states(dag_id, task_id, run_id, map_index)
    key = task_id if map_index < 0 else f"{task_id}_{map_index}"
    of_run = states.get(run_id) or {}
    if key not in of_run:
        raise LookupError(f"no task instance {key!r} in run {run_id!r}")
    state = of_run[key]
    return None if state is None else str(getattr(state, "value", state))


def _app_of(described: DescribeAppResponse | BaseException | None, app_handle: str) -> AppDef | None:
    """The app of a description (``Runner.describe``'s answer), or what describing raised."""
    if isinstance(described, BaseException):
        raise described
    return None if described is None else AppDef(name=described.app_id, roles=described.roles)


class TorchXJobTrigger(BaseTrigger):
    """Waits for the job ``app_handle`` to end (see the module docstring), as ``spec`` says
    (``WatchSpec``: its fields are the trigger's keyword arguments and its serialised kwargs,
    and read as the trigger's attributes). ``cancel_on_kill`` never acts on a triggerer
    restart, nor in ``cleanup()``."""

    def __init__(self, app_handle: str, **spec: Any) -> None:
        super().__init__()
        unknown = sorted(set(spec) - _SPEC_FIELDS)
        if unknown:
            raise TypeError(
                f"TorchXJobTrigger: unknown argument(s) {', '.join(map(repr, unknown))}; "
                f"known: {', '.join(sorted(_SPEC_FIELDS))}"
            )
        self.spec = WatchSpec(app_handle, **spec)
        self._final_event_fired = False

    def __getattr__(self, name: str) -> Any:
        """A field of the spec, read as the trigger's own attribute (``trigger.app_handle``)."""
        spec = self.__dict__.get("spec")
        if spec is not None and name in _SPEC_FIELDS | {"app_handle"}:
            return getattr(spec, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @classmethod
    def for_job(cls, app_handle: str, runner: Runner, settings: TorchXSettings, **watch: Any) -> TorchXJobTrigger:
        """The trigger a task defers to (the operator and the sensor both build it here), of
        ``WatchSpec.for_job``'s spec (``watch``: its keyword arguments): what the job's
        scheduler declares decides it."""
        kwargs = WatchSpec.for_job(app_handle, runner, settings, **watch).to_kwargs()
        return cls(kwargs.pop("app_handle"), **kwargs)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """The class path and the kwargs that rebuild this trigger (``WatchSpec.to_kwargs``)."""
        return (f"{type(self).__module__}.{type(self).__qualname__}", self.spec.to_kwargs())

    async def _aws_connection(self) -> PrefetchedConnection | None:
        """The connection ``aws_conn_id`` fetched on the loop with the Task SDK's async
        ``aget_connection``, for the hook to build its boto3 session from on the pool (where
        the synchronous lookup must not run) and to tell whether it changed since the shared
        runner was built (``TorchXHook.aws_fingerprint``); None when the Amazon provider, which
        alone reads it, is not installed or there is no ``aws_conn_id``; also when it cannot be
        fetched this way (``dag.test()``'s in-process channel has no async form): the hook then
        looks it up itself, as a task would."""
        if not self.spec.aws_conn_id or not amazon_provider_installed():
            return None
        from airflow.sdk import BaseHook

        try:
            return PrefetchedConnection(self.spec.aws_conn_id, await BaseHook.aget_connection(self.spec.aws_conn_id))
        except AirflowNotFoundException:
            return PrefetchedConnection(self.spec.aws_conn_id, None)
        except Exception as e:
            self.log.warning(
                "could not fetch connection %r on the loop: %s: %s", self.spec.aws_conn_id, type(e).__name__, e
            )
            return None

    def _runner(self, aws_connection: PrefetchedConnection | None) -> Runner:
        """The shared runner, told the job's native id when the trigger carries one (blocks)."""
        parsed = parse_app_handle(self.spec.app_handle)
        hook = TorchXHook(
            None,
            scheduler=parsed.scheduler_backend,
            session_name=parsed.session_name,
            aws_conn_id=self.spec.aws_conn_id,
            region_name=self.spec.region_name,
            aws_connection=aws_connection,
        )
        runner = hook.get_runner()
        if self.spec.native_id:
            runner.adopt_native_id(self.spec.app_handle, self.spec.native_id)
        return runner

    def _watcher(self, aws_connection: PrefetchedConnection | None) -> TaskWatcher:
        """A watcher starting from the newest of the kwargs' position and the cursor file's."""
        runner = self._runner(aws_connection)
        given = self.spec.position()
        ident = self.spec.task_identity()
        cursor_file = cursor_file_for(runner, self.spec.app_handle, ident) if ident is not None else None
        saved = cursor_file.load() if cursor_file is not None and self.spec.stream_logs else None
        position = newest(given, saved)
        if saved is not None and saved.seq > given.seq:
            self.log.info(
                "Resuming the log of %s from its saved position #%d (%s): lines before it were logged already",
                self.spec.app_handle,
                saved.seq,
                cursor_file,
            )
        return TaskWatcher(
            runner,
            self.spec.app_handle,
            MaskedLog(self.log),
            stream_logs=self.spec.stream_logs,
            position=position,
            cursor_file=cursor_file,
            guards=self.spec.guards(),
            start_timeout_reason=self.spec.start_timeout_reason,
            until_started=self.spec.until_started,
        )

    async def _job_secrets(self, runner: Runner) -> list[tuple[str, str]]:
        """The job's secrets (``masking.job_secrets``) from its description, awaited on the
        loop where the scheduler answers futures: a fresh triggerer's triggers then share the
        status poller's first round instead of holding a watch-pool thread each for one round;
        read on the pool otherwise."""
        future = runner.describe_app_future(self.spec.app_handle)
        if future is None:
            return await run_blocking(job_secrets, runner.describe, self.spec.app_handle)
        (described,) = await asyncio.gather(asyncio.wrap_future(future), return_exceptions=True)
        return job_secrets(functools.partial(_app_of, described), self.spec.app_handle)

    def _wrong_host(self) -> str | None:
        """Why this triggerer cannot watch the job: it runs on another host than the job of a
        host-bound scheduler (``host`` is only set for those)."""
        here = socket.gethostname()
        if self.spec.host and self.spec.host != here:
            return (
                f"job {self.spec.app_handle} runs on host {self.spec.host!r} but this triggerer runs on {here!r}: "
                "its scheduler's jobs can only be watched from their own host; run a triggerer there "
                "or use deferrable=False"
            )
        return None

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Poll and stream until the job ends or the deadline passes; yield one event."""
        watcher: TaskWatcher | None = None
        check: asyncio.Task[None] | None = None
        try:
            wrong_host = self._wrong_host()
            if wrong_host:
                yield TriggerEvent(Outcome(End.ERROR, self.spec.app_handle, message=wrong_host).to_event())
                return
            watcher = await run_blocking(self._watcher, await self._aws_connection())
            if self.spec.cancel_on_kill and self.spec.identity:
                check = asyncio.create_task(self._start_check(watcher))
            # This process did not build the app: read its secrets, register them on the loop
            # (never a synchronous Task SDK call), before its first line is logged.
            await amask_secrets(await self._job_secrets(watcher.runner))
            outcome = await watcher.await_outcome(self.spec.poll_interval, self.spec.deadline, self.spec.started_at)
            self._final_event_fired = True
            if outcome.state is AppState.CANCELLED:
                # The task may never resume (it was marked failed or success, and the reaper
                # cancelled its job): say here, in its log, that and why the job was cancelled.
                await self._last_word(str(outcome.message))
            yield TriggerEvent(redact(outcome.to_event()))
        except asyncio.CancelledError:
            if not TRIGGER_HAS_ON_KILL and not self._final_event_fired:
                await self._on_killed()
            raise
        except RecordRefusedError as e:
            # It cannot be watched, yet it is still a job: stopped before the task fails.
            if watcher is None:
                watcher = await run_blocking(self._watcher, await self._aws_connection())
            outcome = await run_blocking(watcher.refused_outcome, e)
            self._final_event_fired = True
            yield TriggerEvent(redact(outcome.to_event()))
        except Exception as e:
            self.log.exception("watching %s failed", self.spec.app_handle)
            message = f"watching {self.spec.app_handle} failed: {type(e).__name__}: {e}"
            if watcher is not None:
                outcome = watcher.ended(End.ERROR, message=message)
            else:
                position = (self.spec.cursor_seq, self.spec.log_cursors)
                outcome = Outcome(End.ERROR, self.spec.app_handle, *position, message=message)
            yield TriggerEvent(redact(outcome.to_event()))
        finally:
            if check is not None:
                check.cancel()

    async def _last_word(self, line: str) -> None:
        """Log ``line`` into the task log as the trigger's last, and give it time to get there
        before the trigger ends (the triggerer closes the trigger's log then)."""
        MaskedLog(self.log).info("%s", line)
        await asyncio.sleep(min(self.spec.poll_interval, LOG_SETTLE))

    async def _start_check(self, watcher: TaskWatcher) -> None:
        """``_cancel_if_orphaned`` beside the watch, once its first round is over and the job
        goes on: the first Task SDK request a fresh triggerer serves builds Airflow's in-process
        execution API, and until it answers (seconds) its supervisor writes no log line and
        passes no event (docs/architecture.md, "In the triggerer"). Cancelled (the watch
        ended), it stops waiting, but a request once sent is shielded and finishes on its own:
        Airflow 3.1's channel, cancelled midway, hands the unread answer to the runner's next
        request and its trigger runner dies."""
        await watcher.first_round.wait()
        asking = asyncio.ensure_future(self._checked_on_start())
        _UNFINISHED.add(asking)
        asking.add_done_callback(_UNFINISHED.discard)
        await asyncio.shield(asking)

    async def _checked_on_start(self) -> None:
        """``_cancel_if_orphaned``, whose failure is logged (never raised)."""
        try:
            await self._cancel_if_orphaned()
        except Exception as e:
            self.log.warning("the start check of %s failed: %s: %s", self.spec.app_handle, type(e).__name__, e)

    async def _task_view(self, ident: TaskIdentity, *, marked: bool) -> TaskView:
        """What the trigger reads of its task instance: its state (``TaskView.of_state``;
        ``marked``: a user set it, as when the task's kill reached the trigger). Raises when it
        cannot be read."""
        return TaskView.of_state(await task_instance_state(ident), marked=marked)

    async def _on_killed(self) -> None:
        """The task's kill reached the trigger (``on_kill`` on Airflow >= 3.3; on 3.1/3.2 the
        trigger was cancelled, as on a triggerer restart): the table (``orphans.decide`` with
        ``Killed``) decides from the task instance's state, read here unless ``cancel_on_kill``
        is off (the table then keeps the job whatever the state): still ``deferred`` (a
        triggerer restart or reassignment) or cleared keeps the job, an ended state cancels it
        at once; an unreadable state leaves it to the reaper."""
        ident = self.spec.task_identity()
        task = None
        if ident is not None and self.spec.cancel_on_kill:
            try:
                task = await self._task_view(ident, marked=True)
            except Exception as e:
                self.log.warning(
                    "Trigger stopped; could not read the task instance's state (%s: %s)", type(e).__name__, e
                )
        decision = own_decision(ident, task, killed=Killed(cancel_on_kill=self.spec.cancel_on_kill))
        if decision.verdict != Verdict.CANCEL:
            self.log.info("Trigger stopped: leaving %s running (%s)", self.spec.app_handle, decision.why)
            return
        self.log.info("Task killed while deferred: cancelling %s: %s", self.spec.app_handle, decision.detail)
        await self._cancel(decision.detail, CancelledBy.TASK)

    async def _cancel_if_orphaned(self) -> None:
        """On start: a task marked (failed, success, ...) before this trigger ran gets no
        ``on_kill``; if the table (``orphans.decide``) says its job is an orphan, cancel it now
        (by the orphaned-jobs rule). An unreadable state changes nothing."""
        ident = self.spec.task_identity()
        assert ident is not None
        try:
            task = await self._task_view(ident, marked=False)
        except Exception as e:
            self.log.debug("could not read the task instance's state on start: %s: %s", type(e).__name__, e)
            return
        decision = own_decision(ident, task)
        if decision.verdict == Verdict.CANCEL:
            self.log.info(
                "Task is no longer deferred (now %s): cancelling %s: %s",
                task.state,
                self.spec.app_handle,
                decision.detail,
            )
            await self._cancel(decision.detail, CancelledBy.REAPER)
            emit_orphan_cancelled(
                scheduler=parse_app_handle(self.spec.app_handle).scheduler_backend,
                dag_id=ident.dag_id,
                task_id=ident.task_id,
                reason=str(decision.reason),
            )

    async def _cancel(self, reason: str, by: CancelledBy) -> None:
        """Cancel the job, saying why (the reason names the task instance and what ended it)
        and who asks (``by``), and say in the task log, as the trigger's last word, the reason
        the job's record keeps (``cancel_reason``: another component's, such as the reaper's,
        when its cancel came first and the job ended already)."""
        runner = await run_blocking(self._runner, await self._aws_connection())
        await run_blocking(functools.partial(runner.cancel, self.spec.app_handle, reason=reason, by=by))
        try:
            described = await run_blocking(runner.describe_app, self.spec.app_handle)
        except Exception:
            described = None
        kept = described.cancel_reason if described is not None and described.cancel_reason else reason
        await self._last_word(f"Cancelled TorchX job {self.spec.app_handle}: {kept}")

    async def on_kill(self) -> None:
        """The deferred task was killed (Airflow >= 3.3 calls this): ``_on_killed``, unless the
        final event has already fired. Idempotent."""
        if not self._final_event_fired:
            await self._on_killed()
