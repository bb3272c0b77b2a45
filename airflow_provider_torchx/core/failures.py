"""What kind of failure ended a job: the one pure rule (``classify``) from what the scheduler
reports to a ``FailureKind``, so that retries are spent only where they can help.

The kinds: ``app`` (the job's own code: a non-zero exit, an exception in a rank, a signal the
process raised itself such as SIGABRT or SIGSEGV), ``infra`` (the platform lost it: a host
reclaimed or terminated, a replica killed by a signal the job did not send such as the OOM
killer's SIGKILL, a collective or rendezvous error in torchrun's root cause, an end with no
exit code and no reason this table knows), ``capacity`` (it could not get resources: a
``CAPACITY:`` reason, a ``start_timeout`` on a resource wait), ``config`` (it could not start:
an image that cannot be pulled, a misconfiguration, a command that cannot run), ``cancelled``
(from outside the task), ``guardrail`` (a guard other than ``start_timeout`` stopped it) and
``timeout`` (the task's own wait, or the job's ``attempt_timeout``).

``classify`` reads fields of ``DescribeAppResponse`` and its replicas' statuses only (state,
reasons, exit codes, who cancelled), the root cause torchrun reported (``core/errorfile.py``)
and what the watcher saw (a guard that tripped, the task's deadline): never a scheduler's
name, so a plugin scheduler gets the same kinds. Its rows, in the order they are tried, are
the decision table of docs/behaviour.md ("Failure kinds"); each row is a test in
``tests/core/test_failures.py``. The reasons it knows are the platforms' own words (AWS
Batch's ``statusReason`` and ``container.reason``, Kubernetes' pod reasons, Slurm's job
states, the local supervisor's messages); a reason it does not know decides nothing, and the exit codes decide.
"""

from __future__ import annotations

import enum
import re
import signal
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_provider_torchx.core.guards import START_TIMEOUT
from airflow_provider_torchx.core.specs import AppState, ReplicaStatus

if TYPE_CHECKING:
    from airflow_provider_torchx.core.errorfile import RootCause
    from airflow_provider_torchx.core.schedulers.api import DescribeAppResponse


class FailureKind(str, enum.Enum):
    """Why a job failed, as far as a retry is concerned."""

    APP = "app"
    INFRA = "infra"
    CAPACITY = "capacity"
    CONFIG = "config"
    CANCELLED = "cancelled"
    GUARDRAIL = "guardrail"
    TIMEOUT = "timeout"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Failure:
    """A failure's ``kind`` and, in a few words, what decided it (``why``: ``ValueError on
    trainer/0``, ``SIGKILL on trainer/1``, ``CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY``)."""

    kind: FailureKind
    why: str

    def text(self) -> str:
        """``app failure — ValueError on trainer/0``."""
        return f"{self.kind.value} failure — {self.why}"


#: The platforms' reasons for a job that could not start: an image that cannot be pulled or
#: run, a container that cannot be created, secrets or a role it cannot get (AWS Batch/ECS),
#: a compute environment that cannot ever run it (Batch ``MISCONFIGURATION:``), Kubernetes'
#: pod reasons for the same (EKS).
CONFIG_REASONS = re.compile(
    r"CannotPullContainerError|CannotStartContainerError|CannotCreateContainerError|CannotInspectContainerError"
    r"|ResourceInitializationError|MISCONFIGURATION:|ErrImagePull|ImagePullBackOff|InvalidImageName"
    r"|CreateContainerConfigError|CreateContainerError"
)
#: The reasons of a job that could not get resources (Batch ``CAPACITY:``, Kubernetes).
CAPACITY_REASONS = re.compile(r"CAPACITY:|Unschedulable|Insufficient (?:cpu|memory|nvidia)", re.IGNORECASE)
#: The reasons of an attempt that ran out of its own time limit (Batch's job timeout, the local
#: supervisor's ``attempt_timeout``, Slurm's time limit or deadline).
TIMEOUT_REASONS = re.compile(
    r"attempt duration exceeded timeout|longer than attempt_timeout|Slurm: (?:TIMEOUT|DEADLINE)\b"
)
#: The reasons of a job the platform lost: a host terminated or reclaimed (Spot), the OOM
#: killer, a task ECS could not keep, a pod evicted or its node lost, a Slurm node failed or
#: the job preempted or out of memory, a local job's supervisor gone.
INFRA_REASONS = re.compile(
    r"Host EC2|OutOfMemoryError|OOMKilled|Timeout waiting for network interface|Task failed to start"
    r"|Evicted|NodeLost|Spot|reclaim|the supervisor \(pid \d+\) died|the supervisor did not start"
    r"|the supervisor failed|Slurm: (?:NODE_FAIL|BOOT_FAIL|PREEMPTED|OUT_OF_MEMORY)\b",
)
#: A root cause that is the collective's or the rendezvous' (a peer or the network, not the
#: rank's code): NCCL/gloo errors and timeouts, torch.distributed's store and network errors,
#: torchrun's rendezvous, a peer gone, torchrun itself signalled.
INFRA_ERRORS = re.compile(
    r"nccl|gloo|DistNetworkError|DistBackendError|DistStoreError|Rendezvous|collective operation timeout"
    r"|Watchdog caught|Connection (?:closed|reset) by peer|SignalException",
    re.IGNORECASE,
)
#: Signals a process does not send itself: the OOM killer's, a stop or a hang-up from outside.
OUTSIDE_SIGNALS = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGHUP, signal.SIGINT})
#: Exit codes of a command that could not run: found but not executable, not found (shells,
#: container runtimes).
CANNOT_RUN = frozenset({126, 127})


def signal_of(exit_code: int | None) -> signal.Signals | None:
    """The signal that ended a process, from its exit code: ``-N`` (a process' own wait
    status, as the local schedulers report it) or ``128 + N`` (a container's, as a shell and
    Docker report it); None for an ordinary exit."""
    if exit_code is None:
        return None
    number = -exit_code if exit_code < 0 else exit_code - 128 if 128 < exit_code <= 128 + 64 else 0
    try:
        return signal.Signals(number) if number else None
    except ValueError:
        return None


def _reasons(desc: DescribeAppResponse) -> list[tuple[str, str]]:
    """``(reason, where)`` of the job's final attempt: each failed replica's message, then the
    job's own message up to its first ``; `` (what follows names earlier attempts, whose
    reasons are not the end's)."""
    found = [(rep.msg, _where(rep)) for rep in _failed(desc) if rep.msg]
    head = desc.msg.split("; ")[0] if desc.msg else ""
    if head:
        found.append((head, ""))
    return found


def _failed(desc: DescribeAppResponse) -> Iterable[ReplicaStatus]:
    return (rep for role in desc.roles_statuses for rep in role.replicas if rep.state == AppState.FAILED)


def _where(rep: ReplicaStatus) -> str:
    return f"{rep.role}/{rep.id}"


def _on(what: str, where: str) -> str:
    return f"{what} on {where}" if where else what


def _short(reason: str) -> str:
    line = reason.splitlines()[0] if reason else reason
    return line if len(line) <= 120 else line[:117] + "..."


def _by_signal(sig: signal.Signals, where: str) -> Failure:
    kind = FailureKind.INFRA if sig in OUTSIDE_SIGNALS else FailureKind.APP
    return Failure(kind, _on(sig.name, where))


def classify(
    desc: DescribeAppResponse,
    root_cause: RootCause | None = None,
    *,
    guard: str | None = None,
    timed_out: bool = False,
) -> Failure | None:
    """The kind of the failure that ended the job ``desc`` (None: it did not fail: it
    succeeded or has not ended, and no guard or deadline stopped it). ``root_cause``: the
    failed rank torchrun reported; ``guard``: the guard that stopped the job; ``timed_out``:
    the task's own wait ran out. The rows, first match wins (docs/behaviour.md):

    1. a guard tripped: ``start_timeout`` is ``capacity``, any other ``guardrail``;
    2. the task's own wait ran out: ``timeout``;
    3. the job was cancelled (CANCELLED, or FAILED with a cancel the scheduler has evidence
       of: ``cancel_reason``): ``cancelled``;
    4. a reason of the final attempt: ``config``, ``capacity``, ``timeout``, then ``infra``
       reasons (``CONFIG_REASONS`` ...);
    5. the root cause is the collective's or the rendezvous' (``INFRA_ERRORS``): ``infra``;
    6. the root cause's exit code, then a failed replica's, is a signal: one the process does
       not send itself (``OUTSIDE_SIGNALS``) is ``infra``, any other ``app``;
    7. a failed replica's command could not run (exit 126, 127): ``config``;
    8. a failed replica's non-zero exit code, or a root cause: ``app``;
    9. anything else that failed (no exit code, no reason known): ``infra``.
    """
    if guard is not None:
        kind = FailureKind.CAPACITY if guard == START_TIMEOUT else FailureKind.GUARDRAIL
        return Failure(kind, f"guard {guard} tripped")
    if timed_out:
        return Failure(FailureKind.TIMEOUT, "the task's wait ran out")
    if desc.state == AppState.CANCELLED or (desc.state == AppState.FAILED and desc.cancel_reason is not None):
        who = desc.cancelled_by.value if desc.cancelled_by is not None else None
        return Failure(FailureKind.CANCELLED, f"cancelled by {who}" if who else "cancelled")
    if desc.state != AppState.FAILED:
        return None
    reasons = _reasons(desc)
    for pattern, kind in (
        (CONFIG_REASONS, FailureKind.CONFIG),
        (CAPACITY_REASONS, FailureKind.CAPACITY),
        (TIMEOUT_REASONS, FailureKind.TIMEOUT),
        (INFRA_REASONS, FailureKind.INFRA),
    ):
        for reason, where in reasons:
            if pattern.search(reason):
                return Failure(kind, _on(_short(reason), where))
    if root_cause is not None and INFRA_ERRORS.search(root_cause.error):
        return Failure(FailureKind.INFRA, _on(_short(root_cause.error), root_cause.replica))
    root_signal = signal_of(root_cause.exit_code) if root_cause is not None else None
    if root_cause is not None and root_signal is not None:
        return _by_signal(root_signal, root_cause.replica)
    failed = list(_failed(desc))
    for rep in failed:
        sig = signal_of(rep.exit_code)
        if sig is not None:
            return _by_signal(sig, _where(rep))
    for rep in failed:
        if rep.exit_code in CANNOT_RUN:
            return Failure(FailureKind.CONFIG, _on(f"exit code {rep.exit_code} (cannot run)", _where(rep)))
    if root_cause is not None:
        return Failure(FailureKind.APP, _on(root_cause.error.partition(":")[0], root_cause.replica))
    for rep in failed:
        if rep.exit_code:
            return Failure(FailureKind.APP, _on(f"exit code {rep.exit_code}", _where(rep)))
    return Failure(FailureKind.INFRA, _short(desc.msg) or "no exit code and no known reason")
