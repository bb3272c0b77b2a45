"""Exceptions of the scheduler core.

Every error caused by bad input is a ``ValueError`` subclass whose message names the field, the
bad value and what is allowed, so callers (the CLI, the Airflow operator) can show it as is.
"""

from __future__ import annotations

#: Not ``typing`` nor ``signal``: the local supervisor imports this module (through its job
#: store) at its start-up, which must stay fast.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal

    from airflow_provider_torchx.core.specs import AppStatus


#: How much of a bad value an error message quotes.
SHOWN_CHARS = 120


def shown(value: object) -> str:
    """``value`` quoted for an error message (``repr``); a string longer than ``SHOWN_CHARS``
    as its start and its length (a megabyte of input makes no message a megabyte long)."""
    if not isinstance(value, str) or len(value) <= SHOWN_CHARS:
        return repr(value)
    return f"{value[:SHOWN_CHARS]!r}... ({len(value)} characters)"


class InvalidSpecError(ValueError):
    """An ``AppDef``, ``Role``, ``Resource`` or mount is not valid."""


class InvalidRunConfigError(ValueError):
    """A scheduler run config (cfg) has an unknown key, a value of the wrong type or misses a
    required option."""


class JobWontFitError(InvalidRunConfigError):
    """The job queue cannot run the job: the queue is not ENABLED/VALID, or none of its compute
    environments can (each one named, with the limit the job passes). Raised before anything
    is registered or submitted."""


class MalformedAppHandleError(ValueError):
    """A string is not an app handle of the form ``scheduler://session/app_id``."""


class UnknownSchedulerError(ValueError):
    """No scheduler backend is registered under the given name."""


class UnknownAppError(ValueError):
    """A well-formed handle names an app the scheduler does not know."""


class RecordRefusedError(ValueError):
    """The scheduler refuses to read a job's record (one of its files, or its directory,
    swapped for a symbolic link, or not what its writer wrote): the job cannot be described,
    yet it is still a job and may still run. ``Scheduler.cancel`` stops it all the same (the
    error it raises then says ``delivered``), and the listings carry it while it may run
    (``ListAppResponse.refused``). The message names the job and the refused file."""

    #: Whether the cancel that raised this reached the job all the same (it stops).
    delivered: bool = False


class ComponentError(ValueError):
    """A component cannot be found or its arguments do not fit its signature."""


class SchedulerSetupError(RuntimeError):
    """The scheduler cannot be used as this host is set up: no region or credentials, expired
    or rejected credentials, a missing permission or queue, an unreachable endpoint. The
    message is one line saying what to set (the CLI exits 3). ``transient``: a retry may
    succeed with nothing changed here (an endpoint that could not be reached, credentials
    that a refresh renews), so a task retries; otherwise it fails without retry."""

    transient: bool = False

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class UnknownQueueError(InvalidRunConfigError, SchedulerSetupError):
    """A scheduler's queue (``cfg`` or the app id's) does not exist."""


class AppStatusError(Exception):
    """Raised by ``AppStatus.raise_for_status()`` for an app that did not succeed."""

    def __init__(self, status: AppStatus, *args: object) -> None:
        super().__init__(status.format() if not args else args[0])
        self.status = status


class SignalException(Exception):  # noqa: N818 - TorchX's public name
    """Raised inside ``Runner.wait`` when the process gets SIGTERM or SIGINT, so the waiter
    can cancel the job it watches before it exits."""

    def __init__(self, msg: str, sigval: signal.Signals) -> None:
        super().__init__(msg)
        self.sigval = sigval
