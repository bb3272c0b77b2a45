"""How many DescribeJobs calls 200 watched AWS Batch jobs cost, batched vs one call per job.

Runs against a moto server of its own on loopback. Each job depends on a job id that never
finishes, so moto keeps it PENDING (no containers) for as long as the benchmark watches it.

Phases, all in this process, each watcher a thread polling every ``--interval`` seconds:
1. reference: every watcher calls ``DescribeJobs`` for its own job (what a trigger without
   a shared poller does): 1 call per job per poll round;
2. ours: every watcher calls ``AWSBatchScheduler.describe`` on its own scheduler instance
   (as Airflow triggers do) from a fresh process state: the first call of each looks the app
   id up with ``ListJobs`` (counted), then the shared poller batches DescribeJobs.
Every Batch call is counted through botocore's event hooks. Then the jobs are cancelled
through the scheduler and the watchers see them end.

    python benchmarks/batch_poller.py [--jobs 200] [--seconds 8] [--interval 1]
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import os
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import boto3

from airflow_provider_torchx.core.schedulers.aws_batch import create_scheduler
from airflow_provider_torchx.core.schedulers.aws_batch.render import queue_name
from airflow_provider_torchx.core.specs import AppDef, AppState, Resource, Role
from tests.fixtures.aws import FAKE_CREDS, REGION, MotoServer, services_env


class CallCounter:
    """Counts Batch API calls by operation name (every call, lookups included)."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def __call__(self, model: Any, **_: Any) -> None:
        with self._lock:
            self.counts[model.name] += 1

    def attach(self, client: Any) -> Any:
        client.meta.events.register("before-call.batch.*", self)
        return client

    def take(self) -> collections.Counter[str]:
        with self._lock:
            out, self.counts = self.counts, collections.Counter()
            return out


def setup_queue(url: str, name: str = "bench-q") -> str:
    """Job queue ``name`` on an UNMANAGED compute environment (made once per server)."""
    iam = boto3.client("iam", endpoint_url=url)
    batch = boto3.client("batch", endpoint_url=url)
    envs = batch.describe_compute_environments(computeEnvironments=["bench-ce"])["computeEnvironments"]
    if envs:
        env = envs[0]["computeEnvironmentArn"]
    else:
        arn = iam.create_role(RoleName="bench", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
        env = batch.create_compute_environment(
            computeEnvironmentName="bench-ce", type="UNMANAGED", state="ENABLED", serviceRole=arn
        )["computeEnvironmentArn"]
    batch.create_job_queue(
        jobQueueName=name,
        state="ENABLED",
        priority=1,
        computeEnvironmentOrder=[{"order": 1, "computeEnvironment": env}],
    )
    return name


def submit_pending_jobs(
    url: str, queue: str, n: int, threads: int = 8, labels: Mapping[str, str] | None = None
) -> list[tuple[str, str]]:
    """``n`` jobs rendered by the scheduler (with ``labels``), submitted depending on a job
    that never ends. The jobs differ only in their names, so they share the first one's job
    definition (one ``RegisterJobDefinition``: moto looks a definition's revisions up by
    scanning them all); the submits go ``threads`` at a time."""
    sched = create_scheduler("bench", client=boto3.client("batch", endpoint_url=url))
    batch = boto3.client("batch", endpoint_url=url)
    app = AppDef("bench", roles=[Role("main", image="busybox:local", entrypoint="true", resource=Resource(1, 0, 64))])
    jobs = [sched.submit_dryrun(app, {"queue": queue}, labels).request for _ in range(n)]
    arn = batch.register_job_definition(**jobs[0].job_def)["jobDefinitionArn"] if jobs else ""

    def submit(job: Any) -> tuple[str, str]:
        resp = batch.submit_job(jobDefinition=arn, dependsOn=[{"jobId": "never-finishes"}], **job.submit_request())
        return f"{queue_name(queue)}:{job.name}", resp["jobId"]

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        return list(pool.map(submit, jobs))


def watch(n: int, seconds: float, interval: float, poll: Any) -> float:
    """``n`` threads each calling ``poll(i)`` every ``interval`` seconds for ``seconds``."""
    stop = time.monotonic() + seconds
    barrier = threading.Barrier(n)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        barrier.wait()
        try:
            while time.monotonic() < stop:
                poll(i)
                time.sleep(interval)
        except BaseException as err:  # reported below
            errors.append(err)

    started = time.monotonic()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args()
    os.environ.update(FAKE_CREDS, AWS_DEFAULT_REGION=REGION)
    os.environ.pop("AWS_ENDPOINT_URL", None)
    server = MotoServer(docker_host=services_env().get("DOCKER_HOST")).start()
    try:
        url = server.url
        queue = setup_queue(url)
        t0 = time.monotonic()
        jobs = submit_pending_jobs(url, queue, args.jobs)
        print(f"submitted {len(jobs)} jobs in {time.monotonic() - t0:.1f}s (kept PENDING by a dependency)")

        counter = CallCounter()
        naive_client = counter.attach(boto3.client("batch", endpoint_url=url))

        def naive(i: int) -> None:
            naive_client.describe_jobs(jobs=[jobs[i][1]])

        wall = watch(len(jobs), args.seconds, args.interval, naive)
        ref = counter.take()
        ref_rounds = ref["DescribeJobs"] / len(jobs)
        print(
            f"reference (1 DescribeJobs per watcher poll): {ref['DescribeJobs']} calls in {wall:.1f}s, "
            f"~{ref_rounds:.1f} poll rounds -> {ref['DescribeJobs'] / ref_rounds:.0f} calls per round"
        )

        shared_client = counter.attach(boto3.client("batch", endpoint_url=url))
        scheds = [create_scheduler("bench", client=shared_client) for _ in jobs]
        states: collections.Counter[str] = collections.Counter()
        lock = threading.Lock()

        def ours(i: int) -> None:
            desc = scheds[i].describe(jobs[i][0])
            assert desc is not None, jobs[i]
            with lock:
                states[desc.state.name] += 1

        poller = scheds[0].poller
        calls0, rounds0 = poller.calls, poller.rounds
        wall = watch(len(jobs), args.seconds, args.interval, ours)
        got = counter.take()
        rounds = poller.rounds - rounds0
        polls = sum(states.values())
        print(
            f"shared poller: {polls} describe() calls by {len(jobs)} watchers in {wall:.1f}s -> "
            f"{got['DescribeJobs']} DescribeJobs calls in {rounds} rounds = "
            f"{got['DescribeJobs'] / max(rounds, 1):.2f} per round (poller counted {poller.calls - calls0}); "
            f"ListJobs lookups (once per app id in a fresh process): {got['ListJobs']}"
        )
        print(f"states seen: {dict(states)}")
        ratio = ref["DescribeJobs"] / max(got["DescribeJobs"], 1)
        print(f"DescribeJobs calls, reference / shared poller: {ratio:.0f}x fewer with the poller")

        # Each watcher cancels its job (as on_kill would), then waits for the end.
        final: dict[int, str] = {}

        def cancel_and_wait(i: int) -> None:
            if i not in final:
                scheds[i].cancel(jobs[i][0])
            desc = scheds[i].describe(jobs[i][0])
            if desc is not None and desc.state.is_terminal():
                final[i] = desc.state.name

        t0 = time.monotonic()
        deadline = time.monotonic() + 120
        while len(final) < len(jobs) and time.monotonic() < deadline:
            watch(len(jobs), args.interval, args.interval, cancel_and_wait)
        ended = collections.Counter(final.values())
        print(
            f"cancelled and watched to the end in {time.monotonic() - t0:.1f}s: {dict(ended)}; "
            f"calls: {dict(counter.take())}"
        )
        assert ended[AppState.CANCELLED.name] == len(jobs), ended
        assert got["DescribeJobs"] / max(rounds, 1) <= 2, "more than 2 DescribeJobs calls per poll round"
    finally:
        server.stop()


if __name__ == "__main__":
    main()
