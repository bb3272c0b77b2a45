"""The failure a task raises for a TorchX job, by kind, and a retry policy that spends retries
only where they can help.

``TorchXJobFailed`` (an ``AirflowException``) carries the job's ``kind``
(``FailureKind``, decided by ``core/failures.py``'s ``classify``), its ``app_handle`` and its
``root_cause`` (torchrun's, formatted; None when it reported none). One subclass per kind, so
Airflow's own ``ExceptionRetryPolicy(RetryRule(exception=...))`` can match by class:

- ``TorchXAppFailure``: the job's own code failed (an exception in a rank, a non-zero exit);
- ``TorchXInfraFailure``: the platform lost it (host, OOM killer, collective errors);
- ``TorchXCapacityFailure``: it got no resources (``CAPACITY:``, ``start_timeout``);
- ``TorchXConfigFailure``: it could not start (image, command, misconfiguration);
- ``TorchXCancelled``: cancelled from outside the task; never retried (also an
  ``AirflowFailException``, as before: Airflow consults no retry policy for it);
- ``TorchXGuardrailTripped``: a guard (``max_gpu_hours``, ...) stopped it; never retried, as
  ``TorchXCancelled``;
- ``TorchXTimedOut``: the task's own wait ran out, or the job's ``attempt_timeout``.

Two cases keep today's "no retry" while their kind is one a policy may retry; they are
subclasses of their kind's class that are also ``AirflowFailException``:
``TorchXStartTimedOut`` (a ``start_timeout`` trip of a task without a ``retry_policy``: with
one, the task raises ``TorchXCapacityFailure`` and the policy decides) and
``TorchXConfigRefused`` (a configuration refused before anything was submitted). With
``retry_after_outside_cancel=True`` an outside cancel raises ``TorchXJobFailed`` itself (kind
``cancelled``), which Airflow retries.

``torchx_retry_policy`` (Airflow >= 3.3, AIP-105) decides by ``kind``; see its docstring and
docs/behaviour.md ("Failure kinds").
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.exceptions import AirflowException

from airflow_provider_torchx._compat import AirflowFailException
from airflow_provider_torchx.core.failures import Failure, FailureKind

if TYPE_CHECKING:
    from airflow.sdk.definitions.retry_policy import RetryDecision, RetryPolicy, RetryRule

    from airflow_provider_torchx.outcome import Outcome

__all__ = [
    "FailureKind",
    "TorchXAppFailure",
    "TorchXCancelled",
    "TorchXCapacityFailure",
    "TorchXConfigFailure",
    "TorchXConfigRefused",
    "TorchXGuardrailTripped",
    "TorchXInfraFailure",
    "TorchXJobFailed",
    "TorchXStartTimedOut",
    "TorchXTimedOut",
    "failure_class",
    "failure_error",
    "torchx_retry_policy",
]


class TorchXJobFailed(AirflowException):
    """A TorchX job did not succeed: ``kind`` (``FailureKind``), ``app_handle`` (None when
    nothing was submitted), ``root_cause`` (torchrun's, formatted, or None) and ``why`` (what
    decided the kind, in a few words: ``ValueError on trainer/0``)."""

    def __init__(
        self,
        message: str,
        *,
        kind: FailureKind,
        app_handle: str | None = None,
        root_cause: str | None = None,
        why: str = "",
    ) -> None:
        super().__init__(message)
        self.kind = FailureKind(kind)
        self.app_handle = app_handle
        self.root_cause = root_cause
        self.why = why

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild, (type(self), str(self), self.kind.value, self.app_handle, self.root_cause, self.why)

    @property
    def failure(self) -> Failure:
        """The kind and what decided it."""
        return Failure(self.kind, self.why or "no detail")


def _rebuild(
    cls: type[TorchXJobFailed], message: str, kind: str, app_handle: str | None, root_cause: str | None, why: str
) -> TorchXJobFailed:
    """A ``TorchXJobFailed`` unpickled (its keyword arguments are not in ``args``)."""
    return cls(message, kind=FailureKind(kind), app_handle=app_handle, root_cause=root_cause, why=why)


class TorchXAppFailure(TorchXJobFailed):
    """The job's own code failed: an exception in a rank, a non-zero exit, a signal it raised."""


class TorchXInfraFailure(TorchXJobFailed):
    """The platform lost the job: a host terminated or reclaimed, the OOM killer, a signal
    from outside, a collective or rendezvous error."""


class TorchXCapacityFailure(TorchXJobFailed):
    """The job got no resources: a ``CAPACITY:`` reason, a ``start_timeout`` on its wait."""


class TorchXConfigFailure(TorchXJobFailed):
    """The job could not start: an image that cannot be pulled, a command that cannot run, a
    misconfiguration."""


class TorchXCancelled(TorchXJobFailed, AirflowFailException):
    """The job was cancelled from outside its task; the task fails without retry."""


class TorchXGuardrailTripped(TorchXJobFailed, AirflowFailException):
    """A guard stopped the job; the task fails without retry."""


class TorchXTimedOut(TorchXJobFailed):
    """The task's wait ran out (its job was cancelled), or the job's ``attempt_timeout``."""


class TorchXStartTimedOut(TorchXCapacityFailure, AirflowFailException):
    """``start_timeout`` tripped on a task without a retry policy: no retry, as before."""


class TorchXConfigRefused(TorchXConfigFailure, AirflowFailException):
    """A configuration refused before anything was submitted: no retry can fix it."""


log = logging.getLogger(__name__)

_CLASSES: dict[FailureKind, type[TorchXJobFailed]] = {
    FailureKind.APP: TorchXAppFailure,
    FailureKind.INFRA: TorchXInfraFailure,
    FailureKind.CAPACITY: TorchXCapacityFailure,
    FailureKind.CONFIG: TorchXConfigFailure,
    FailureKind.CANCELLED: TorchXCancelled,
    FailureKind.GUARDRAIL: TorchXGuardrailTripped,
    FailureKind.TIMEOUT: TorchXTimedOut,
}


#: The never-retried twins of the kinds a policy may retry (see the module's docstring).
_FINAL: dict[FailureKind, type[TorchXJobFailed]] = {
    FailureKind.CAPACITY: TorchXStartTimedOut,
    FailureKind.CONFIG: TorchXConfigRefused,
}


def failure_class(kind: FailureKind | str) -> type[TorchXJobFailed]:
    """The class a task raises for a failure of ``kind``."""
    return _CLASSES[FailureKind(kind)]


def failure_error(
    message: str,
    failure: Failure,
    *,
    no_retry: bool,
    app_handle: str | None = None,
    root_cause: str | None = None,
) -> TorchXJobFailed:
    """The exception a task raises for ``failure``: its kind's class, an
    ``AirflowFailException`` exactly when ``no_retry`` (the task fails without retry, as it
    always did for it: an outside cancel, a guard, a configuration refused, a ``start_timeout``
    without a retry policy); otherwise a class Airflow retries (``TorchXJobFailed`` itself for
    a ``cancelled`` or ``guardrail`` kind that is retried: the task's own cancel,
    ``retry_after_outside_cancel=True``)."""
    cls = failure_class(failure.kind)
    final = issubclass(cls, AirflowFailException)
    if no_retry and not final:
        cls = _FINAL.get(failure.kind, cls)
    elif final and not no_retry:
        cls = TorchXJobFailed
    return cls(message, kind=failure.kind, app_handle=app_handle, root_cause=root_cause, why=failure.why)


def failure_block(failure: Failure, outcome: Outcome) -> str:
    """The closing block of a failed task's own log lines: the failure's kind, then, where the
    watcher's outcome names who failed (``failing``: ``watch.failing_of``), the failing rank
    (or replica), its signal or exit code, its error and its own last lines, in that order: the
    one story of the failure, where a reader of the task log looks last (the exception's
    message tells it too, above Airflow's traceback). Without ``failing`` (a guard, the task's
    own timeout, a cancel, an outcome from an earlier version) only the kind's line."""
    lines = [f"Failure kind: {failure.kind.value} ({failure.why})"]
    failing = outcome.failing
    if failing is None:
        return lines[0]
    replica, rank = failing.replica, failing.rank
    lines.append(
        f"  failing: rank {rank} of replica {replica}" if rank is not None else f"  failing: replica {replica}"
    )
    lines.append(f"  {exit_words(failing.exit_code)}")
    if failing.error:
        lines.append(f"  error: {failing.error}")
    if outcome.tail:
        whose = outcome.tail_of or f"replica {replica}'s log"
        lines.append(f"  last {len(outcome.tail)} lines of {whose}:")
        lines += [f"    {line}" for line in outcome.tail]
    return "\n".join(lines)


def exit_words(code: int | None) -> str:
    """A process's end in words: ``signal SIGABRT (exit code -6)``, ``exit code 1``, or
    ``exit code unknown``."""
    if code is None:
        return "exit code unknown"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name} (exit code {code})"
        except ValueError:  # not a signal this platform names
            return f"signal {-code} (exit code {code})"
    return f"exit code {code}"


#: The kinds ``torchx_retry_policy`` retries (within the task's ``retries``) and fails at once.
RETRIED = frozenset({FailureKind.INFRA, FailureKind.CAPACITY})
NOT_RETRIED = frozenset({FailureKind.APP, FailureKind.CONFIG})


def decide(failure: Failure, capacity_delay: timedelta | None = None) -> tuple[str, timedelta | None, str]:
    """The policy's rule for one failure, as ``(action, delay, reason)``: ``retry`` (``infra``,
    ``capacity``: the latter after ``capacity_delay`` when given), ``fail`` (``app``,
    ``config``) or ``default`` (the other kinds: Airflow's own retries decide, as without a
    policy). ``reason`` is the task log's line: ``not retried: app failure — ValueError on
    trainer/0``."""
    if failure.kind in RETRIED:
        delay = capacity_delay if failure.kind == FailureKind.CAPACITY else None
        return "retry", delay, f"retried: {failure.text()}"
    if failure.kind in NOT_RETRIED:
        return "fail", None, f"not retried: {failure.text()}"
    return "default", None, f"{failure.text()}: the task's retries decide"


def torchx_retry_policy(
    *,
    capacity_delay: timedelta | None = None,
    rules: Sequence[RetryRule] = (),
    fallback: RetryPolicy | None = None,
) -> RetryPolicy:
    """An Airflow retry policy (``retry_policy=`` of any task; Airflow >= 3.3) for TorchX
    jobs: a ``TorchXJobFailed`` of kind ``infra`` or ``capacity`` is retried within the
    task's ``retries`` (``capacity`` after ``capacity_delay``, when given, instead of the
    task's ``retry_delay``), ``app`` and ``config`` fail at once; the other kinds, and other
    exceptions, are left to Airflow's retries as without a policy. Each decision is written to
    the task log (``not retried: app failure — ValueError on trainer/0``).

    It composes with a user's own rules: ``rules`` (Airflow's ``RetryRule``) are tried first,
    in order, the first that matches decides; ``fallback`` (any ``RetryPolicy``) decides what
    this policy leaves to Airflow. ``TorchXCancelled`` and ``TorchXGuardrailTripped`` are
    ``AirflowFailException``: Airflow fails them without asking any policy.

    Raises ``RuntimeError`` naming the installed version on Airflow < 3.3 (no retry policies)."""
    try:
        from airflow.sdk.definitions.retry_policy import ExceptionRetryPolicy, RetryAction, RetryDecision, RetryPolicy
    except ImportError:
        from airflow import __version__

        raise RuntimeError(
            f"torchx_retry_policy needs Airflow >= 3.3 (retry policies, AIP-105); this is Airflow {__version__}. "
            "Match the failure classes of airflow_provider_torchx.failures in on_failure_callback instead, "
            "or upgrade Airflow."
        ) from None

    own_rules = ExceptionRetryPolicy(rules=list(rules)) if rules else None

    class TorchXRetryPolicy(RetryPolicy):
        """``torchx_retry_policy``'s policy (see there)."""

        def evaluate(
            self, exception: BaseException, try_number: int, max_tries: int, context: Any = None
        ) -> RetryDecision:
            if own_rules is not None:
                decision = own_rules.evaluate(exception, try_number, max_tries, context)
                if decision.action != RetryAction.DEFAULT:
                    return decision
            if isinstance(exception, TorchXJobFailed):
                action, delay, reason = decide(exception.failure, capacity_delay)
                # Airflow logs its decision with the reason as a field, which a task log's
                # reader may not show: the line says it in words.
                log.info("TorchX retry policy: %s", reason)
                if action != "default" or fallback is None:
                    return RetryDecision(action=RetryAction(action), retry_delay=delay, reason=reason)
            if fallback is not None:
                return fallback.evaluate(exception, try_number, max_tries, context)
            return RetryDecision.default()

    return TorchXRetryPolicy()
