"""AWS's own prices of a Batch job's attempts (``aws_batch/pricing.py``).

The pure rules one test per row; then ``AttemptPricer`` against a moto server over HTTP (no
Docker): the EC2 instances, their types and the Spot price history from moto, the ECS container
instances registered there; what moto lacks (the Price List, a Batch attempt's container
instance) through botocore's own model: the Price List client is a real boto3 client under
botocore's ``Stubber`` (each request validated against the service model, each response shaped
as the API reference shows), the Batch job entries are validated against Batch's ``JobDetail``
shape. Every AWS call is counted with botocore's ``before-call`` event.
"""

from __future__ import annotations

import json
import logging
import stat
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import botocore.session
import pytest
from botocore.stub import Stubber
from botocore.validate import validate_parameters

from airflow_provider_torchx.core.clock import Clock
from airflow_provider_torchx.core.schedulers.aws_batch import create_scheduler
from airflow_provider_torchx.core.schedulers.aws_batch.pricing import (
    ON_DEMAND_FILTERS,
    PRICE_LIST_MAX_AGE,
    AttemptPricer,
    NoPriceError,
    container_instance,
    fargate_rates,
    instance_share,
    on_demand_hourly,
    spot_average,
)
from airflow_provider_torchx.core.specs import Resource
from tests.core.aws_batch.fakes import FakeBatch, FakeLogs, container_job
from tests.fixtures.aws import REGION, MotoServer, moto_settings

pytestmark = pytest.mark.timeout(60)

P3_8X = {"InstanceType": "p3.8xlarge", "VCpuInfo": {"DefaultVCpus": 32}, "GpuInfo": {"Gpus": [{"Count": 4}]}}


def product(price: str, usagetype: str = "USE1-BoxUsage:g4dn.xlarge", unit: str = "Hrs") -> str:
    """One ``GetProducts`` ``PriceList`` item (JSON text) as the Price List reference shows it."""
    return json.dumps(
        {
            "product": {"productFamily": "Compute Instance", "attributes": {"usagetype": usagetype}, "sku": "SKU1"},
            "serviceCode": "AmazonEC2",
            "terms": {
                "OnDemand": {
                    "SKU1.JRTCKXETXF": {
                        "offerTermCode": "JRTCKXETXF",
                        "sku": "SKU1",
                        "effectiveDate": "2026-11-01T00:00:00Z",
                        "priceDimensions": {
                            "SKU1.JRTCKXETXF.6YS6EN2CT7": {
                                "unit": unit,
                                "pricePerUnit": {"USD": price},
                                "description": "$ per On Demand Linux instance hour",
                                "beginRange": "0",
                                "endRange": "Inf",
                                "rateCode": "SKU1.JRTCKXETXF.6YS6EN2CT7",
                            }
                        },
                    }
                }
            },
            "version": "20261101000000",
            "publicationDate": "2026-11-01T00:00:00Z",
        }
    )


# ---------------------------------------------------------------------------- pure rules


def test_the_container_instance_and_its_cluster_come_from_the_attempts_arn() -> None:
    arn = "arn:aws:ecs:us-east-1:123:container-instance/batch-ce_Batch_1/0a1b2c"
    assert container_instance({"container": {"containerInstanceArn": arn}}) == ("batch-ce_Batch_1", arn)


def test_an_arn_without_its_cluster_cannot_be_priced_and_says_so() -> None:
    with pytest.raises(NoPriceError, match=r"containerInstanceArn='arn:aws:ecs:us-east-1:1:container-instance/ci1'"):
        container_instance({"container": {"containerInstanceArn": "arn:aws:ecs:us-east-1:1:container-instance/ci1"}})


def test_the_share_of_an_instance_is_the_reserved_vcpu_fraction() -> None:
    assert instance_share(8.0, None, P3_8X) == 0.25


def test_the_share_is_the_gpu_fraction_when_larger() -> None:
    assert instance_share(4.0, 2.0, P3_8X) == 0.5


def test_the_share_is_at_most_the_whole_instance() -> None:
    assert instance_share(64.0, None, P3_8X) == 1.0


def test_an_instance_type_without_vcpus_cannot_be_priced() -> None:
    with pytest.raises(NoPriceError, match="no vCPUs for x1"):
        instance_share(1.0, None, {"InstanceType": "x1"})


def test_the_spot_price_is_averaged_over_the_window_by_time() -> None:
    history = [{"Timestamp": 0.0, "SpotPrice": "1.0"}, {"Timestamp": 1800.0, "SpotPrice": "3.0"}]
    assert spot_average(history, 900.0, 2700.0) == pytest.approx(2.0)  # 900 s at $1, 900 s at $3


def test_the_spot_price_in_effect_at_the_start_counts_from_the_start() -> None:
    assert spot_average([{"Timestamp": 0.0, "SpotPrice": "0.9"}], 5000.0, 8600.0) == pytest.approx(0.9)


def test_no_spot_history_cannot_be_priced() -> None:
    with pytest.raises(NoPriceError, match="DescribeSpotPriceHistory has no price"):
        spot_average([], 0.0, 10.0)


def test_the_on_demand_price_is_the_hourly_usd_of_the_product() -> None:
    assert on_demand_hourly([product("0", unit="Quantity"), product("3.06")]) == 3.06


def test_no_on_demand_hourly_price_cannot_be_priced() -> None:
    with pytest.raises(NoPriceError, match="no on-demand hourly price"):
        on_demand_hourly([product("0.0000000000")])


def test_fargate_rates_are_the_regions_vcpu_and_gb_hour_products() -> None:
    items = [
        product("0.04048", "USE1-Fargate-vCPU-Hours:perCPU"),
        product("0.01", "USE1-Fargate-ARM-vCPU-Hours:perCPU"),
        product("0.004445", "USE1-Fargate-GB-Hours"),
    ]
    assert fargate_rates(items) == (0.04048, 0.004445)


def test_fargate_without_both_rates_cannot_be_priced() -> None:
    with pytest.raises(NoPriceError, match="no Fargate vCPU-hour and GB-hour prices"):
        fargate_rates([product("0.04048", "USE1-Fargate-vCPU-Hours:perCPU")])


# ---------------------------------------------------------------------------- on moto

T0 = 1_796_000_000_000  # epoch ms of the first attempt's start


class Calls:
    """Counts every AWS call of the clients it is attached to (``before-call``)."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def attach(self, client: Any) -> Any:
        client.meta.events.register("before-call.*.*", lambda model, **_: self.names.append(model.name))
        return client


def container_instances() -> dict[str, str]:
    """A Spot g4dn.12xlarge and an on-demand g4dn.xlarge instance on the moto server of the
    environment, each registered as an ECS container instance of one cluster: their container
    instance ARNs by lifecycle."""
    ec2, ecs = boto3.client("ec2"), boto3.client("ecs")
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    spot = ec2.run_instances(
        ImageId=image,
        InstanceType="g4dn.12xlarge",
        MinCount=1,
        MaxCount=1,
        InstanceMarketOptions={"MarketType": "spot"},
    )["Instances"][0]
    ondemand = ec2.run_instances(ImageId=image, InstanceType="g4dn.xlarge", MinCount=1, MaxCount=1)["Instances"][0]
    cluster = f"batch-ce-{uuid.uuid4().hex[:8]}"
    ecs.create_cluster(clusterName=cluster)
    return {
        kind: ecs.register_container_instance(
            cluster=cluster, instanceIdentityDocument=json.dumps({"instanceId": inst["InstanceId"]})
        )["containerInstance"]["containerInstanceArn"]
        for kind, inst in (("spot", spot), ("on-demand", ondemand))
    }


@pytest.fixture(scope="module")
def moto_ec2(moto_without_docker: MotoServer) -> Iterator[dict[str, str]]:
    """``container_instances`` on the moto server without Docker."""
    with moto_settings(moto_without_docker):
        yield container_instances()


def batch_job(arns: dict[str, str]) -> dict[str, Any]:
    """A single-node job whose first attempt ran 30 min on the Spot instance until it was
    reclaimed and whose second ran 2 h on the on-demand one, validated against Batch's
    ``JobDetail`` (what moto's DescribeJobs leaves out: an attempt's container instance)."""
    job = container_job(
        "spotjob",
        status="SUCCEEDED",
        platformCapabilities=["EC2"],
        startedAt=T0,
        stoppedAt=T0 + 9_000_000,
        attempts=[
            {
                "container": {"containerInstanceArn": arns["spot"], "exitCode": 143, "taskArn": "arn:t1"},
                "startedAt": T0,
                "stoppedAt": T0 + 1_800_000,
                "statusReason": "Host EC2 (instance i-0abc) terminated.",
            },
            {
                "container": {"containerInstanceArn": arns["on-demand"], "exitCode": 0, "taskArn": "arn:t2"},
                "startedAt": T0 + 1_800_000,
                "stoppedAt": T0 + 9_000_000,
                "statusReason": "Essential container in task exited",
            },
        ],
    )
    model = botocore.session.get_session().get_service_model("batch")
    validate_parameters(job, model.shape_for("JobDetail"))
    return job


def stubbed_pricing(calls: Calls, price: str = "3.06", error: str | None = None) -> tuple[Any, Stubber]:
    """A real Price List client under a ``Stubber`` expecting one GetProducts for g4dn.xlarge."""
    client = calls.attach(
        boto3.client("pricing", region_name="us-east-1", aws_access_key_id="t", aws_secret_access_key="t")
    )
    stubber = Stubber(client)
    request = {
        "ServiceCode": "AmazonEC2",
        "Filters": [
            {"Type": "TERM_MATCH", "Field": k, "Value": v}
            for k, v in {"instanceType": "g4dn.xlarge", "regionCode": REGION, **ON_DEMAND_FILTERS}.items()
        ],
        "FormatVersion": "aws_v1",
    }
    if error:
        stubber.add_client_error(
            "get_products", service_error_code=error, http_status_code=400, expected_params=request
        )
    else:
        stubber.add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": [product(price)]}, request)
    stubber.activate()
    return client, stubber


def pricer(calls: Calls, pricing: Any, cache: Path, clock: Clock | None = None) -> AttemptPricer:
    """An ``AttemptPricer`` over moto's ECS and EC2 (the environment's endpoint) and ``pricing``."""
    made = {"pricing": pricing}

    def clients(service: str, region: str | None) -> Any:
        return made.get(service) or calls.attach(boto3.client(service, region_name=region or REGION))

    return AttemptPricer(clients, REGION, cache, **({"clock": clock} if clock else {}))


TRAINER = Resource(cpu=8, gpu=1, memMB=61440)


def test_a_reclaimed_spot_attempt_and_an_on_demand_retry_are_priced_apart(
    moto_without_docker: MotoServer, moto_ec2: dict[str, str], tmp_path: Path
) -> None:
    """Spot: a quarter of a g4dn.12xlarge (8 of 48 vCPUs, 1 of 4 GPUs) at moto's Spot price;
    on-demand: the whole g4dn.xlarge (4 vCPUs, 1 GPU) at the Price List's $3.06. Four calls
    or fewer per attempt; asking again makes none."""
    calls = Calls()
    with moto_settings(moto_without_docker):
        pricing, stubber = stubbed_pricing(calls)
        prices = pricer(calls, pricing, tmp_path)
        job = batch_job(moto_ec2)
        spot_run, ondemand_run = job["attempts"]
        spot = prices.price(job, spot_run, 1, TRAINER)
        assert spot == pytest.approx(0.25 * 0.00001)  # moto's Spot price of every type
        assert prices.price(job, ondemand_run, 2, TRAINER) == pytest.approx(3.06)
        stubber.assert_no_pending_responses()
        assert calls.names == [
            "DescribeContainerInstances",
            "DescribeInstances",
            "DescribeInstanceTypes",
            "DescribeSpotPriceHistory",
            "DescribeContainerInstances",
            "DescribeInstances",
            "DescribeInstanceTypes",
            "GetProducts",
        ]
        before = len(calls.names)
        for _ in range(5):  # further looks at the ended attempts
            assert prices.price(job, spot_run, 1, TRAINER) == spot
        assert len(calls.names) == before


def test_a_missing_permission_prices_the_attempt_na_with_one_warning(
    moto_without_docker: MotoServer, moto_ec2: dict[str, str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    calls = Calls()
    with moto_settings(moto_without_docker), caplog.at_level(logging.WARNING):
        pricing, _ = stubbed_pricing(calls, error="AccessDeniedException")
        prices = pricer(calls, pricing, tmp_path)
        job = batch_job(moto_ec2)
        for _ in range(3):
            assert prices.price(job, job["attempts"][1], 2, TRAINER) == "pricing:GetProducts: AccessDeniedException"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "AWS Batch job spotjob attempt 2: no AWS price (pricing:GetProducts: AccessDeniedException); its cost shows n/a"
    ]


def test_the_price_list_is_kept_on_disk_owner_only_for_a_day(
    moto_without_docker: MotoServer, moto_ec2: dict[str, str], tmp_path: Path
) -> None:
    """A second process within a day asks the Price List nothing; after a day it asks again."""
    calls = Calls()
    now = [1_000_000.0]
    clock = Clock(monotonic=lambda: now[0], wall=lambda: now[0])
    with moto_settings(moto_without_docker):
        job = batch_job(moto_ec2)
        run = job["attempts"][1]
        first, _ = stubbed_pricing(calls)
        assert pricer(calls, first, tmp_path, clock).price(job, run, 2, TRAINER) == pytest.approx(3.06)
        cache = tmp_path / f"{REGION}.json"
        assert stat.S_IMODE(cache.stat().st_mode) == 0o600
        now[0] += PRICE_LIST_MAX_AGE - 1
        unused, _ = stubbed_pricing(Calls())
        unused_stubber = Stubber(unused)  # no response queued: a call would fail the price
        unused_stubber.activate()
        assert pricer(calls, unused, tmp_path, clock).price(job, run, 2, TRAINER) == pytest.approx(3.06)
        now[0] += 2
        later, stubber = stubbed_pricing(calls, price="2.50")
        assert pricer(calls, later, tmp_path, clock).price(job, run, 2, TRAINER) == pytest.approx(2.50)
        stubber.assert_no_pending_responses()


def test_describe_prices_an_ended_job_once_and_the_pollers_looks_never(tmp_path: Path) -> None:
    """``describe`` prices each ended attempt through the scheduler's pricer (rates absent);
    a look for the poller's futures does not."""
    batch = FakeBatch()
    sched = create_scheduler("s", client=batch, log_client=FakeLogs())
    asked: list[tuple[str, int]] = []

    class Pricer:
        def price(self, job: Any, run: Any, number: int, resource: Resource) -> float | None:
            asked.append((job["jobId"], number))
            return 2.0

    sched.pricer = Pricer()  # type: ignore[assignment]
    run = {"container": {"exitCode": 0}, "startedAt": T0, "stoppedAt": T0 + 3_600_000}
    batch.jobs["c1"] = container_job("c1", status="SUCCEEDED", startedAt=T0, stoppedAt=T0 + 3_600_000, attempts=[run])
    usage = sched.describe("q1:app-1").usage  # type: ignore[union-attr]
    assert usage is not None and usage.cost_usd == pytest.approx(2.0) and asked == [("c1", 1)]
    look = sched.describe_future_as("q1:app-1", lambda d: d)
    assert look is not None and look.result(timeout=10).usage.cost_usd is None  # type: ignore[union-attr]
    assert asked == [("c1", 1)]


# ---------------------------------------------------------------------------- running attempts


def running_job(arn: str, started_ms: int, job_id: str = "live1") -> dict[str, Any]:
    """A single-node job running its first attempt on the container instance ``arn`` (a running
    attempt is not in ``attempts`` yet: the job's own ``container`` and ``startedAt`` are it),
    validated against Batch's ``JobDetail``."""
    job = container_job(job_id, status="RUNNING", platformCapabilities=["EC2"], startedAt=started_ms)
    job["container"] = {**job["container"], "containerInstanceArn": arn, "taskArn": "arn:t3"}
    validate_parameters(job, botocore.session.get_session().get_service_model("batch").shape_for("JobDetail"))
    return job


def test_a_running_spot_attempt_is_priced_now_and_apart_from_its_ended_price(
    moto_without_docker: MotoServer, moto_ec2: dict[str, str], tmp_path: Path
) -> None:
    """Running: the latest Spot price at or before now, asked once however often it is looked
    at; ended, the same attempt is priced again over its window (its own key)."""
    calls = Calls()
    with moto_settings(moto_without_docker):
        prices = pricer(calls, stubbed_pricing(calls)[0], tmp_path)
        job = running_job(moto_ec2["spot"], T0)
        for _ in range(5):
            assert prices.price(job, job, 1, TRAINER) == pytest.approx(0.25 * 0.00001)
        assert calls.names == [
            "DescribeContainerInstances",
            "DescribeInstances",
            "DescribeInstanceTypes",
            "DescribeSpotPriceHistory",
        ]
        ended = {**job, "status": "SUCCEEDED", "stoppedAt": T0 + 600_000}
        assert prices.price(ended, ended, 1, TRAINER) == pytest.approx(0.25 * 0.00001)
        assert calls.names[4:] == ["DescribeContainerInstances", "DescribeInstances", "DescribeSpotPriceHistory"]


def live_scheduler(prices: AttemptPricer, job: dict[str, Any]) -> Any:
    """A scheduler over a fake Batch holding ``job`` (app ``q1:app-1``, id known), pricing with ``prices``."""
    batch = FakeBatch()
    batch.jobs[job["jobId"]] = job
    sched = create_scheduler("s", client=batch, log_client=FakeLogs())
    sched.pricer = prices
    sched.adopt_native_id("q1:app-1", job["jobId"])
    return sched


def look(sched: Any) -> Any:
    """One look for the poller's futures (what a watcher's guards read)."""
    future = sched.describe_future_as("q1:app-1", lambda d: d)
    assert future is not None
    return future.result(timeout=10)


def test_max_cost_sees_a_running_batch_job_priced_by_aws_with_a_handful_of_calls(
    moto_without_docker: MotoServer, moto_ec2: dict[str, str], tmp_path: Path
) -> None:
    """No rates: the first look hands the pricing off (cost so far unknown), a later look sees
    its share (1 of 4 vCPUs) of the on-demand instance's $3.06/h over the hour it has run: over a
    $0.50 budget. Four AWS calls
    for the attempt, none for the looks after."""
    calls = Calls()
    with moto_settings(moto_without_docker):
        pricing, stubber = stubbed_pricing(calls)
        started = time.time() - 3600.0
        sched = live_scheduler(
            pricer(calls, pricing, tmp_path), running_job(moto_ec2["on-demand"], int(started * 1000))
        )
        first = look(sched).usage_so_far
        assert first is not None and first.cost_so_far(time.time()) is None
        deadline = time.monotonic() + 20
        while (usage := look(sched).usage_so_far) is None or usage.cost_so_far(time.time()) is None:
            assert time.monotonic() < deadline, "the running attempt was never priced"
            time.sleep(0.05)
        spent = usage.cost_so_far(time.time())
        assert spent == pytest.approx(0.25 * 3.06, rel=0.01) and spent > 0.5  # what max_cost=0.5 holds it to
        stubber.assert_no_pending_responses()
        before = list(calls.names)
        for _ in range(10):
            look(sched)
        assert (
            calls.names
            == before
            == ["DescribeContainerInstances", "DescribeInstances", "DescribeInstanceTypes", "GetProducts"]
        )


def test_a_look_never_waits_for_the_pricing_and_an_unpriced_attempt_is_na_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The pricing's calls hang: looks still answer at once (cost so far unknown, nothing known
    missing); once the calls fail, the attempt stays n/a, saying what is missing, with one
    warning and no more calls."""
    release, made = threading.Event(), []

    def clients(service: str, region: str | None) -> Any:
        made.append(service)
        release.wait(30)
        raise_denied = Stubber(
            boto3.client("ecs", region_name=REGION, aws_access_key_id="t", aws_secret_access_key="t")
        )
        raise_denied.add_client_error("describe_container_instances", service_error_code="AccessDeniedException")
        raise_denied.activate()
        return raise_denied.client

    arn = f"arn:aws:ecs:{REGION}:123456789012:container-instance/ce1/abc"
    sched = live_scheduler(AttemptPricer(clients, REGION, tmp_path), running_job(arn, T0))
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            began = time.monotonic()
            usage = look(sched).usage_so_far
            assert time.monotonic() - began < 5 and usage.cost_so_far(time.time()) is None
            assert [a.no_price for a in usage.attempts] == [""]  # not priced yet: nothing known missing
        release.set()
        deadline = time.monotonic() + 20
        while not [r for r in caplog.records if r.levelno == logging.WARNING]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        for _ in range(3):
            usage = look(sched).usage_so_far
            assert usage.cost_so_far(time.time()) is None
            assert [a.no_price for a in usage.attempts] == ["ecs:DescribeContainerInstances: AccessDeniedException"]
    assert made == ["ecs"]
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        "AWS Batch job live1 attempt 1: no AWS price (ecs:DescribeContainerInstances: AccessDeniedException); "
        "its cost shows n/a"
    ]


def test_attempts_are_priced_side_by_side_and_an_attempt_being_priced_is_waited_for(tmp_path: Path) -> None:
    """A thousand jobs ending together are not priced one after another: two attempts' calls
    run at once; a second caller of an attempt being priced waits for its answer (one call)."""
    from botocore.exceptions import ClientError

    both_inside, gate, asked = threading.Barrier(2, timeout=10), threading.Event(), []

    class Ecs:
        def describe_container_instances(self, cluster: str, containerInstances: list[str]) -> dict[str, Any]:
            asked.append(containerInstances[0])
            if containerInstances[0].endswith("/gated"):
                gate.wait(10)
            else:
                both_inside.wait()  # broken (an error) unless the other pricing is in its call too
            raise ClientError({"Error": {"Code": "AccessDenied"}}, "DescribeContainerInstances")

    pricer = AttemptPricer(lambda service, region: Ecs(), REGION, tmp_path)
    arn = f"arn:aws:ecs:{REGION}:123456789012:container-instance/ce1/"

    def price(job_id: str, instance: str, out: list[float | str]) -> threading.Thread:
        job = running_job(arn + instance, T0, job_id)  # its running attempt: the job itself
        thread = threading.Thread(target=lambda: out.append(pricer.price(job, job, 1, TRAINER)))
        thread.start()
        return thread

    answers: list[float | str] = []
    for thread in [price("a", "a", answers), price("b", "b", answers)]:
        thread.join(15)
    assert answers == ["ecs:DescribeContainerInstances: AccessDenied"] * 2 and sorted(asked) == [arn + "a", arn + "b"]

    first: list[float | str] = []
    second: list[float | str] = []
    threads = [price("c", "gated", first)]
    deadline = time.monotonic() + 10
    while asked[-1:] != [arn + "gated"]:  # the first caller is in its call
        assert time.monotonic() < deadline
        time.sleep(0.01)
    threads.append(price("c", "gated", second))
    time.sleep(0.2)  # the second caller is waiting, not calling
    assert not second and asked.count(arn + "gated") == 1
    gate.set()
    for thread in threads:
        thread.join(15)
    assert first == second == ["ecs:DescribeContainerInstances: AccessDenied"] and asked.count(arn + "gated") == 1
