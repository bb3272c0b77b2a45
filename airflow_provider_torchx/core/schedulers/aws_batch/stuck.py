"""Why a Batch job has not started: its own ``statusReason``, its queue's and each compute
environment's state and ``statusReason``, and, where the queue preflight's rules can tell
(``preflight.refusal``), why the job fits none of them.

Pure functions over AWS-shaped data (a ``DescribeJobs`` entry and a ``preflight.QueueView``);
the scheduler reads both once, when ``start_timeout`` trips (``core/guards.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_provider_torchx.core.schedulers.aws_batch import preflight


def _state(entry: Mapping[str, Any]) -> str:
    parts = [str(entry[k]) for k in ("state", "status") if entry.get(k)]
    reason = entry.get("statusReason")
    return "/".join(parts) + (f" ({reason})" if reason else "")


def job_definition_of(job: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a ``DescribeJobs`` entry that the preflight reads a job's needs from,
    shaped as the job definition it was submitted with."""
    if job.get("nodeProperties"):
        return {
            "type": "multinode",
            "nodeProperties": job["nodeProperties"],
            "platformCapabilities": job.get("platformCapabilities") or ["EC2"],
        }
    return {
        "type": "container",
        "containerProperties": job.get("container") or {},
        "platformCapabilities": job.get("platformCapabilities") or ["EC2"],
    }


def wait_reason(job: Mapping[str, Any], view: preflight.QueueView | None) -> str:
    """What holds ``job`` (a ``DescribeJobs`` entry) in its queue ``view`` (None: the queue
    is gone), in AWS's words and the preflight's."""
    parts = [f"Batch job {job.get('status', '?')}" + (f": {job['statusReason']}" if job.get("statusReason") else "")]
    if job.get("dependsOn"):
        ids = ", ".join(str(d.get("jobId")) for d in job["dependsOn"])
        parts.append(f"it depends on {ids}")
    if view is None:
        parts.append(f"queue {job.get('jobQueue')!r} was not found")
        return "; ".join(parts)
    parts.append(f"queue {view.queue.get('jobQueueName')!r} {_state(view.queue)}")
    parts.extend(f"compute environment {e.get('computeEnvironmentName')!r} {_state(e)}" for e in view.envs)
    try:
        refused = preflight.refusal(view, preflight.job_needs(job_definition_of(job)))
    except (KeyError, TypeError, ValueError):  # a shape the preflight cannot read: say nothing of fit
        refused = None
    if refused is not None:
        parts.append(refused)
    return "; ".join(parts)
