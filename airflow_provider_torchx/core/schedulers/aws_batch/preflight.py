"""Queue preflight: whether a job queue and its compute environments can ever run a job,
decided before anything is registered or submitted (run option ``check_queue``).

``check`` is a pure function over AWS-shaped data (``QueueView``: the ``DescribeJobQueues``,
``DescribeComputeEnvironments`` and ``DescribeInstanceTypes`` entries as boto3 returns them)
and the job's needs as the renderer wrote them (``job_needs``). It refuses only what cannot
run: a field AWS did not give, or an instance type entry no description matched, refuses
nothing. ``describe`` makes the calls and ``QueueCache`` keeps each queue's view for
``CACHE_TTL`` seconds per process, so many tasks submitting to one queue cost a few calls.

Rules per compute environment: it must be ENABLED with status VALID (or UPDATING: Batch runs
jobs through an update) and run the job's kind (``options.refusal``). Managed ones (EC2, SPOT,
FARGATE, FARGATE_SPOT) must have ``maxvCpus`` for the whole job's vCPUs (every node of a
multi-node job runs at once). EC2 and SPOT ones must allow an instance type with the GPUs,
memory and vCPUs of each node (and the named one, when a node names one); families (``p4d``)
and the keywords ``optimal``, ``default_x86_64`` and ``default_arm64`` are resolved with
``DescribeInstanceTypes``. An instance's whole memory is compared, though the ECS agent keeps
some of it: a job just under it passes here and may still wait in RUNNABLE. Fargate ones have
no instance types (the vCPU/memory pair is checked at dry run, ``options``); UNMANAGED ones are
the owner's instances: only their state and status are checked.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_provider_torchx.core.clock import SYSTEM_CLOCK, Clock
from airflow_provider_torchx.core.errors import JobWontFitError
from airflow_provider_torchx.core.schedulers.aws_batch import eks, options, render
from airflow_provider_torchx.core.schedulers.aws_batch.clients import all_items
from airflow_provider_torchx.core.specs import INSTANCE_TYPE

log = logging.getLogger(__name__)

#: How long a queue's descriptions are reused in a process (seconds).
CACHE_TTL = 300.0

#: The families Batch picks from for the ``instanceTypes`` keywords (Batch API reference,
#: ``ComputeResource.instanceTypes``). ``optimal`` is c4/m4/r4/c5/m5/r5, and since November 2025
#: it follows ``default_x86_64``: both sets, so that no job one of them runs is refused.
KEYWORD_FAMILIES: dict[str, tuple[str, ...]] = {
    "optimal": ("c4", "m4", "r4", "c5", "m5", "r5", "m6i", "c6i", "r6i", "c7i"),
    "default_x86_64": ("m6i", "c6i", "r6i", "c7i"),
    "default_arm64": ("m6g", "c6g", "r6g", "c7g"),
}
#: Statuses of a queue or compute environment that runs jobs.
USABLE_STATUSES = frozenset({"VALID", "UPDATING"})
_HINT = "(run option check_queue=False submits without this check)"


@dataclass(frozen=True)
class NodeNeeds:
    """What each of ``nodes`` nodes of one node range asks for."""

    nodes: int
    vcpus: int
    memory_mib: int
    gpus: int
    instance_type: str | None = None


@dataclass(frozen=True)
class JobNeeds:
    """A job's node ranges, whether it is multi-node parallel, and its platform."""

    ranges: tuple[NodeNeeds, ...]
    multinode: bool
    platform: str

    @property
    def vcpus(self) -> int:
        """The vCPUs of every node together: a multi-node job's nodes all run at once."""
        return sum(r.nodes * r.vcpus for r in self.ranges)


@dataclass(frozen=True)
class QueueView:
    """One queue as AWS describes it: its ``DescribeJobQueues`` entry, the
    ``DescribeComputeEnvironments`` entries of its environments, and the
    ``DescribeInstanceTypes`` entries (by name) their ``instanceTypes`` match (None: not read)."""

    queue: Mapping[str, Any]
    envs: tuple[Mapping[str, Any], ...]
    instance_types: Mapping[str, Mapping[str, Any]] | None


def job_needs(job_def: Mapping[str, Any]) -> JobNeeds:
    """The needs of a rendered job definition (``render.render``'s ``job_def``), read back
    with the renderer's own reading of a container (``render.role_from_container``; a pod's
    through ``eks.container_view``)."""
    on_eks = eks.is_eks_job(job_def)
    job_def = eks.as_ecs_shape(job_def)
    if job_def.get("nodeProperties"):
        props = job_def["nodeProperties"]
        ranges = []
        for rng in props.get("nodeRangeProperties", []):
            first, last = render.target_range(rng["targetNodes"], int(props["numNodes"]))
            ranges.append((last - first + 1, rng["container"]))
    else:
        ranges = [(1, job_def["container"] if on_eks else job_def["containerProperties"])]
    needs = []
    for nodes, container in ranges:
        res = render.role_from_container("", nodes, container).resource
        needs.append(NodeNeeds(nodes, res.cpu, res.memMB, res.gpu, res.capabilities.get(INSTANCE_TYPE)))
    platform = "EKS" if on_eks else str((job_def.get("platformCapabilities") or ["EC2"])[0])
    return JobNeeds(tuple(needs), multinode=job_def.get("type") == "multinode", platform=platform)


def instance_patterns(entries: Sequence[str]) -> list[str]:
    """``DescribeInstanceTypes`` ``instance-type`` filter values for a compute environment's
    ``instanceTypes``: a size as is, a family as ``family.*``, a keyword as its families."""
    out: list[str] = []
    for entry in entries:
        if entry in KEYWORD_FAMILIES:
            out.extend(f"{family}.*" for family in KEYWORD_FAMILIES[entry])
        else:
            out.append(entry if "." in entry else f"{entry}.*")
    return out


def _matches(name: str, pattern: str) -> bool:
    return name.split(".", 1)[0] == pattern[:-2] if pattern.endswith(".*") else name == pattern


def allowed_types(entries: Sequence[str], described: Mapping[str, Mapping[str, Any]]) -> list[str] | None:
    """The described instance types ``entries`` allow; None when an entry matches none of
    them (unknown here: nothing is assumed about what it allows)."""
    found: set[str] = set()
    for entry in entries:
        patterns = instance_patterns([entry])
        matched = [name for name in described if any(_matches(name, p) for p in patterns)]
        if not matched:
            return None
        found.update(matched)
    return sorted(found)


def _gpus(info: Mapping[str, Any]) -> int:
    return sum(int(g.get("Count", 0)) for g in (info.get("GpuInfo") or {}).get("Gpus", []))


def _memory(info: Mapping[str, Any]) -> int:
    return int((info.get("MemoryInfo") or {}).get("SizeInMiB", 0))


def _vcpus(info: Mapping[str, Any]) -> int:
    return int((info.get("VCpuInfo") or {}).get("DefaultVCpus", 0))


#: What a node is compared on, in this order: (unit, plural, the node's need, an instance's).
_DIMENSIONS: tuple[tuple[str, str, Callable[[NodeNeeds], int], Callable[[Mapping[str, Any]], int]], ...] = (
    ("GPU", "GPUs", lambda n: n.gpus, _gpus),
    ("MiB of memory", "MiB of memory", lambda n: n.memory_mib, _memory),
    ("vCPU", "vCPUs", lambda n: n.vcpus, _vcpus),
)


def runnable_limit(queue: Mapping[str, Any]) -> str:
    """What the job queue (a ``DescribeJobQueues`` entry) does with a job blocked RUNNABLE at
    its head, in one clause: its ``jobStateTimeLimitActions`` for RUNNABLE (Batch's own
    ``start_timeout``, set on the queue), else that only ``start_timeout`` stops such a job."""
    actions = [a for a in queue.get("jobStateTimeLimitActions") or [] if a.get("state") == "RUNNABLE"]
    if not actions:
        return (
            "it has no jobStateTimeLimitActions: a job blocked RUNNABLE at its head waits until a task's "
            "start_timeout stops it"
        )
    shown = "; ".join(f"{a.get('action')} after {a.get('maxTimeSeconds')}s ({a.get('reason')})" for a in actions)
    return f"a job blocked RUNNABLE at its head: {shown} (jobStateTimeLimitActions)"


def _state_refusal(what: str, entry: Mapping[str, Any]) -> str | None:
    state, status = entry.get("state"), entry.get("status")
    if state is not None and state != "ENABLED":
        return f"{what} is {state}"
    if status is not None and status not in USABLE_STATUSES:
        reason = entry.get("statusReason")
        return f"{what} is {status}" + (f" ({reason})" if reason else "")
    return None


def _node_refusal(
    where: str, need: NodeNeeds, entries: Sequence[str], allowed: Sequence[str], described: Mapping[str, Any]
) -> str | None:
    """Why no allowed instance type runs a node of ``need`` (``where``: the job, or its node
    range); None if one does."""
    listed = ", ".join(entries)
    candidates = list(allowed)
    if need.instance_type:
        if need.instance_type not in allowed:
            return f"{where} asks for instance type {need.instance_type}, not among its instance types ({listed})"
        candidates = [need.instance_type]
    among = ""
    for unit, units, wanted, has in _DIMENSIONS:
        fitting = [t for t in candidates if has(described[t]) >= wanted(need)]
        if not fitting:
            best = max(candidates, key=lambda t: (has(described[t]), t))
            most = has(described[best])
            return (
                f"{where} needs {wanted(need)} {unit if wanted(need) == 1 else units} per node, more than any of "
                f"its instance types ({listed}){among} has: at most {most} {unit if most == 1 else units} ({best})"
            )
        candidates, among = fitting, f" with enough {units}" if not among else f"{among} and {units}"
    return None


def env_refusal(env: Mapping[str, Any], job: JobNeeds, view: QueueView) -> str | None:
    """Why compute environment ``env`` cannot run ``job``; None if it can (or nothing says
    it cannot)."""
    refused = _state_refusal("it", env) or options.refusal(
        options.compute_kind(env), job.multinode, job.platform, options.is_eks(env)
    )
    if refused or env.get("type") == "UNMANAGED":
        return refused
    resources = env.get("computeResources") or {}
    limit = resources.get("maxvCpus")
    if limit is not None and job.vcpus > int(limit):
        nodes = sum(r.nodes for r in job.ranges)
        shape = f" ({nodes} nodes)" if nodes > 1 else ""
        return f"the job needs {job.vcpus} vCPUs{shape}, over its maxvCpus {limit}"
    entries = list(resources.get("instanceTypes") or [])
    if not entries or view.instance_types is None:
        return None
    allowed = allowed_types(entries, view.instance_types)
    if allowed is None:
        return None
    for index, need in enumerate(job.ranges):
        where = f"node range {index}" if len(job.ranges) > 1 else "the job"
        refused = _node_refusal(where, need, entries, allowed, view.instance_types)
        if refused:
            return refused
    return None


def queue_refusal(queue: Mapping[str, Any]) -> str | None:
    """Why AWS Batch runs no jobs from ``queue`` (its ``DescribeJobQueues`` entry): it is not
    ENABLED, or its status is not VALID/UPDATING; None if it runs jobs. The one rule for the
    submit-time check (``refusal``) and a connection's test (``check_settings``)."""
    return _state_refusal(f"queue {str(queue.get('jobQueueName'))!r}", queue)


def refusal(view: QueueView, job: JobNeeds) -> str | None:
    """Why the queue of ``view`` cannot run ``job`` (``queue_refusal``, else each compute
    environment named, with the limit the job passes), in AWS's terms; None if it can."""
    refused = queue_refusal(view.queue)
    if refused:
        return f"{refused}: AWS Batch runs no jobs from it"
    by_arn = {str(e.get("computeEnvironmentArn")): e for e in view.envs}
    order = sorted(view.queue.get("computeEnvironmentOrder") or [], key=lambda o: int(o.get("order", 0)))
    reasons = []
    for item in order:
        arn = str(item["computeEnvironment"])
        env = by_arn.get(arn)
        label = env.get("computeEnvironmentName", arn) if env else arn.rsplit("/", 1)[-1]
        refused = "it was not found" if env is None else env_refusal(env, job, view)
        if refused is None:
            return None
        reasons.append(f"compute environment {label!r}: {refused}")
    if not reasons:
        reasons.append("it has no compute environment")
    return f"queue {str(view.queue.get('jobQueueName'))!r} cannot run this job: {'; '.join(reasons)}"


def check(view: QueueView, job: JobNeeds) -> None:
    """Raise ``JobWontFitError`` when the queue of ``view`` cannot run ``job`` (``refusal``),
    naming the run option that skips this check."""
    refused = refusal(view, job)
    if refused is not None:
        raise JobWontFitError(f"cfg: {refused} {_HINT}")


# --------------------------------------------------------------------------- the calls


def describe(batch: Any, ec2: Callable[[], Any], queue: str) -> QueueView | None:
    """The ``QueueView`` of ``queue`` (None: no such queue), every page read (boto3's
    paginators); ``ec2()`` gives the EC2 client, asked for only when an environment lists
    instance types. An identity not allowed ``ec2:DescribeInstanceTypes`` gets a view without
    instance types (a warning says so)."""
    found = batch.describe_job_queues(jobQueues=[queue]).get("jobQueues", [])
    if not found:
        return None
    arns = [o["computeEnvironment"] for o in found[0].get("computeEnvironmentOrder", [])]
    envs = all_items(batch, "describe_compute_environments", "computeEnvironments", computeEnvironments=arns)
    patterns = sorted(
        {
            p
            for env in envs
            if options.compute_kind(env) in ("EC2", "SPOT")
            for p in instance_patterns((env.get("computeResources") or {}).get("instanceTypes") or [])
        }
    )
    types: dict[str, Mapping[str, Any]] | None = {}
    if patterns:
        types = _instance_types(ec2(), patterns)
    return QueueView(found[0], tuple(envs), types)


def _instance_types(ec2: Any, patterns: list[str]) -> dict[str, Mapping[str, Any]] | None:
    from airflow_provider_torchx.core.schedulers.aws_batch.setup_errors import is_denied

    try:
        found = all_items(
            ec2, "describe_instance_types", "InstanceTypes", Filters=[{"Name": "instance-type", "Values": patterns}]
        )
    except Exception as err:
        if not is_denied(err):
            raise
        log.warning("queue check without instance types: ec2:DescribeInstanceTypes was denied (%s)", err)
        return None
    return {t["InstanceType"]: t for t in found}


@dataclass
class _Slot:
    lock: threading.Lock
    view: QueueView | None = None
    at: float = 0.0


class QueueCache:
    """Queue views by key, each reused for ``ttl`` seconds of ``clock``'s monotonic time; a key's first
    readers wait for one fetch. A queue that does not exist is not remembered."""

    def __init__(self, ttl: float = CACHE_TTL, clock: Clock = SYSTEM_CLOCK) -> None:
        self.ttl = ttl
        self._clock = clock
        self._lock = threading.Lock()
        self._slots: dict[Hashable, _Slot] = {}

    def get(self, key: Hashable, fetch: Callable[[], QueueView | None]) -> QueueView | None:
        """The view under ``key``, from ``fetch()`` when none is younger than ``ttl``."""
        with self._lock:
            slot = self._slots.setdefault(key, _Slot(threading.Lock()))
        with slot.lock:
            if slot.view is None or self._clock.monotonic() - slot.at >= self.ttl:
                slot.view, slot.at = fetch(), self._clock.monotonic()
            return slot.view


#: The process's cache (keyed by account/region/endpoint, credentials and queue).
queue_cache = QueueCache()
