"""Where a pod's output lands in CloudWatch Logs, read back for an EKS job (docs/schedulers.md,
"Batch on EKS"): pure functions over ``DescribeJobs`` entries and log stream names.

Batch sends no pod output to CloudWatch; the cluster's Fluent Bit does, as Container Insights
configures it (the CloudWatch Observability add-on, or its Fluent Bit DaemonSet): a ``tail``
input tagged ``application.*`` on ``/var/log/containers/*.log`` and a ``cloudwatch_logs`` output
to the log group ``/aws/containerinsights/CLUSTER/application`` with ``log_stream_prefix``
``NODE-``. The tag is the file's path with ``/`` as ``.`` and the kubelet names that file
``POD_NAMESPACE_CONTAINER-CONTAINERID.log``, so a container's stream is
``NODE-application.var.log.containers.POD_NAMESPACE_CONTAINER-CONTAINERID.log``: the node and pod
come from the job's description (``eksAttempts``, ``eksProperties.podProperties``), the id is
found by listing the streams with that prefix. Each event is Fluent Bit's record as JSON, its
``log`` field the line.

Which log group: the run option ``eks_log_group`` (kept in the job's tags), else the cluster an
attempt ran on (``eksAttempts[].eksClusterArn``), else the single cluster of the queue's EKS
compute environments (``eksConfiguration.eksClusterArn``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_provider_torchx.core.schedulers.aws_batch import eks, render, status

#: The job tag holding the run option ``eks_log_group``.
TAG_LOG_GROUP = render.TAG_EKS_LOG_GROUP
#: How long after a pod stopped its stream may still be missing before the reader stops waiting
#: for it (seconds): Fluent Bit finds a new file within its ``Refresh_Interval`` (10 s) and sends
#: every ``Flush`` (5 s) in Container Insights' configuration; a pod that never started (an image
#: that could not be pulled) has no stream at all.
SHIP_GRACE = 60.0


@dataclass(frozen=True)
class PodRef:
    """One pod of a job (one attempt): its ``pod`` and ``node`` names, ``namespace`` (None:
    unknown), its container's name, and when it stopped (epoch seconds; None: running)."""

    pod: str
    node: str
    namespace: str | None = None
    container: str = eks.CONTAINER_NAME
    stopped_at: float | None = None


def cluster_name(cluster: str) -> str:
    """The cluster's name from its ARN (``arn:aws:eks:REGION:ACCOUNT:cluster/NAME``) or name."""
    return cluster.rsplit("/", 1)[-1]


def application_group(cluster: str) -> str:
    """Container Insights' log group of the containers' output on ``cluster`` (ARN or name)."""
    return f"/aws/containerinsights/{cluster_name(cluster)}/application"


def stream_prefix(ref: PodRef) -> str:
    """The start of the pod's container's stream names (the container id follows); without a
    namespace, the start up to the pod's name (``matches`` then checks the container)."""
    head = f"{ref.node}-application.var.log.containers.{ref.pod}_"
    return head if ref.namespace is None else f"{head}{ref.namespace}_{ref.container}-"


def matches(ref: PodRef, name: str) -> bool:
    """Whether stream ``name`` is the output of ``ref``'s container (and not of another
    container of the pod: names and namespaces hold no ``_``)."""
    prefix = stream_prefix(ref)
    if not name.startswith(prefix) or not name.endswith(".log"):
        return False
    if ref.namespace is not None:
        return True
    _, sep, rest = name[len(prefix) :].partition("_")
    return bool(sep) and rest.startswith(ref.container + "-")


def pods(entry: Mapping[str, Any]) -> list[PodRef]:
    """The pods of a DescribeJobs entry of an EKS job (a single-node job, or one node's child
    job ``jobId#N``), oldest attempt first, then the running pod; each pod once."""
    out: list[PodRef] = []
    namespace = None
    for attempt in entry.get("eksAttempts") or []:
        namespace = attempt.get("podNamespace") or namespace
        container = (attempt.get("containers") or [{}])[0].get("name") or eks.CONTAINER_NAME
        if attempt.get("podName") and attempt.get("nodeName"):
            stopped = status.epoch_seconds(attempt.get("stoppedAt"))
            ref = PodRef(str(attempt["podName"]), str(attempt["nodeName"]), namespace, str(container), stopped)
            out.append(ref)
    pod = (entry.get("eksProperties") or {}).get("podProperties") or {}
    name, node = pod.get("podName"), pod.get("nodeName")
    if name and node and all(ref.pod != name for ref in out):
        namespace = (pod.get("metadata") or {}).get("namespace") or namespace
        container = (pod.get("containers") or [{}])[0].get("name") or eks.CONTAINER_NAME
        stopped = status.epoch_seconds(entry.get("stoppedAt")) if status.has_ended(entry) else None
        out.append(PodRef(str(name), str(node), namespace, str(container), stopped))
    return out


def job_log_group(tags: Mapping[str, str] | None, entry: Mapping[str, Any]) -> str | None:
    """The log group of a job's pods from the job itself: its ``eks_log_group`` tag, else the
    cluster of its newest attempt that names one; None when neither says."""
    if tags and tags.get(TAG_LOG_GROUP):
        return str(tags[TAG_LOG_GROUP])
    for attempt in reversed(entry.get("eksAttempts") or []):
        if attempt.get("eksClusterArn"):
            return application_group(str(attempt["eksClusterArn"]))
    return None


def queue_clusters(envs: Iterable[Mapping[str, Any]]) -> list[str]:
    """The EKS clusters (ARNs) of a queue's ``DescribeComputeEnvironments`` entries, sorted."""
    return sorted({str(e["eksConfiguration"]["eksClusterArn"]) for e in envs if _cluster_of(e)})


def _cluster_of(env: Mapping[str, Any]) -> bool:
    return bool((env.get("eksConfiguration") or {}).get("eksClusterArn"))


def queue_log_group(clusters: Sequence[str]) -> tuple[str | None, str]:
    """The log group for a job of a queue on ``clusters``, or None and why not."""
    if len(clusters) == 1:
        return application_group(clusters[0]), ""
    if not clusters:
        return None, "its queue's compute environments name no EKS cluster"
    names = ", ".join(cluster_name(c) for c in clusters)
    return None, f"its queue's compute environments are on several EKS clusters ({names})"


def streams_in_order(
    refs: Sequence[PodRef], found: Callable[[PodRef], list[str] | None], now: float
) -> tuple[list[str], bool]:
    """The pods' streams in attempt order, and whether every pod is accounted for.

    ``found(ref)``: the pod's streams, oldest first (``[]``: none yet; None: not looked up,
    the read's call budget ran out). A pod without a stream stops the list (a later pod's
    stream must not take its place in a reader's cursor) unless it stopped ``SHIP_GRACE``
    seconds before ``now``: then it has none and is passed over. Not all accounted for: the
    log may still grow, whatever the job's state.
    """
    out: list[str] = []
    for ref in refs:
        names = found(ref)
        if names is None:
            return out, False
        if not names:
            if ref.stopped_at is not None and now - ref.stopped_at >= SHIP_GRACE:
                continue
            return out, False
        out.extend(n for n in names if n not in out)
    return out, True


def line(event: Mapping[str, Any]) -> str:
    """A Fluent Bit event's line, ending in ``"\\n"``: its JSON record's ``log`` field (a
    message that is no such record stays as it is)."""
    message = str(event.get("message", ""))
    text = message
    if message.startswith("{"):
        try:
            record = json.loads(message)
        except ValueError:
            record = None
        if isinstance(record, dict) and isinstance(record.get("log"), str):
            text = record["log"]
    return text if text.endswith("\n") else text + "\n"
