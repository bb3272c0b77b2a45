"""What pricing live AWS Batch jobs at AWS's prices costs the status poller: N running jobs
without rates, each looked at R rounds through the poller's futures (``describe_future_as``,
what a trigger or watcher asks; each look runs ``_response`` on the poller's thread), pricing
on, against the same jobs carrying rates (no AWS pricing: the looks as before it existed).

The Batch client is the tests' fake (``tests/core/aws_batch/fakes.py``); the pricing's ECS, EC2
and Price List clients answer canned responses shaped as the API reference shows, each call
counted by operation. Prints the look time per round, the pricing calls per job and the
rounds until every job's cost so far was known.

    .venv/bin/python benchmarks/batch_pricing.py [--jobs 1000] [--rounds 20]
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from airflow_provider_torchx.core.rates import Rates
from airflow_provider_torchx.core.schedulers.aws_batch import create_scheduler
from airflow_provider_torchx.core.schedulers.aws_batch.pricing import AttemptPricer
from airflow_provider_torchx.core.schedulers.aws_batch.render import TAG_LABEL
from tests.core.aws_batch.fakes import FakeBatch, FakeLogs, container_job

ARN = "arn:aws:ecs:us-west-2:123456789012:container-instance/ce1/{}"
ANSWERS: dict[str, dict[str, Any]] = {
    "describe_container_instances": {"containerInstances": [{"ec2InstanceId": "i-0abc"}]},
    "describe_instances": {
        "Reservations": [
            {"Instances": [{"InstanceType": "g5.xlarge", "Placement": {"AvailabilityZone": "us-west-2a"}}]}
        ]
    },
    "describe_instance_types": {
        "InstanceTypes": [
            {"InstanceType": "g5.xlarge", "VCpuInfo": {"DefaultVCpus": 4}, "GpuInfo": {"Gpus": [{"Count": 1}]}}
        ]
    },
    "get_products": {
        "PriceList": [
            json.dumps(
                {
                    "terms": {
                        "OnDemand": {"t": {"priceDimensions": {"d": {"unit": "Hrs", "pricePerUnit": {"USD": "1.006"}}}}}
                    }
                }
            )
        ]
    },
}


class Canned:
    """A client answering ``ANSWERS``, counting each call in ``calls``."""

    def __init__(self, calls: collections.Counter[str]) -> None:
        self.calls = calls

    def __getattr__(self, operation: str) -> Any:
        def call(**_: Any) -> dict[str, Any]:
            self.calls[operation] += 1
            return ANSWERS[operation]

        return call


def run(jobs: int, rounds: int, priced: bool) -> dict[str, Any]:
    """Look at ``jobs`` running jobs ``rounds`` times; ``priced``: without rates (AWS pricing on)."""
    calls: collections.Counter[str] = collections.Counter()
    batch = FakeBatch()
    sched = create_scheduler("bench", client=batch, log_client=FakeLogs())
    sched.pricer = AttemptPricer(lambda service, region: Canned(calls), "us-west-2", Path(tempfile.mkdtemp()))
    tags = {} if priced else {TAG_LABEL + k: v for k, v in Rates(gpu_hour=1.0).labels().items()}
    started = int((time.time() - 3600) * 1000)
    apps = []
    for i in range(jobs):
        job = container_job(f"j{i}", name=f"app-{i}", tags=tags, startedAt=started)
        job["container"]["containerInstanceArn"] = ARN.format(i)
        batch.jobs[job["jobId"]] = job
        apps.append(f"q1:app-{i}")
        sched.adopt_native_id(apps[-1], job["jobId"])
    times, all_known = [], None
    for r in range(rounds):
        began = time.perf_counter()
        futures = [sched.describe_future_as(app, lambda d: d) for app in apps]
        described = [f.result(timeout=60) for f in futures if f is not None]
        times.append(time.perf_counter() - began)
        now = time.time()
        so_far = [d.usage_so_far for d in described if d is not None]
        if all_known is None and all(u is not None and u.cost_so_far(now) is not None for u in so_far):
            all_known = r + 1
        time.sleep(0.2)
    return {"round_ms": statistics.median(times) * 1000, "calls": calls, "known_after": all_known}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    print(f"{args.jobs} running Batch jobs, {args.rounds} rounds of looks")
    print("| pricing | look round p50 ms | AWS pricing calls per job | rounds until every cost so far known |")
    print("| --- | --- | --- | --- |")
    for priced in (False, True):
        got = run(args.jobs, args.rounds, priced)
        per_job = sum(got["calls"].values()) / args.jobs
        name = "on (no rates)" if priced else "off (rates given)"
        known = got["known_after"] if priced else "- (the runner prices at the rates)"
        print(f"| {name} | {got['round_ms']:.1f} | {per_job:.2f} {dict(got['calls'])} | {known} |")


if __name__ == "__main__":
    main()
