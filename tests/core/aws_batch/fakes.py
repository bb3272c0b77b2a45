"""In-memory stand-ins for the Batch and CloudWatch Logs clients, answering with the shapes of
the AWS API reference. They cover what moto does not model: child jobs ``jobId#N`` with
per-node exit codes and streams, several attempts, ListJobs pages, CancelJob before start."""

from __future__ import annotations

import functools
import itertools
import threading
from types import SimpleNamespace
from typing import Any

import botocore.session
from botocore.exceptions import ClientError
from botocore.hooks import HierarchicalEmitter
from botocore.paginate import Paginator

_ids = itertools.count()


@functools.cache
def _botocore() -> Any:
    return botocore.session.get_session()


def paginator(client: Any, service: str, name: str) -> Paginator:
    """boto3's paginator of operation ``name`` (as a client method names it) of ``service``,
    over the fake ``client``'s method: botocore's own paging (tokens, page size) on the fake's
    answers."""
    operation = "".join(part.title() for part in name.split("_"))
    model = _botocore().get_service_model(service).operation_model(operation)
    return Paginator(getattr(client, name), _botocore().get_paginator_model(service).get_paginator(operation), model)


def client_error(code: str, status: int = 400, op: str = "Op") -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, op)


def _meta(service: str) -> SimpleNamespace:
    # A unique endpoint per fake: pollers are shared per endpoint, tests must not share them.
    return SimpleNamespace(
        region_name="us-west-2",
        endpoint_url=f"http://fake-{next(_ids)}",
        service_model=SimpleNamespace(service_name=service),
        events=HierarchicalEmitter(),
    )


class FakeBatch:
    """Jobs in ``jobs`` (by id, children ``id#N`` included); records every call in ``calls``."""

    def __init__(self, page_size: int = 2) -> None:
        self.meta = _meta("batch")
        self.jobs: dict[str, dict[str, Any]] = {}
        self.queues = ["q1"]
        #: ``computeResources.type`` (or ``UNMANAGED``) of each queue's compute environments.
        self.queue_kinds: dict[str, list[str]] = {"q1": ["EC2"]}
        #: ``container`` (ContainerSummary) of ListJobs summaries, by job id.
        self.summary_containers: dict[str, dict[str, Any]] = {}
        #: Queues with a fair-share scheduling policy.
        self.fair_share: set[str] = set()
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.page_size = page_size
        self.fail_next: list[Exception] = []
        self.invisible_rounds = 0
        self._lock = threading.Lock()

    def _record(self, name: str, kwargs: dict[str, Any]) -> None:
        with self._lock:
            self.calls.append((name, kwargs))
            if self.fail_next:
                raise self.fail_next.pop(0)

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]

    def get_paginator(self, name: str) -> Paginator:
        return paginator(self, "batch", name)

    def describe_jobs(self, jobs: list[str]) -> dict[str, Any]:
        self._record("describe_jobs", {"jobs": jobs})
        assert 0 < len(jobs) <= 100
        if self.invisible_rounds:
            self.invisible_rounds -= 1
            return {"jobs": []}
        return {"jobs": [self.jobs[j] for j in jobs if j in self.jobs]}

    def describe_job_queues(self, **kwargs: Any) -> dict[str, Any]:
        self._record("describe_job_queues", kwargs)
        names = kwargs.get("jobQueues") or self.queues
        return {
            "jobQueues": [
                {
                    "jobQueueName": q,
                    "computeEnvironmentOrder": [
                        {"order": i, "computeEnvironment": f"arn:aws:batch:us-west-2:1:compute-environment/{q}-{kind}"}
                        for i, kind in enumerate(self.queue_kinds.get(q, []))
                    ],
                    **(
                        {"schedulingPolicyArn": f"arn:aws:batch:us-west-2:1:scheduling-policy/{q}"}
                        if q in self.fair_share
                        else {}
                    ),
                }
                for q in names
                if q in self.queues
            ]
        }

    def describe_compute_environments(self, computeEnvironments: list[str]) -> dict[str, Any]:
        self._record("describe_compute_environments", {"computeEnvironments": computeEnvironments})
        envs = []
        for arn in computeEnvironments:
            kind = arn.rsplit("-", 1)[-1] if "FARGATE_SPOT" not in arn else "FARGATE_SPOT"
            env: dict[str, Any] = {
                "computeEnvironmentArn": arn,
                "type": "UNMANAGED" if kind == "UNMANAGED" else "MANAGED",
            }
            if kind != "UNMANAGED":
                env["computeResources"] = {"type": kind}
            envs.append(env)
        return {"computeEnvironments": envs}

    def list_jobs(self, **kwargs: Any) -> dict[str, Any]:
        """By one filter (``jobStatus`` ignored), else by ``jobStatus`` (default RUNNING); the
        queue by name or ARN."""
        self._record("list_jobs", kwargs)
        queue = kwargs["jobQueue"]
        in_queue = [
            j
            for j in self.jobs.values()
            if "#" not in j["jobId"] and (j["jobQueue"] == queue or j["jobQueue"].endswith("/" + queue))
        ]
        if "filters" not in kwargs:
            match = [j for j in in_queue if j["status"] == kwargs.get("jobStatus", "RUNNING")]
            return self._page(match, kwargs)
        (flt,) = kwargs["filters"]
        value = flt["values"][0]
        match = [
            j
            for j in in_queue
            if flt["name"] == "AFTER_CREATED_AT"
            or (j["jobName"].startswith(value[:-1]) if value.endswith("*") else j["jobName"] == value)
        ]
        return self._page(match, kwargs)

    def _page(self, match: list[dict[str, Any]], kwargs: dict[str, Any]) -> dict[str, Any]:
        start = int(kwargs.get("nextToken") or 0)
        page = match[start : start + self.page_size]
        out: dict[str, Any] = {
            "jobSummaryList": [
                {
                    **{k: j[k] for k in ("jobId", "jobName", "createdAt", "status")},
                    **(
                        {"container": self.summary_containers[j["jobId"]]}
                        if j["jobId"] in self.summary_containers
                        else {}
                    ),
                }
                for j in page
            ]
        }
        if start + self.page_size < len(match):
            out["nextToken"] = str(start + self.page_size)
        return out

    def cancel_job(self, jobId: str, reason: str) -> dict[str, Any]:
        self._record("cancel_job", {"jobId": jobId, "reason": reason})
        return {}

    def terminate_job(self, jobId: str, reason: str) -> dict[str, Any]:
        self._record("terminate_job", {"jobId": jobId, "reason": reason})
        return {}

    def tag_resource(self, resourceArn: str, tags: dict[str, str]) -> dict[str, Any]:
        self._record("tag_resource", {"resourceArn": resourceArn, "tags": tags})
        for job in self.jobs.values():
            if job["jobArn"] == resourceArn:
                job.setdefault("tags", {}).update(tags)
        return {}

    def deregister_job_definition(self, jobDefinition: str) -> dict[str, Any]:
        self._record("deregister_job_definition", {"jobDefinition": jobDefinition})
        return {}

    def register_job_definition(self, **kwargs: Any) -> dict[str, Any]:
        self._record("register_job_definition", kwargs)
        return {"jobDefinitionArn": f"arn:aws:batch:us-west-2:1:job-definition/{kwargs['jobDefinitionName']}:1"}

    def submit_job(self, **kwargs: Any) -> dict[str, Any]:
        self._record("submit_job", kwargs)
        return {"jobId": "new-job", "jobName": kwargs["jobName"]}


def mnp_job(
    job_id: str = "j1",
    name: str = "app-1",
    status: str = "RUNNING",
    roles: tuple[tuple[str, int], ...] = (("trainer", 2), ("ps", 1)),
    tags: dict[str, str] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A multi-node parent job as DescribeJobs returns it (no ``container`` on the parent)."""
    ranges = []
    first = 0
    for role, n in roles:
        last = first + n - 1
        ranges.append(
            {
                "targetNodes": f"{first}:{last}" if n > 1 else str(first),
                "container": {
                    "image": "img",
                    "command": ["echo", role],
                    "environment": [
                        {"name": "TORCHX_ROLE_NAME", "value": role},
                        {"name": "TORCHX_ROLE_FIRST_NODE", "value": str(first)},
                    ],
                    "resourceRequirements": [{"type": "VCPU", "value": "2"}, {"type": "MEMORY", "value": "1024"}],
                    "instanceType": "p3.2xlarge",
                },
            }
        )
        first = last + 1
    job = _job_detail(job_id, name, status, tags)
    job["nodeProperties"] = {"numNodes": first, "mainNode": 0, "nodeRangeProperties": ranges}
    job.update(extra)
    return job


def container_job(
    job_id: str = "c1",
    name: str = "app-1",
    status: str = "RUNNING",
    role: str = "main",
    tags: dict[str, str] | None = None,
    attempts_allowed: int = 1,
    **extra: Any,
) -> dict[str, Any]:
    """A single-node job (``type: container``) as DescribeJobs returns it: a ``container``
    (ContainerDetail) with the definition's fields and the running attempt's, no nodes."""
    job = _job_detail(job_id, name, status, tags)
    job["retryStrategy"] = {"attempts": attempts_allowed}
    job["platformCapabilities"] = ["EC2"]
    job["container"] = {
        "image": "img",
        "command": ["python", "-m", "eval"],
        "environment": [
            {"name": "TORCHX_ROLE_NAME", "value": role},
            {"name": "TORCHX_ROLE_IDX", "value": "0"},
            {"name": "TORCHX_ROLE_FIRST_NODE", "value": "0"},
            {"name": "TORCHX_RANK0_HOST", "value": "localhost"},
            {"name": "FOO", "value": "bar"},
        ],
        "resourceRequirements": [{"type": "VCPU", "value": "1"}, {"type": "MEMORY", "value": "2048"}],
        "linuxParameters": {"sharedMemorySize": 2048},
        "logStreamName": f"{name}/default/{job_id}-att1",
        "networkInterfaces": [{"privateIpv4Address": "10.0.1.7"}],
        "taskArn": "arn:aws:ecs:us-west-2:1:task/t1",
        "containerInstanceArn": "arn:aws:ecs:us-west-2:1:container-instance/ci1",
    }
    job.update(extra)
    return job


def _job_detail(job_id: str, name: str, status: str, tags: dict[str, str] | None) -> dict[str, Any]:
    """The fields every ``JobDetail`` has, whatever its type (our tags, no attempts yet)."""
    return {
        "jobArn": f"arn:aws:batch:us-west-2:1:job/{job_id}",
        "jobName": name,
        "jobId": job_id,
        "jobQueue": "arn:aws:batch:us-west-2:1:job-queue/q1",
        "status": status,
        "createdAt": 1700000000000,
        "jobDefinition": f"arn:aws:batch:us-west-2:1:job-definition/{name}:1",
        "tags": {"airflow-torchx/version": "0.1.0", **(tags or {})},
        "attempts": [],
    }


def attempt(reason: str, exit_code: int | None = None, stream: str = "", n: int = 1) -> dict[str, Any]:
    """An ended attempt (AttemptDetail): its container's exit code and log stream, its reason."""
    container: dict[str, Any] = {"logStreamName": stream, "taskArn": f"arn:aws:ecs:us-west-2:1:task/t{n}"}
    if exit_code is not None:
        container["exitCode"] = exit_code
    return {"container": container, "startedAt": n * 1000, "stoppedAt": n * 1000 + 500, "statusReason": reason}


#: The status reason AWS Batch gives an attempt whose Spot instance was reclaimed.
SPOT_RECLAIMED = "Host EC2 (instance i-0abc1234def567890) terminated."


def child_job(parent: str, node: int, status: str, exit_code: int | None = None, **extra: Any) -> dict[str, Any]:
    """A node of a multi-node job (``jobId#N``), as real AWS describes it."""
    container: dict[str, Any] = {
        "logStreamName": f"jd/default/{parent}-{node}",
        "networkInterfaces": [{"privateIpv4Address": f"10.0.0.{node + 1}"}],
    }
    if exit_code is not None:
        container["exitCode"] = exit_code
    job = {
        "jobArn": f"arn:aws:batch:us-west-2:1:job/{parent}#{node}",
        "jobName": "app-1",
        "jobId": f"{parent}#{node}",
        "jobQueue": "arn:aws:batch:us-west-2:1:job-queue/q1",
        "status": status,
        "nodeDetails": {"nodeIndex": node, "isMainNode": node == 0},
        "container": container,
        "attempts": [],
    }
    job.update(extra)
    return job


class FakeLogs:
    """CloudWatch Logs ``get_log_events`` over in-memory streams, with CloudWatch's token rules:
    pages of ``page`` events, ``f/<n>`` forward tokens, the same token back at the end."""

    def __init__(self, page: int = 2) -> None:
        self.meta = _meta("logs")
        self.streams: dict[str, list[dict[str, Any]]] = {}
        self.page = page
        self.calls = 0

    def add(self, stream: str, *messages: str, start: int = 0) -> None:
        events = self.streams.setdefault(stream, [])
        for i, msg in enumerate(messages):
            events.append({"timestamp": 1700000000000 + start + i * 1000, "message": msg})

    def get_log_events(self, **kwargs: Any) -> dict[str, Any]:
        self.calls += 1
        name = kwargs["logStreamName"]
        if name not in self.streams:
            raise client_error("ResourceNotFoundException", op="GetLogEvents")
        token = kwargs.get("nextToken")
        pos = int(token[2:]) if token else 0
        events = self.streams[name][pos : pos + min(self.page, kwargs.get("limit", self.page))]
        return {"events": events, "nextForwardToken": f"f/{pos + len(events)}", "nextBackwardToken": "b/0"}
