"""The operator's side of a capacity ladder (docs/architecture.md, "Capacity ladder"): what
``ladder.py``'s rules need read from the rungs' connections and schedulers, and the move
itself (cancel, log, count, submit to the next rung). ``TorchXRunOperator`` keeps one
``Climb`` per try while its ``torchx_conn_id`` is a list; a deferred task carries it across
deferrals in the deferral's kwargs (``to_kwargs``, ``resume``), so the trigger knows nothing
of ladders.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_provider_torchx import checkpointing
from airflow_provider_torchx.core import checkpoints
from airflow_provider_torchx.core.failures import FailureKind, classify
from airflow_provider_torchx.core.schedulers.api import CancelledBy, DescribeAppResponse
from airflow_provider_torchx.core.specs import AppState
from airflow_provider_torchx.hooks.torchx import TorchXHook
from airflow_provider_torchx.ladder import (
    PLACE_KINDS,
    RUNG_LABEL,
    XCOM_KEY,
    Move,
    Outcome,
    Rung,
    Step,
    cancel_reason,
    check_checkpoints,
    decide,
    ended,
    infra_failures,
    move_line,
    retry_rung,
    rung_start_timeout,
    start_timeout_move,
    summed,
)
from airflow_provider_torchx.masking import redact
from airflow_provider_torchx.metrics import emit_moved
from airflow_provider_torchx.outcome import End

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_torchx import outcome as watched
    from airflow_provider_torchx.core.guards import Guards
    from airflow_provider_torchx.core.runner import Runner
    from airflow_provider_torchx.core.usage import Usage
    from airflow_provider_torchx.operators.torchx import TorchXRunOperator, _TaskJob


def read_rungs(op: TorchXRunOperator) -> list[Rung]:
    """Each rung of ``op``'s ladder as its connection and scheduler say."""
    rungs = []
    for conn_id in op.rungs:
        hook = TorchXHook(conn_id)
        settings = hook.settings
        runner = hook.get_runner()
        rungs.append(
            Rung(
                conn_id,
                settings.scheduler,
                runner.capabilities(settings.scheduler).host_paths,
                checkpointing.configured_root(op.checkpoint_root, hook, runner, settings.scheduler),
                rung_start_timeout(settings.start_timeout, op.start_timeout),
                settings.max_infra_failures,
            )
        )
    return rungs


def _attempt_reasons(desc: DescribeAppResponse | None) -> list[str]:
    usage = desc.usage if desc is not None else None
    return [a.reason for a in usage.attempts] if usage is not None else []


def _usage(runner: Runner, handle: str) -> Usage | None:
    """What job ``handle`` used (so far, if it has not ended); None where it cannot be read:
    the ladder's record and totals are a courtesy, never a reason to fail the task."""
    try:
        status = runner.status(handle)
    except Exception:
        return None
    return None if status is None else status.usage or status.usage_so_far


class Climb:
    """One try's way down the ladder: the rungs, the one in use (``index``), the rungs tried
    (``steps``, XCom ``ladder``) and the attempts of the jobs left (``attempts``: each its
    restarts + 1, so the next job's ``TORCHX_ATTEMPT`` continues past them)."""

    def __init__(
        self,
        op: TorchXRunOperator,
        rungs: list[Rung],
        index: int = 0,
        steps: list[Step] | None = None,
        attempts: list[int] | None = None,
    ) -> None:
        self.op, self.rungs, self.index = op, rungs, index
        self.steps = steps or []
        self.attempts = attempts or []

    @classmethod
    def check(cls, op: TorchXRunOperator, context: Context) -> Climb:
        """The ladder of ``op``, its rungs' shared checkpoint location checked
        (``ladder.check_checkpoints``: ``InvalidRunConfigError`` naming the rung) before
        anything is submitted."""
        from airflow_provider_torchx.watch import task_identity

        rungs = read_rungs(op)
        root = rungs[0].checkpoint_root
        location = checkpoints.checkpoint_dir(root, task_identity(context)) if root is not None else None
        check_checkpoints(rungs, location, op.build_app())
        return cls(op, rungs)

    def locate(self, context: Context) -> None:
        """On a retry, go to the rung of the task instance's newest job, listed by its identity
        and rung label on every rung's scheduler: the retry adopts it there
        (``adopt.find_earlier``, on that rung), or submits its new job there; or to the next
        rung when that job was cancelled for a move whose submit never came
        (``ladder.retry_rung``)."""
        from airflow_provider_torchx.watch import task_identity

        if context["ti"].try_number <= 1:
            return
        identity = task_identity(context).labels()
        newest: tuple[float, int, str, Runner] | None = None
        for i, rung in enumerate(self.rungs):
            hook = TorchXHook(rung.conn_id)
            runner = hook.get_runner()
            labels = identity | {RUNG_LABEL: rung.conn_id}
            for app in runner.list(rung.scheduler, hook.resolve_cfg(self.op.cfg), labels):
                created = app.created or 0.0
                if newest is None or created > newest[0]:
                    newest = (created, i, app.app_handle, runner)
        if newest is None:
            return
        _, index, handle, runner = newest
        desc = runner.describe_app(handle)
        by_task = desc is not None and desc.cancelled_by == CancelledBy.TASK
        index = retry_rung(self.rungs, index, desc.cancel_reason if desc is not None and by_task else None)
        if index != self.index:
            self.index = index
            self.op.torchx_conn_id = self.rung.conn_id
            where = f"rung {self.index + 1} {self.rung.name()}"
            if index != newest[1]:
                self.op.log.info("Retry: this task instance's job %s was moving to %s; it goes on there", handle, where)
            else:
                self.op.log.info("Retry: this task instance's newest job is on %s", where)

    @property
    def rung(self) -> Rung:
        """The rung in use."""
        return self.rungs[self.index]

    @property
    def last(self) -> bool:
        """Whether the rung in use is the last: the job moves no further."""
        return self.index == len(self.rungs) - 1

    def start_timeout_reason(self) -> str | None:
        """The cancel reason of the rung's ``start_timeout`` trip: the move's (None: the last rung)."""
        move = start_timeout_move(self.rungs, self.index)
        return cancel_reason(self.rungs[move.target], move) if move is not None else None

    def scheduler_guards(self, guards: Guards) -> Guards:
        """The guards the rung's scheduler is handed to hold itself (``guard_cfg``): all but a
        ``start_timeout`` that moves the job, which the task's watcher holds, so that the move
        cancels the job with its own reason (a task that does not wait for completion watches
        such a rung's job until it left PENDING)."""
        if self.start_timeout_reason() is None:
            return guards
        return dataclasses.replace(guards, start_timeout=None)

    def labels(self) -> dict[str, str]:
        """The label a job of this rung carries besides its identity (``RUNG_LABEL``)."""
        return {RUNG_LABEL: self.rung.conn_id}

    # ------------------------------------------------------------------ the record

    def submitted(self, context: Context, handle: str) -> None:
        """Record the rung's job ``handle`` (XCom ``ladder``)."""
        self.steps.append(Step(self.rung.conn_id, handle, submitted_at=time.time()))
        self.push(context)

    def push(self, context: Context) -> None:
        """Push the rungs tried to XCom ``ladder``."""
        context["ti"].xcom_push(key=XCOM_KEY, value=[s.to_dict() for s in self.steps])

    def finish(self, context: Context, outcome: watched.Outcome, runner: Runner) -> None:
        """Record how the last rung's job ended (the watcher's ``outcome``) and push."""
        if not self.steps:
            return
        why = (outcome.failure.why if outcome.failure else None) or (
            f"guard {outcome.guard} tripped" if outcome.guard else None
        )
        self.steps = ended(self.steps, outcome.end.value, str(redact(why)) if why else None)
        self._priced(runner)
        self.push(context)

    def totals(self) -> dict[str, Any] | None:
        """The usage of every rung's job summed (``ladder.summed``); None before any move."""
        if len(self.steps) < 2:
            return None
        usages = [_usage(TorchXHook(s.conn_id).get_runner(), s.app_handle) for s in self.steps]
        return summed([u.to_dict() if u is not None else None for u in usages])

    def _priced(self, runner: Runner) -> None:
        """The last step with its end time and what its job cost, where priced."""
        usage = _usage(runner, self.steps[-1].app_handle)
        cost = usage.cost_usd if usage is not None else None
        self.steps[-1] = dataclasses.replace(self.steps[-1], ended_at=time.time(), cost_usd=cost)

    # ------------------------------------------------------------------ the move

    def next_rung(
        self, context: Context, outcome: watched.Outcome
    ) -> tuple[TorchXHook, Runner, Guards, _TaskJob] | None:
        """Whether the job of the watcher's ``outcome`` moves (``ladder.decide``); if so, move
        it (``move``) and return the next rung's hook, runner, guards and job."""
        runner = self.op._runner
        assert runner is not None
        handle = outcome.app_handle
        failed = outcome.end is End.FAILED
        kind: FailureKind | None = None
        failures = 0
        if failed or outcome.trip is not None:
            desc = runner.describe_app(handle) if failed else None
            kind = outcome.reported_failure(desc).kind
            if failed and kind in PLACE_KINDS and self.rung.max_infra_failures is not None:
                failures = self.failures_on_rung(runner, handle, kind, desc, context)
        move = decide(self.rungs, self.index, Outcome.of_watch(outcome, kind, failures))
        if move is None:
            return None
        return self.move(context, move, runner, handle)

    def failures_on_rung(
        self,
        runner: Runner,
        handle: str,
        kind: FailureKind,
        desc: DescribeAppResponse | None,
        context: Context,
    ) -> int:
        """The rung's ``infra``/``capacity`` failures for this task instance: the ended job
        ``handle`` (of ``kind``) and its earlier jobs there (listed by identity and rung)."""
        from airflow_provider_torchx.watch import task_identity

        count = infra_failures(kind, _attempt_reasons(desc))
        labels = task_identity(context).labels() | self.labels()
        cfg = self.op.hook().resolve_cfg(self.op.cfg)
        for app in runner.list(self.rung.scheduler, cfg, labels):
            if app.app_handle == handle:
                continue
            earlier = runner.describe_app(app.app_handle)
            if earlier is None or earlier.state != AppState.FAILED:
                continue
            failure = classify(earlier)
            count += infra_failures(failure.kind if failure else None, _attempt_reasons(earlier))
        return count

    def move(
        self, context: Context, move: Move, runner: Runner, handle: str
    ) -> tuple[TorchXHook, Runner, Guards, _TaskJob]:
        """Cancel the rung's job ``handle`` (by the task, ``moved to RUNG: why``), log the one
        line, count ``torchx.job.moved``, record the step, and submit the same app to the next
        rung: same identity and checkpoint location, the attempt number continued."""
        op = self.op
        source, target = self.rungs[move.source], self.rungs[move.target]
        runner.cancel(handle, reason=cancel_reason(target, move), by=CancelledBy.TASK)
        op.log.info("%s", move_line(self.rungs, move, handle))
        emit_moved(
            scheduler=source.scheduler,
            dag_id=op.dag_id,
            task_id=op.task_id,
            source=source.conn_id,
            target=target.conn_id,
            why=move.why.value,
        )
        desc = runner.describe_app(handle)
        self.attempts.append(checkpointing.attempts_of(desc) if desc is not None else 1)
        self.steps[-1] = dataclasses.replace(self.steps[-1], outcome="moved", reason=move.detail)
        self._priced(runner)
        self.index = move.target
        op.torchx_conn_id = target.conn_id
        hook = op.hook()
        guards = op.guards(hook, time.time())
        next_runner = op._runner = hook.get_runner()
        job = op._submit_or_adopt(context, hook, next_runner, guards, climb=self, moving=True)
        assert not isinstance(job, dict)  # a dry run never waits, so never moves
        return hook, next_runner, guards, job

    # ------------------------------------------------------------------ across deferrals

    def to_kwargs(self, deadline: float | None, started_at: float) -> dict[str, Any]:
        """What ``execute_complete`` needs to go on (``resume``), with the task's ``deadline``
        and start (the wait's bounds) for the next deferral."""
        return {
            "ladder": {
                "rung": self.index,
                "steps": [s.to_dict() for s in self.steps],
                "attempts": list(self.attempts),
                "deadline": deadline,
                "started_at": started_at,
            }
        }

    @classmethod
    def resume(cls, op: TorchXRunOperator, saved: Mapping[str, Any]) -> Climb:
        """The climb ``to_kwargs`` saved, its rungs read again from their connections."""
        index = int(saved["rung"])
        climb = cls(
            op,
            read_rungs(op),
            index,
            [Step.from_dict(s) for s in saved.get("steps") or []],
            [int(n) for n in saved.get("attempts") or []],
        )
        op.torchx_conn_id = climb.rung.conn_id
        return climb
