"""A retry's look at its task instance's earlier jobs (docs/architecture.md, "Identity"): which
jobs carry its identity on the scheduler, which one it adopts instead of submitting, and how
many attempts they made. ``TorchXRunOperator`` asks once per retry (``find_earlier``) and hands
what was found on: the job to adopt, or the attempts a new job's ``TORCHX_ATTEMPT`` continues
past (``checkpointing.prepare``), so a retry lists and describes its jobs once.

The records a retry reads: the scheduler's listing by the identity labels (which jobs;
confirmed with ``describe``), the task state store (Airflow >= 3.3: the job the last try
submitted or adopted and whether it reported it, the same on every host; ``remember_job``)
and the job's cursor file (``core/cursors.py``). A job whose record the scheduler refuses is
stopped, and the retry fails without retry: no job is submitted beside it or after it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow.exceptions import AirflowException

from airflow_provider_torchx._compat import AirflowFailException
from airflow_provider_torchx.checkpointing import attempts_of
from airflow_provider_torchx.core.errors import RecordRefusedError
from airflow_provider_torchx.core.schedulers.api import CancelledBy, labels_match
from airflow_provider_torchx.core.specs import AppState
from airflow_provider_torchx.masking import redact

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_torchx.core.cursors import LogPosition
    from airflow_provider_torchx.core.identity import TaskIdentity
    from airflow_provider_torchx.core.runner import Runner
    from airflow_provider_torchx.core.schedulers.api import DescribeAppResponse

log = logging.getLogger(__name__)
#: Job states a retried task adopts instead of submitting again.
_ADOPTABLE = (AppState.SUBMITTED, AppState.PENDING, AppState.RUNNING)
#: The task state store key (Airflow >= 3.3) holding ``{"app_handle": ..., "reported": bool}``.
STATE_STORE_KEY = "torchx_job"


@dataclass(frozen=True)
class JobRecord:
    """One job carrying a task instance's identity, as a retry sees it: its state, whether a
    cancel was requested, and ``reported``: whether a try reported its success (None: no
    record of any try watching it; only read for SUCCEEDED jobs).

    The precedence rule (``read``): the job the task state store names comes first; a job
    counts as reported when either record (the store's, the cursor file's) says so, as
    unreported when some record exists and none says so, as unknown when neither exists
    (such a job is never adopted)."""

    app_handle: str
    state: AppState
    cancel_requested: bool = False
    reported: bool | None = None

    @classmethod
    def read(
        cls,
        app_handle: str,
        desc: DescribeAppResponse,
        stored: Mapping[str, Any] | None,
        saved: LogPosition | None,
    ) -> JobRecord:
        """The record of ``app_handle`` from its description, the task state store's entry
        (``stored``) and its cursor file's position (``saved``), by the precedence rule."""
        reported = None
        if desc.state == AppState.SUCCEEDED:
            marks = [saved.reported] if saved is not None else []
            if stored is not None and stored.get("app_handle") == app_handle:
                marks.append(bool(stored.get("reported")))
            reported = any(marks) if marks else None
        return cls(app_handle, desc.state, desc.cancel_requested, reported)

    def why_not(self) -> str:
        """Why this job is not adopted (when another one is, or none)."""
        if self.cancel_requested:
            return f"{self.state.name}, a cancel was requested"
        if self.state == AppState.SUCCEEDED:
            return (
                "SUCCEEDED, reported by an earlier try" if self.reported else "SUCCEEDED, no try recorded watching it"
            )
        if self.state in _ADOPTABLE:
            return f"{self.state.name}, another job was chosen"
        return f"ended {self.state.name}"


def choose_job_to_adopt(records: Sequence[JobRecord]) -> JobRecord | None:
    """Which job a retried task adopts: the live (SUBMITTED/PENDING/RUNNING) one; else the
    latest SUCCEEDED one that a try watched but none reported (the worker died first); never
    one with a cancel request. None: submit a new job (none, or only FAILED/CANCELLED/reported
    ones). More than one live job is an error: the task cannot tell which one is its own."""
    live = [c for c in records if c.state in _ADOPTABLE and not c.cancel_requested]
    if len(live) > 1:
        raise AirflowException(
            f"reattach_on_retry: {len(live)} live jobs carry this task instance's identity "
            f"({', '.join(c.app_handle for c in live)}); expected at most one. Cancel the extra ones "
            "(airflow-torchx cancel HANDLE) or set reattach_on_retry=False"
        )
    if live:
        return live[0]
    unreported = [
        c for c in records if c.state == AppState.SUCCEEDED and not c.cancel_requested and c.reported is False
    ]
    return unreported[-1] if unreported else None


@dataclass(frozen=True)
class Earlier:
    """What a retry found of its task instance's earlier jobs on one scheduler: each job's
    ``records``, the ``attempts`` each job the listing named made (its restarts + 1: what a
    new job's ``TORCHX_ATTEMPT`` continues past) and the job to adopt (``chosen``; None:
    submit a new one)."""

    records: tuple[JobRecord, ...]
    attempts: tuple[int, ...]
    chosen: JobRecord | None


def find_earlier(
    runner: Runner,
    scheduler: str,
    cfg: dict[str, Any],
    identity: TaskIdentity,
    context: Context,
    task_log: logging.Logger | Any,
) -> Earlier:
    """List the task instance's jobs on ``scheduler`` once (by its identity labels, and the
    job the task state store names first), settle and describe each once, and decide which
    one to adopt (``choose_job_to_adopt``), logging why into ``task_log``. A job whose record
    the scheduler refuses is stopped, and the task fails without retry as its watcher's would
    (``watch.refused_message``); so it does on a job stopped while its record was refused
    (``stopped_while_refused``), also one only its cursor file still names
    (``CursorFile.handles_in_state_dir``): no job is submitted beside it or after it."""
    from airflow_provider_torchx.core.cursors import CursorFile
    from airflow_provider_torchx.watch import cursor_file_for, refused_message

    stored = remembered_job(context)
    labels = identity.labels()
    listed = [app.app_handle for app in runner.list(scheduler, cfg, labels)]
    named = CursorFile.handles_in_state_dir(identity, scheduler)
    handles = list(dict.fromkeys([*([stored["app_handle"]] if stored else []), *listed, *named]))
    records, attempts = [], []
    for handle in handles:
        try:
            runner.finalize(handle)  # a job whose supervisor died is stopped before it is judged
            desc = runner.describe_app(handle)
        except RecordRefusedError as e:  # still a job: stopped, and never one beside or after it
            reason = f"{handle} cannot be adopted: its record is refused"
            stopped = runner.stop_refused(handle, reason=reason, by=CancelledBy.TASK)
            raise AirflowFailException(redact(refused_message(handle, "adopted", e, stopped))) from None
        if desc is None:
            continue
        if handle in listed:
            attempts.append(attempts_of(desc))
        if not labels_match(desc.labels, labels):
            continue
        if desc.stopped_while_refused is not None:  # its end says an earlier look stopped it unwatched
            raise AirflowFailException(redact(refused_message(handle, "adopted", desc.stopped_while_refused, True)))
        saved = cursor_file_for(runner, handle, identity).load() if desc.state == AppState.SUCCEEDED else None
        records.append(JobRecord.read(handle, desc, stored, saved))
    chosen = choose_job_to_adopt(records)
    for c in records:
        if c is not chosen:
            task_log.info("Retry: not adopting %s (%s)", c.app_handle, c.why_not())
    if chosen is not None:
        task_log.info(
            "Retry: reattaching to %s (%s), submitted by an earlier try of this task instance, instead of "
            "submitting a new job; its log continues where the earlier try's stopped",
            chosen.app_handle,
            chosen.state.name,
        )
    return Earlier(tuple(records), tuple(attempts), chosen)


def remembered_job(context: Context) -> dict[str, Any] | None:
    """The job recorded in the task state store (Airflow >= 3.3), if any; failures are logged."""
    store = context.get("task_state_store")
    if store is None:
        return None
    try:
        value = store.get(STATE_STORE_KEY)
    except Exception as e:
        log.warning("could not read %r from the task state store: %s", STATE_STORE_KEY, e)
        return None
    return value if isinstance(value, dict) and isinstance(value.get("app_handle"), str) else None


def remember_job(context: Context, app_handle: str, *, reported: bool) -> None:
    """Record the job in the task state store (Airflow >= 3.3), so a retry finds it first."""
    store = context.get("task_state_store")
    if store is None:
        return
    try:
        store.set(STATE_STORE_KEY, {"app_handle": app_handle, "reported": reported})
    except Exception as e:
        log.warning("could not record %s in the task state store: %s", app_handle, e)
