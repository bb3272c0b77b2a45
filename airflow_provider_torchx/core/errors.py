"""Exceptions of the scheduler core: the errors a caller of the scheduler contract must tell
apart (``core/schedulers/api.py`` names them in each method's guarantees).

Every error caused by bad input is a ``ValueError`` subclass whose message names the field, the
bad value and what is allowed, so callers (the CLI, the Airflow operator) can show it as is.
Standard library only, loaded without ``typing``: the local job store raises these in the
supervisor, before it starts the replicas.
"""

from __future__ import annotations

import os

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


class StoreError(OSError):
    """The scheduler's own store of jobs cannot be written (or read): full, read-only, no
    permission. The message names the store, what was being done and the cause (``errno`` is
    the cause's)."""

    def __str__(self) -> str:
        return str(self.strerror)


class CancelNotRecordedError(StoreError):
    """A cancel that could not be written to the store (full, read-only) but was delivered all
    the same: the job stops and is recorded CANCELLED as soon as the store can be written. The
    message says so."""


class CorruptEntryError(RecordRefusedError):
    """A record the scheduler keeps of a job is not valid (not JSON, truncated, not the shape
    its writer writes, or refused: swapped for a symbolic link): its record is refused.
    ``app_id`` and ``path`` name the job and the file; the job can still be cancelled or
    deleted."""

    def __init__(self, app_id: str, path: str | os.PathLike[str], why: str) -> None:
        super().__init__(f"job {app_id!r}: {os.fspath(path)} is corrupt ({why}); delete the job or fix the file")
        self.app_id, self.path = app_id, os.fspath(path)


class CancelDeliveredError(CorruptEntryError):
    """A cancel of a job one of whose records was refused (``refused``) that reached the job all
    the same (its supervisor, ``pid``, was signalled): the job stops and ends CANCELLED. The
    message names the refused file and says so."""

    delivered = True

    def __init__(self, refused: CorruptEntryError, pid: int) -> None:
        ValueError.__init__(
            self,
            f"{refused}; the cancel was delivered all the same: its supervisor (pid {pid}) was signalled "
            "and stops the job",
        )
        self.app_id, self.path = refused.app_id, refused.path


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
