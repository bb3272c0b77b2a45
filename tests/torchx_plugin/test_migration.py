"""Jobs TorchX 0.7.0's ``aws_batch`` submitted (tagged ``torchx.pytorch.org/*``, always
multi-node) are listed and described by the plugin beside its own; jobs of neither stay out.
A stub Batch client answers ListJobs and DescribeJobs with 0.7.0's job shape."""

from __future__ import annotations

import types
from typing import Any

from torchx import specs as tx

from airflow_provider_torchx.torchx_plugin.scheduler import TORCHX_070_TAG, create_scheduler

CONTAINER = {
    "image": "busybox:local",
    "command": ["echo", "hi"],
    "environment": [{"name": "TORCHX_ROLE_NAME", "value": "trainer"}],
    "resourceRequirements": [{"type": "VCPU", "value": "1"}, {"type": "MEMORY", "value": "64"}],
}


def job(job_id: str, name: str, tags: dict[str, str], nodes: int = 0) -> dict[str, Any]:
    """A DescribeJobs entry: single-node (``nodes=0``) or multi-node of ``nodes``."""
    entry: dict[str, Any] = {
        "jobId": job_id,
        "jobName": name,
        "jobArn": f"arn:aws:batch:us-east-1:1:job/{job_id}",
        "jobQueue": "arn:aws:batch:us-east-1:1:job-queue/q",
        "status": "SUCCEEDED",
        "createdAt": int(job_id) * 1000,
        "tags": tags,
    }
    if nodes:
        rng = {"targetNodes": f"0:{nodes - 1}", "container": CONTAINER}
        entry["nodeProperties"] = {"numNodes": nodes, "mainNode": 0, "nodeRangeProperties": [rng]}
    else:
        entry["container"] = CONTAINER
    return entry


class StubBatch:
    """ListJobs (with its JOB_NAME filter) and DescribeJobs over ``jobs``."""

    def __init__(self, jobs: list[dict[str, Any]]) -> None:
        self.jobs = jobs
        model = types.SimpleNamespace(service_name="batch")
        self.meta = types.SimpleNamespace(
            region_name="us-east-1", endpoint_url="https://batch.stub", service_model=model
        )

    def get_paginator(self, operation: str) -> StubBatch:
        assert operation == "list_jobs"
        return self

    def paginate(self, **kwargs: Any) -> list[dict[str, Any]]:
        names = [f["values"][0] for f in kwargs.get("filters", []) if f["name"] == "JOB_NAME"]
        found = [j for j in self.jobs if not names or j["jobName"] == names[0]]
        return [{"jobSummaryList": [{k: j[k] for k in ("jobId", "jobName", "createdAt")} for j in found]}]

    def describe_jobs(self, jobs: list[str]) -> dict[str, Any]:
        return {"jobs": [j for j in self.jobs if j["jobId"] in jobs]}


JOBS = [
    job("1", "mine-1", {"airflow-torchx/version": "0.1.0", "airflow-torchx/app-name": "mine"}),
    job("2", "old-2", {TORCHX_070_TAG: "0.7.0", "torchx.pytorch.org/app-name": "old"}, nodes=2),
    job("3", "other-3", {}),
]


def test_list_shows_the_jobs_torchx_070_submitted_beside_ours() -> None:
    sched = create_scheduler("t", client=StubBatch(JOBS), region="us-east-1")
    listed = [(app.app_id, app.state) for app in sched.list({"queue": "q"})]
    assert listed == [("q:mine-1", tx.AppState.SUCCEEDED), ("q:old-2", tx.AppState.SUCCEEDED)]


def test_describe_reads_a_torchx_070_job() -> None:
    sched = create_scheduler("t", client=StubBatch(JOBS), region="us-east-1")
    desc = sched.describe("q:old-2")
    assert desc is not None and desc.state == tx.AppState.SUCCEEDED
    assert [(r.name, r.num_replicas, r.image, r.entrypoint, r.args) for r in desc.roles] == [
        ("trainer", 2, "busybox:local", "echo", ["hi"])
    ]
    sched.close()
