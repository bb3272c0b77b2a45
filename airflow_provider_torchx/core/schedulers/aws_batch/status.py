"""From ``DescribeJobs`` entries to ``DescribeAppResponse``: states, failure reasons, replicas.

Pure functions over the shapes of the AWS API reference (``JobDetail``), so the paths moto
does not model (child jobs ``jobId#N``, per-node exit codes, several attempts, Spot reclaims)
are unit-tested on responses shaped like real AWS. A single-node job is its own only replica.
A job on EKS is read through ``eks.as_ecs_shape``: its pod's exit code and reason, its
``eksAttempts`` as attempts, its node's name as the replica's host and the pod's name in the
replica's message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_provider_torchx.core.schedulers.api import CancelledBy, DescribeAppResponse
from airflow_provider_torchx.core.schedulers.aws_batch.eks import as_ecs_shape
from airflow_provider_torchx.core.schedulers.aws_batch.render import (
    TAG_CANCEL,
    TAG_LABEL,
    is_multinode,
    node_ranges,
    role_from_container,
)
from airflow_provider_torchx.core.specs import AppState, ReplicaStatus, RoleStatus

#: Prefix of the reason this scheduler gives CancelJob/TerminateJob (how a FAILED job is
#: recognised as cancelled through us).
CANCEL_REASON = "airflow-torchx: cancel requested"
#: The value of the cancel tag (``render.TAG_CANCEL``) when the cancel did not say who asked;
#: otherwise the tag holds ``CancelledBy``'s value.
CANCEL_TAG_UNSAID = "true"

STATE_MAP: dict[str, AppState] = {
    "SUBMITTED": AppState.PENDING,
    "PENDING": AppState.PENDING,
    "RUNNABLE": AppState.PENDING,
    "STARTING": AppState.PENDING,
    "RUNNING": AppState.RUNNING,
    "SUCCEEDED": AppState.SUCCEEDED,
    "FAILED": AppState.FAILED,
}

NOT_STARTED = frozenset({"SUBMITTED", "PENDING", "RUNNABLE"})
#: The Batch statuses of a job that has ended.
ENDED = frozenset({"SUCCEEDED", "FAILED"})
#: The Batch statuses of a job that has not ended (what ``list_live`` asks ListJobs for).
LIVE_STATUSES = ("SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING")


def cancel_tag_value(by: CancelledBy | None) -> str:
    """The value of the cancel tag (``render.TAG_CANCEL``): who asked (``CancelledBy``'s
    value), or ``CANCEL_TAG_UNSAID``."""
    return CANCEL_TAG_UNSAID if by is None else by.value


def cancel_reason_text(backend: str, reason: str | None, by: CancelledBy | None = None) -> str:
    """The reason this scheduler gives CancelJob/TerminateJob: ours (``CANCEL_REASON``), who
    asked (``by``, for a job whose cancel tag could not be set), then who or what asked in
    words (``reason``) when given."""
    who = f" by {by.value}" if by is not None else ""
    return f"{CANCEL_REASON}{who} through {backend}" + (f": {reason}" if reason else "")


#: How the reasons Batch itself gives a FAILED job begin (a failed or unstartable container,
#: a timeout, a reclaimed host, a failed dependency, a queue's state time limit). A job that
#: Batch stopped for one of them is never taken for an outside cancel (``outside_cancel``), even
#: if Batch marked it terminated; a reason not on this list decides nothing either way.
BATCH_REASONS = (
    "Essential container in task exited",
    "Job attempt duration exceeded timeout",
    "Host EC2",
    "Dependent Job failed",
    "Array Child Job failed",
    "Task failed to start",
    "Timeout waiting for network interface",
    "CannotPullContainerError",
    "CannotStartContainerError",
    "CannotCreateContainerError",
    "CannotInspectContainerError",
    "ResourceInitializationError",
    "OutOfMemoryError",
    "MISCONFIGURATION:",
    "CAPACITY:",
)


def outside_cancel(job: Mapping[str, Any]) -> bool:
    """Whether the FAILED job ``job`` was stopped by a CancelJob/TerminateJob from outside this
    scheduler (the console, the AWS CLI, a script). The evidence is Batch's own: DescribeJobs'
    ``isCancelled``/``isTerminated`` (JobDetail, AWS Batch API reference: "Indicates whether the
    job is cancelled/terminated"), set by those calls, and the reason they were given as the
    job's ``statusReason`` ("This message is returned by future DescribeJobs operations on the
    job"), which is not one of Batch's own (``BATCH_REASONS``) and not ours (our cancel tag or
    reason). Without the flag, a reason never seen is an ordinary failure: the wording of AWS's
    reasons, which changes, decides no cancel."""
    text = str(job.get("statusReason") or "")
    flagged = bool(job.get("isCancelled") or job.get("isTerminated"))
    ours = _tagged(job) or text.startswith(CANCEL_REASON)
    return job.get("status") == "FAILED" and flagged and not ours and not text.startswith(BATCH_REASONS)


def cancel_reason(job: Mapping[str, Any]) -> str | None:
    """Who or what cancelled the job: the reason given to ``cancel_reason_text``, or, for a
    job stopped from outside this scheduler (``outside_cancel``), the reason given there.
    None: not cancelled, no reason given, or Batch has not applied the cancel yet."""
    text = str(job.get("statusReason") or "")
    if text.startswith(CANCEL_REASON):
        return text[len(CANCEL_REASON) :].partition(": ")[2] or None  # after "[ by WHO] through BACKEND: "
    if outside_cancel(job):
        return f"a CancelJob/TerminateJob on AWS Batch outside airflow-torchx: {text or 'no reason given'}"
    return None


def cancelled_by(job: Mapping[str, Any]) -> CancelledBy | None:
    """Who asked this scheduler to cancel the job: the cancel tag's value, else (the tag could
    not be set) what our reason says once Batch applied the cancel; None: not said, or not
    cancelled through this scheduler."""
    tagged = CancelledBy.parse((job.get("tags") or {}).get(TAG_CANCEL))
    if tagged is not None:
        return tagged
    text = str(job.get("statusReason") or "")
    if not text.startswith(CANCEL_REASON + " by "):
        return None
    return CancelledBy.parse(text[len(CANCEL_REASON + " by ") :].partition(" ")[0])


def _tagged(job: Mapping[str, Any]) -> bool:
    """Whether the job carries our cancel tag (whoever asked)."""
    value = (job.get("tags") or {}).get(TAG_CANCEL)
    return value == CANCEL_TAG_UNSAID or CancelledBy.parse(value) is not None


def cancel_requested(job: Mapping[str, Any]) -> bool:
    """Whether this scheduler was asked to cancel the job (its tag or its reason says so)."""
    return _tagged(job) or str(job.get("statusReason", "")).startswith(CANCEL_REASON)


def app_state(job: Mapping[str, Any], cancelled: bool | None = None) -> AppState:
    """The ``AppState`` of a Batch job; FAILED after our cancel request is CANCELLED."""
    state = STATE_MAP.get(str(job.get("status")), AppState.UNKNOWN)
    if cancelled is None:
        cancelled = cancel_requested(job)
    return AppState.CANCELLED if state == AppState.FAILED and cancelled else state


def has_ended(job: Mapping[str, Any]) -> bool:
    """Whether the Batch job (a DescribeJobs or ListJobs entry) has ended: SUCCEEDED or FAILED."""
    return job.get("status") in ENDED


def num_restarts(job: Mapping[str, Any]) -> int:
    """Attempts that ended and were followed by another (Batch lists attempts as they end;
    moto also lists the running one, without ``stoppedAt``)."""
    ended = sum(1 for a in job.get("attempts", []) if a.get("stoppedAt"))
    return max(0, ended - 1 if has_ended(job) else ended)


def _attempt_line(n: int, allowed: int, attempt: Mapping[str, Any], verb: str = "ended") -> str:
    container = attempt.get("container") or {}
    reason = attempt.get("statusReason") or container.get("reason") or "no reason given"
    code = container.get("exitCode")
    return f"attempt {n} of {allowed} {verb}: {reason}" + (f" (exit code {code})" if code is not None else "")


def attempts_summary(job: Mapping[str, Any]) -> str:
    """Which attempt the job is on or ended with and why earlier ones ended ("" for a job
    allowed one attempt that has at most one): e.g. ``attempt 2 of 3 running; attempt 1 of 3
    ended: Host EC2 (instance i-0ab) terminated.``."""
    allowed = int((job.get("retryStrategy") or {}).get("attempts") or 1)
    ended = [a for a in job.get("attempts") or [] if a.get("stoppedAt")]
    if allowed <= 1 and len(ended) <= 1:
        return ""
    status = str(job.get("status"))
    if status in ENDED and ended:
        last, earlier = ended[-1], ended[:-1]
        cancelled = cancel_requested(job)
        verb = "succeeded" if status == "SUCCEEDED" else "was cancelled" if cancelled else "failed"
        head = _attempt_line(len(ended), allowed, last, verb)
        if status == "FAILED" and len(ended) < allowed and not cancelled:
            head += "; not retried (the job's retry strategy exits on this reason)"
    else:
        earlier = ended
        head = f"attempt {len(ended) + 1} of {allowed} {'running' if status == 'RUNNING' else 'waiting'}"
    return "; ".join([head, *(_attempt_line(n, allowed, a) for n, a in enumerate(earlier, 1))])


def exit_code(job: Mapping[str, Any]) -> int | None:
    """The exit code of the job's (or node's) container, else of its newest attempt that has one."""
    container = job.get("container") or {}
    if container.get("exitCode") is not None:
        return int(container["exitCode"])
    for attempt in reversed(job.get("attempts", [])):
        code = (attempt.get("container") or {}).get("exitCode")
        if code is not None:
            return int(code)
    return None


def _reason(job: Mapping[str, Any]) -> str:
    """The job's ``statusReason`` and, when it says more, its container's ``reason`` (ECS puts
    ``OutOfMemoryError: Container killed due to memory usage`` there, under the job's
    ``Essential container in task exited``)."""
    container = job.get("container") or {}
    parts = [str(job.get("statusReason") or ""), str(container.get("reason") or "")]
    return ": ".join(dict.fromkeys(part for part in parts if part))


def _pod(entry: Mapping[str, Any]) -> str:
    """``pod NAMESPACE/NAME`` of a job on EKS (``eks.as_ecs_shape``); "" for others."""
    if not entry.get("podName"):
        return ""
    return f"pod {entry['podNamespace']}/{entry['podName']}" if entry.get("podNamespace") else f"pod {entry['podName']}"


def ui_url(region: str, job_id: str, multinode: bool = True) -> str:
    """The job's page in the AWS console (multi-node jobs have a page of their own)."""
    page = "mnp-job" if multinode else "detail"
    return f"https://{region}.console.aws.amazon.com/batch/home?region={region}#jobs/{page}/{job_id}"


def describe_response(
    app_id: str,
    job: Mapping[str, Any],
    nodes: Mapping[int, Mapping[str, Any]],
    region: str,
) -> DescribeAppResponse:
    """``DescribeAppResponse`` of ``job`` and, for a multi-node job, its child jobs ``nodes``
    (by node index; empty where the API gives none, as moto: replicas then take the job's
    state). A single-node job's replica is the job itself."""
    job = as_ecs_shape(job)
    nodes = {n: as_ecs_shape(child) for n, child in nodes.items()}
    cancelled = cancel_requested(job)
    multinode = is_multinode(job)
    if not multinode:
        nodes = {0: job}
    state = app_state(job, cancelled)
    roles = []
    role_statuses = []
    failed_node = ""
    for name, first, last, container in node_ranges(job):
        roles.append(role_from_container(name, last - first + 1, container))
        replicas = []
        for k, node in enumerate(range(first, last + 1)):
            child = nodes.get(node)
            if child is None:
                replicas.append(ReplicaStatus(id=k, state=state, role=name))
                continue
            code = exit_code(child)
            rep_state = app_state(child, cancelled)
            iface = ((child.get("container") or {}).get("networkInterfaces") or [{}])[0]
            replicas.append(
                ReplicaStatus(
                    id=k,
                    state=rep_state,
                    role=name,
                    hostname=str(child.get("nodeName") or iface.get("privateIpv4Address", "")),
                    exit_code=code,
                    msg="; ".join(part for part in (_reason(child), _pod(child)) if part),
                )
            )
            if not failed_node and rep_state == AppState.FAILED and code not in (None, 0):
                at = f" (node {node})" if multinode else ""
                failed_node = f"role {name!r} replica {k}{at} exited with code {code}"
                if _reason(child) and multinode:
                    failed_node += f": {_reason(child)}"
        role_statuses.append(RoleStatus(role=name, replicas=replicas))
    msg = _reason(job)
    if state in (AppState.FAILED, AppState.CANCELLED):
        if not failed_node and exit_code(job) not in (None, 0):
            failed_node = f"exit code {exit_code(job)}"
        msg = "; ".join(part for part in (msg, failed_node) if part)
    msg = "; ".join(part for part in (msg, attempts_summary(job)) if part)
    tags = job.get("tags") or {}
    return DescribeAppResponse(
        app_id=app_id,
        state=state,
        num_restarts=num_restarts(job),
        msg=msg,
        ui_url=ui_url(region, str(job.get("jobId", "")), multinode),
        roles_statuses=role_statuses,
        roles=roles,
        labels={k[len(TAG_LABEL) :]: v for k, v in tags.items() if k.startswith(TAG_LABEL)},
        cancel_requested=cancelled,
        cancel_reason=cancel_reason(job),
        cancelled_by=cancelled_by(job),
        started=epoch_seconds(job.get("startedAt")),
        ended=epoch_seconds(job.get("stoppedAt")),
        created=epoch_seconds(job.get("createdAt")),
    )


def epoch_seconds(millis: Any) -> float | None:
    """A Batch timestamp (epoch milliseconds) in epoch seconds; None when absent."""
    return millis / 1000.0 if isinstance(millis, int | float) and millis > 0 else None
