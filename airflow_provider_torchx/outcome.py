"""How a task's watch of its job ended: one typed value, ``Outcome``, that every watcher
builds (``watch.py``'s ``TaskWatcher`` in the worker, the sensor and the trigger; the trigger's
own errors) and the operator and the sensor act on (docs/architecture.md, "The watching
path": "One event").

A deferred task's outcome crosses the triggerer as a ``TriggerEvent``'s JSON payload:
``to_event`` writes it and ``Outcome.from_event`` reads it back, refusing a malformed one with
one error naming the field. The payload's keys are a wire format: a task deferred before an
upgrade resumes after it with the payload its trigger wrote, so they never change. Pure (no
Airflow import): the ladder's rules (``ladder.py``) read it too.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow_provider_torchx.core.cursors import LogPosition
from airflow_provider_torchx.core.failures import Failure, FailureKind, classify
from airflow_provider_torchx.core.guards import Trip
from airflow_provider_torchx.core.schedulers.api import DescribeAppResponse
from airflow_provider_torchx.core.specs import AppState


class End(str, enum.Enum):
    """How the watch ended (the payload's ``status``)."""

    SUCCESS = "success"
    FAILED = "failed"
    TIMEOUT = "timeout"
    GUARDRAIL = "guardrail"
    ERROR = "error"
    #: The job left PENDING, a watch that ends there (``WatchSpec.until_started``: a capacity
    #: ladder's task that does not wait for completion).
    STARTED = "started"


@dataclass(frozen=True)
class Failing:
    """Who failed (``watch.failing_of``): the failing rank (torchrun's root cause: its replica,
    rank, exit code and error), else the failed replica (``rank`` None) and its exit code."""

    replica: str
    rank: int | None = None
    exit_code: int | None = None
    error: str | None = None


@dataclass(frozen=True)
class Outcome:
    """The end of a task's watch of job ``app_handle`` (``end``) and what the task needs of it:

    - ``cursor_seq``, ``log_cursors``: the log position reached (``log_cursors`` None: not
      streaming; ``cursor_seq`` None: no position at all, a trigger that never watched);
    - ``state``: the job's state (success, failed, timeout, started; a guard trip's);
    - ``message``: what the task's error says (not on success); for ``started``, the state the
      job left PENDING for;
    - ``ui_url``, ``tail``, ``tail_of``, ``root_cause``, ``failing``, ``failure``: a
      finished job's page and, when it failed, its last lines (the failing rank's own:
      ``tail_of``), torchrun's root cause, who failed and the failure's kind
      (``core/failures.py``; None from a watcher of an earlier version);
    - ``trip``: the guard that tripped (``guardrail``);
    - ``refused``: the job's record is refused (an ``error``; the job was stopped first).
    """

    end: End
    app_handle: str
    cursor_seq: int | None = None
    log_cursors: Mapping[str, str] | None = None
    state: AppState | None = None
    message: str | None = None
    ui_url: str | None = None
    tail: tuple[str, ...] = ()
    tail_of: str | None = None
    root_cause: str | None = None
    failing: Failing | None = None
    failure: Failure | None = None
    trip: Trip | None = None
    refused: bool = False

    def __post_init__(self) -> None:
        if (self.end is End.GUARDRAIL) != (self.trip is not None):
            raise ValueError(f"Outcome: trip: {self.trip!r} is not allowed for end {self.end.value!r}")

    @property
    def position(self) -> LogPosition:
        """The log position the outcome carries (empty when none)."""
        return LogPosition(seq=self.cursor_seq or 0, cursors=dict(self.log_cursors or {}))

    @property
    def guard(self) -> str | None:
        """The guard that tripped (``guardrail``), else None."""
        return self.trip.guard if self.trip is not None else None

    def to_event(self) -> dict[str, Any]:
        """The ``TriggerEvent`` payload: JSON-serialisable, its keys those of every version."""
        event: dict[str, Any] = {"status": self.end.value, "app_handle": self.app_handle}
        if self.cursor_seq is not None:
            event["log_cursors"] = dict(self.log_cursors) if self.log_cursors is not None else None
            event["cursor_seq"] = self.cursor_seq
        state = self.state.name if self.state is not None else None
        if self.end is End.SUCCESS:
            event.update(state=state, ui_url=self.ui_url)
        elif self.end is End.FAILED:
            event.update(
                state=state,
                message=self.message,
                tail=list(self.tail),
                tail_of=self.tail_of,
                ui_url=self.ui_url,
                root_cause=self.root_cause,
                failing=dataclasses.asdict(self.failing) if self.failing is not None else None,
                failure_kind=self.failure.kind.value if self.failure is not None else None,
                failure_why=self.failure.why if self.failure is not None else None,
            )
        elif self.end is End.TIMEOUT:
            event.update(state=state, message=self.message)
        elif self.end is End.GUARDRAIL:
            assert self.trip is not None
            event.update(message=self.message, **self.trip.to_dict())
        elif self.end is End.STARTED:
            event.update(state=state, message=self.message)
        else:
            event["message"] = self.message
            if self.refused:
                event["refused"] = True
        return event

    @classmethod
    def from_event(cls, event: Mapping[str, Any]) -> Outcome:
        """The outcome a payload (``to_event``'s, of this version or an earlier one) says;
        ``ValueError`` naming the first field that is missing or of the wrong kind."""
        if not isinstance(event, Mapping):
            raise ValueError(f"a TorchX job event: {event!r} is not allowed: expected a dict")
        read = _Reader(event)
        end = read.choice("status", End)
        trip = None
        if end is End.GUARDRAIL:
            trip = Trip(
                guard=read.text("guard", required=True) or "",
                limit=read.number("limit", required=True) or 0.0,
                state=read.state(required=True) or AppState.UNKNOWN,
                for_s=read.number("for_s", required=True) or 0.0,
                reason=read.text("reason") or "",
                gpu_hours=read.number("gpu_hours"),
                cost_usd=read.number("cost_usd"),
            )
        kind = read.choice("failure_kind", FailureKind, required=False)
        return cls(
            end,
            read.text("app_handle", required=True) or "",
            cursor_seq=read.integer("cursor_seq"),
            log_cursors=read.cursors(),
            state=read.state(),
            message=read.text("message"),
            ui_url=read.text("ui_url"),
            tail=read.lines("tail"),
            tail_of=read.text("tail_of"),
            root_cause=read.text("root_cause"),
            failing=read.failing(),
            failure=Failure(kind, read.text("failure_why") or "") if kind is not None else None,
            trip=trip,
            refused=read.flag("refused"),
        )

    def reported_failure(self, desc: DescribeAppResponse | None) -> Failure:
        """The failure a non-success outcome reports: what the watcher decided (``failure``), a
        guard's or the deadline's row of ``classify``, or, for a ``failed`` outcome without a
        kind (an earlier version's watcher), ``classify`` of the job as it is now (``desc``;
        None: the scheduler no longer knows it, and the outcome's state and message are what
        is left). An ``error`` (the job vanished, or cannot be watched here) is ``infra``."""
        if desc is None:
            desc = DescribeAppResponse(state=self.state or AppState.UNKNOWN, msg=self.message or "")
        decided: Failure | None = self.failure
        if decided is None and self.end is End.GUARDRAIL:
            decided = classify(desc, guard=str(self.guard))
        elif decided is None and self.end is End.TIMEOUT:
            decided = classify(desc, timed_out=True)
        elif decided is None and self.end is End.FAILED:
            decided = classify(desc)
        return decided or Failure(FailureKind.INFRA, self.message or "the job could not be watched")

    def failure_message(self) -> str:
        """The task's error text for a non-success outcome: the root cause (when torchrun
        reported one, ``core/errorfile.py``), the reason, then the log tail (the failing
        rank's own, when the scheduler keeps its stderr: ``tail_of``)."""
        message = self.message or f"TorchX job {self.app_handle} did not succeed: {self.to_event()}"
        if self.root_cause:
            message = f"{self.root_cause}\n{message}"
        if self.tail:
            whose = f"lines of {self.tail_of}" if self.tail_of else "log lines"
            message += f"\nLast {len(self.tail)} {whose}:\n" + "\n".join(self.tail)
        return message


class _Reader:
    """Reads a payload's fields, each checked; absent (or None) optional fields are None."""

    def __init__(self, event: Mapping[str, Any]) -> None:
        self.event = event

    def _get(self, name: str, required: bool, what: str) -> Any:
        value = self.event.get(name)
        if value is None and required:
            raise ValueError(f"a TorchX job event's {name!r}: missing, expected {what} (event: {dict(self.event)!r})")
        return value

    def _bad(self, name: str, value: Any, what: str) -> ValueError:
        return ValueError(f"a TorchX job event's {name!r}: {value!r} is not allowed: expected {what}")

    def text(self, name: str, *, required: bool = False) -> str | None:
        value = self._get(name, required, "a string")
        if value is not None and not isinstance(value, str):
            raise self._bad(name, value, "a string")
        return value

    def number(self, name: str, *, required: bool = False) -> float | None:
        value = self._get(name, required, "a number")
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise self._bad(name, value, "a number")
        return None if value is None else float(value)

    def integer(self, name: str) -> int | None:
        value = self._get(name, False, "an integer")
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise self._bad(name, value, "an integer")
        return value

    def flag(self, name: str) -> bool:
        value = self._get(name, False, "true or false")
        if value is not None and not isinstance(value, bool):
            raise self._bad(name, value, "true or false")
        return bool(value)

    def choice(self, name: str, among: type[End] | type[FailureKind], *, required: bool = True) -> Any:
        allowed = ", ".join(repr(m.value) for m in among)
        value = self._get(name, required, f"one of {allowed}")
        if value is None:
            return None
        try:
            return among(value)
        except ValueError:
            raise self._bad(name, value, f"one of {allowed}") from None

    def state(self, *, required: bool = False) -> AppState | None:
        value = self._get("state", required, "a job state")
        if value is None:
            return None
        if not isinstance(value, str) or value not in AppState.__members__:
            raise self._bad("state", value, f"one of {', '.join(AppState.__members__)}")
        return AppState[value]

    def lines(self, name: str) -> tuple[str, ...]:
        value = self._get(name, False, "a list of strings")
        if value is None:
            return ()
        if not isinstance(value, list | tuple) or not all(isinstance(line, str) for line in value):
            raise self._bad(name, value, "a list of strings")
        return tuple(value)

    def cursors(self) -> dict[str, str] | None:
        value = self._get("log_cursors", False, "a dict of cursors")
        if value is not None and not (
            isinstance(value, Mapping) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
        ):
            raise self._bad("log_cursors", value, "a dict of replica names to cursor strings")
        return None if value is None else dict(value)

    def failing(self) -> Failing | None:
        value = self._get("failing", False, "a dict")
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise self._bad("failing", value, "a dict with replica, rank, exit_code and error")
        inner = _Reader(value)
        try:
            return Failing(
                replica=inner.text("replica", required=True) or "",
                rank=inner.integer("rank"),
                exit_code=inner.integer("exit_code"),
                error=inner.text("error"),
            )
        except ValueError as e:
            raise ValueError(f"a TorchX job event's 'failing': {e}") from None
