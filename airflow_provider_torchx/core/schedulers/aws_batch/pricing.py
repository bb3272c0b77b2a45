"""AWS's own prices for a Batch job's attempts, when the job carries no rates (rates given by
the user win: ``core/rates.py``).

An attempt on EC2 costs its share of the instance it ran on: the attempt's
``container.containerInstanceArn`` leads (ECS ``DescribeContainerInstances``) to the EC2
instance, whose ``DescribeInstances`` entry says its type, Spot or on-demand
(``InstanceLifecycle``) and zone; its hourly price is the Spot price history's average over the
attempt's window (``DescribeSpotPriceHistory``) or the Price List's on-demand price
(``GetProducts``, Linux, shared tenancy); the job's share is what it reserved of the instance's
vCPUs and GPUs (``DescribeInstanceTypes``), the larger of the two fractions. An attempt on
Fargate costs the vCPUs and GiB it reserved at Fargate's on-demand Linux/x86 rates (``GetProducts``
of ``AmazonECS``).

An attempt still running is priced at the price now: the latest Spot price at or before now, or
the same on-demand and Fargate prices; it is kept apart from the same attempt's price once ended
(which averages the Spot price over its window).

The rules are pure functions over the shapes of the AWS API reference; ``AttemptPricer`` makes
the calls, prices an attempt once while it runs and once when it ended (memory, by job id,
attempt number and whether it ended) and keeps the Price List's answers on disk per region for
a day. An attempt it cannot price (a permission missing, no data) is what is missing (a ``str``),
with one warning naming it. The status poller's looks price off their thread
(``AttemptPricer.price_soon``): one blocked AWS call must not hold every watched job's look.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from airflow_provider_torchx.core.clock import SYSTEM_CLOCK, Clock
from airflow_provider_torchx.core.schedulers.aws_batch.eks import is_eks_job
from airflow_provider_torchx.core.specs import Resource

log = logging.getLogger(__name__)

#: How long the Price List's answers are kept on disk (seconds): AWS changes prices rarely.
PRICE_LIST_MAX_AGE = 86400.0
#: The region serving the Price List API.
PRICE_LIST_REGION = "us-east-1"
#: The Price List filters of an EC2 instance's on-demand Linux price (with its type and region).
ON_DEMAND_FILTERS = {"operatingSystem": "Linux", "tenancy": "Shared", "preInstalledSw": "NA", "capacitystatus": "Used"}
#: The ``usagetype`` endings of Fargate's Linux/x86 on-demand vCPU-hour and GB-hour prices.
FARGATE_VCPU_USAGE, FARGATE_GB_USAGE = "Fargate-vCPU-Hours:perCPU", "Fargate-GB-Hours"
#: Attempts whose price is remembered (the oldest forgotten first): a long-lived process's
#: memory stays flat.
MAX_REMEMBERED = 10_000
#: Threads pricing attempts for the looks (``AttemptPricer.price_soon``), shared by every pricer
#: of the process: pricing is rare (once per attempt) and its calls are short.
PRICING_THREADS = 2

_executor_lock = threading.Lock()
_executor: concurrent.futures.ThreadPoolExecutor | None = None


def _pricing_executor() -> concurrent.futures.ThreadPoolExecutor:
    """The process's pricing threads (made on first use)."""
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = concurrent.futures.ThreadPoolExecutor(PRICING_THREADS, thread_name_prefix="torchx-aws-price")
        return _executor


class NoPriceError(Exception):
    """An attempt cannot be priced; the message names what is missing."""


# ---------------------------------------------------------------------------- pure rules


def is_fargate(job: Mapping[str, Any]) -> bool:
    """Whether ``job`` runs on Fargate (its ``platformCapabilities``)."""
    return "FARGATE" in (job.get("platformCapabilities") or [])


def container_instance(run: Mapping[str, Any]) -> tuple[str, str]:
    """The ECS cluster and container instance ARN an attempt ran on (its
    ``container.containerInstanceArn``: ``arn:...:container-instance/CLUSTER/ID``)."""
    arn = str((run.get("container") or {}).get("containerInstanceArn") or "")
    parts = arn.split(":", 5)[-1].split("/")
    if len(parts) != 3 or parts[0] != "container-instance":
        raise NoPriceError(f"the attempt names no container instance with its cluster (containerInstanceArn={arn!r})")
    return parts[1], arn


def instance_share(vcpus: float | None, gpus: float | None, instance_type: Mapping[str, Any]) -> float:
    """The share of an instance of ``instance_type`` (a ``DescribeInstanceTypes`` entry) a job
    reserving ``vcpus`` and ``gpus`` takes: the larger of its vCPU and GPU fractions, at most 1."""
    total_vcpus = float((instance_type.get("VCpuInfo") or {}).get("DefaultVCpus") or 0)
    total_gpus = float(sum(g.get("Count", 0) for g in (instance_type.get("GpuInfo") or {}).get("Gpus") or []))
    if total_vcpus <= 0:
        raise NoPriceError(f"DescribeInstanceTypes gives no vCPUs for {instance_type.get('InstanceType')}")
    fractions = [(vcpus or 0.0) / total_vcpus] + ([(gpus or 0.0) / total_gpus] if total_gpus > 0 else [])
    return min(1.0, max(fractions))


def spot_average(history: Sequence[Mapping[str, Any]], start: float, end: float) -> float:
    """The Spot price (US dollars per hour) averaged over ``start``..``end`` (epoch seconds)
    from ``DescribeSpotPriceHistory`` entries (``Timestamp``: a datetime or epoch seconds,
    ``SpotPrice``): each price counts from its timestamp until the next one; the window
    opens at the price in effect at ``start`` (the earliest one given, if none is older)."""
    points = sorted((_epoch(h["Timestamp"]), float(h["SpotPrice"])) for h in history)
    if not points:
        raise NoPriceError("DescribeSpotPriceHistory has no price for the attempt's window")
    if end <= start:
        return next((p for t, p in reversed(points) if t <= start), points[0][1])
    total = 0.0
    for i, (t, price) in enumerate(points):
        until = points[i + 1][0] if i + 1 < len(points) else end
        lo, hi = (start if i == 0 else max(start, t)), min(end, until)
        total += price * max(0.0, hi - lo)
    return total / (end - start)


def on_demand_hourly(price_list: Iterable[str]) -> float:
    """The on-demand price per hour (US dollars) of the first product in ``price_list``
    (``GetProducts``' ``PriceList``: JSON text, ``terms.OnDemand.*.priceDimensions.*`` with
    ``unit`` ``Hrs`` and ``pricePerUnit.USD``) that has one above zero."""
    for item in price_list:
        for term in ((json.loads(item).get("terms") or {}).get("OnDemand") or {}).values():
            for dim in (term.get("priceDimensions") or {}).values():
                usd = float((dim.get("pricePerUnit") or {}).get("USD") or 0)
                if dim.get("unit") == "Hrs" and usd > 0:
                    return usd
    raise NoPriceError("GetProducts lists no on-demand hourly price")


def fargate_rates(price_list: Iterable[str]) -> tuple[float, float]:
    """Fargate's on-demand Linux/x86 US dollars per vCPU-hour and per GB-hour, from the
    ``AmazonECS`` products of ``price_list`` whose ``usagetype`` ends as ``FARGATE_VCPU_USAGE``
    and ``FARGATE_GB_USAGE`` (the region's prefix before them)."""
    found: dict[str, float] = {}
    for item in price_list:
        usage = str(((json.loads(item).get("product") or {}).get("attributes") or {}).get("usagetype", ""))
        for suffix in (FARGATE_VCPU_USAGE, FARGATE_GB_USAGE):
            if usage == suffix or usage.endswith("-" + suffix):
                found.setdefault(suffix, on_demand_hourly([item]))
    if len(found) < 2:
        raise NoPriceError("GetProducts lists no Fargate vCPU-hour and GB-hour prices")
    return found[FARGATE_VCPU_USAGE], found[FARGATE_GB_USAGE]


def _epoch(value: Any) -> float:
    return float(value.timestamp()) if hasattr(value, "timestamp") else float(value)


# ---------------------------------------------------------------------------- the calls

#: Makes a client of a service (``"ecs"``, ``"ec2"``, ``"pricing"``) in a region (None: the
#: scheduler's).
ClientMaker = Callable[[str, str | None], Any]


class AttemptPricer:
    """Prices a Batch job's attempts with AWS's prices (see the module docstring): each once
    while it runs and once when it ended, kept in memory by job id, attempt number and whether
    it ended, an attempt it cannot price included (what is missing, after one warning). Thread-safe:
    attempts are priced side by side, each once; ``price`` blocks (it calls AWS), ``price_soon``
    never does."""

    def __init__(self, clients: ClientMaker, region: str, cache_dir: Path, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clients, self._region, self._clock = clients, region, clock
        self._cache_file = cache_dir / f"{region}.json"
        self._made: dict[str, Any] = {}
        self._types: dict[str, dict[str, Any]] = {}
        self._prices: dict[tuple[str, int, bool], float | str] = {}
        self._pending: set[tuple[str, int, bool]] = set()
        #: The attempts being priced now, each with what its waiters wait on.
        self._pricing: dict[tuple[str, int, bool], threading.Event] = {}
        #: ``_prices``, ``_pending`` and ``_pricing``: held only to read or write them, never over a call.
        self._lock = threading.Lock()
        #: Held while a client is made (a boto3 session is not thread-safe), never over a call.
        self._making = threading.Lock()

    @staticmethod
    def _key(job: Mapping[str, Any], run: Mapping[str, Any], number: int) -> tuple[str, int, bool]:
        return str(job.get("jobId")), number, run.get("stoppedAt") is not None

    def price(self, job: Mapping[str, Any], run: Mapping[str, Any], number: int, resource: Resource) -> float | str:
        """US dollars per hour of attempt ``number`` (``run``: its ``AttemptDetail``) of
        ``job`` (its ``DescribeJobs`` entry, a node's child job for a multi-node job's node)
        reserving ``resource``: over its window once it ended, at the price now while it runs;
        a ``str``, what is missing: it cannot be priced (warned once)."""
        key = self._key(job, run, number)
        while True:  # attempts are priced side by side, each once: a second caller waits for the first
            with self._lock:
                if key in self._prices:
                    return self._prices[key]
                busy = self._pricing.get(key)
                if busy is None:
                    self._pricing[key] = done = threading.Event()
                    break
            busy.wait()
        try:
            value: float | str = self._price(job, run, resource)
        except NoPriceError as missing:
            log.warning("AWS Batch job %s attempt %d: no AWS price (%s); its cost shows n/a", *key[:2], missing)
            value = str(missing)
        except BaseException:  # unforeseen: a waiter tries again
            with self._lock:
                self._pricing.pop(key, None)
            done.set()
            raise
        self._remember(key, value)
        done.set()
        return value

    def _remember(self, key: tuple[str, int, bool], value: float | str) -> None:
        """Keep the attempt's price; it is no longer being priced."""
        with self._lock:
            self._pricing.pop(key, None)
            self._prices[key] = value
            if len(self._prices) > MAX_REMEMBERED:
                self._prices.pop(next(iter(self._prices)))

    def price_soon(
        self, job: Mapping[str, Any], run: Mapping[str, Any], number: int, resource: Resource
    ) -> float | str | None:
        """``price``'s answer if it is known, else None (not priced yet) after handing the
        pricing to the process's pricing threads, once per attempt: the status poller's looks
        call this on the poller's own thread, which no AWS call may hold."""
        key = self._key(job, run, number)
        with self._lock:
            if key in self._prices:
                return self._prices[key]
            if key in self._pending:
                return None
            self._pending.add(key)
        _pricing_executor().submit(self._price_later, job, run, number, resource, key)
        return None

    def _price_later(
        self,
        job: Mapping[str, Any],
        run: Mapping[str, Any],
        number: int,
        resource: Resource,
        key: tuple[str, int, bool],
    ) -> None:
        """``price`` on a pricing thread; anything unforeseen is n/a with a warning, never raised
        into the executor where no one would see it."""
        try:
            self.price(job, run, number, resource)
        except Exception as err:
            log.warning("AWS Batch job %s attempt %d: pricing failed; its cost shows n/a", *key[:2], exc_info=True)
            self._remember(key, f"pricing failed: {type(err).__name__}")
        finally:
            with self._lock:
                self._pending.discard(key)

    def _price(self, job: Mapping[str, Any], run: Mapping[str, Any], resource: Resource) -> float:
        vcpus = None if resource.cpu < 0 else float(resource.cpu)
        if is_eks_job(job):
            raise NoPriceError("a job on EKS runs on nodes AWS Batch does not name; give rates to price it")
        if is_fargate(job):
            vcpu_hour, gb_hour = self._fargate_rates()
            return (vcpus or 0.0) * vcpu_hour + max(0.0, resource.memMB / 1024.0) * gb_hour
        cluster, arn = container_instance(run)
        found = self._call("ecs", "describe_container_instances", cluster=cluster, containerInstances=[arn])
        ec2_id = next((c.get("ec2InstanceId") for c in found.get("containerInstances") or []), None)
        if not ec2_id:
            raise NoPriceError(f"ecs:DescribeContainerInstances does not know {arn}")
        reservations = self._call("ec2", "describe_instances", InstanceIds=[ec2_id]).get("Reservations") or []
        instance = next((i for r in reservations for i in r.get("Instances") or []), None)
        if instance is None:
            raise NoPriceError(f"ec2:DescribeInstances does not know {ec2_id}")
        itype, zone = str(instance["InstanceType"]), str((instance.get("Placement") or {}).get("AvailabilityZone"))
        share = instance_share(vcpus, None if resource.gpu < 0 else float(resource.gpu), self._instance_type(itype))
        if instance.get("InstanceLifecycle") == "spot":
            if run.get("stoppedAt") is None:  # running: the price in effect now
                start = end = self._clock.wall()
            else:
                start, end = float(run["startedAt"]) / 1000.0, float(run["stoppedAt"]) / 1000.0
            history = self._call(
                "ec2",
                "describe_spot_price_history",
                InstanceTypes=[itype],
                AvailabilityZone=zone,
                ProductDescriptions=["Linux/UNIX"],
                StartTime=start,
                EndTime=end,
            ).get("SpotPriceHistory", [])
            return share * spot_average(history, start, end)
        return share * self._on_demand(itype)

    def _instance_type(self, itype: str) -> dict[str, Any]:
        if itype not in self._types:
            found = self._call("ec2", "describe_instance_types", InstanceTypes=[itype]).get("InstanceTypes") or []
            if not found:
                raise NoPriceError(f"ec2:DescribeInstanceTypes does not know {itype}")
            self._types[itype] = found[0]
        return self._types[itype]

    def _on_demand(self, itype: str) -> float:
        key = f"AmazonEC2/{itype}"
        cached = self._cached(key)
        if cached is None:
            filters = {"instanceType": itype, "regionCode": self._region, **ON_DEMAND_FILTERS}
            cached = [on_demand_hourly(self._products("AmazonEC2", filters))]
            self._keep(key, cached)
        return cached[0]

    def _fargate_rates(self) -> tuple[float, float]:
        cached = self._cached("AmazonECS/Fargate")
        if cached is None:
            cached = list(fargate_rates(self._products("AmazonECS", {"regionCode": self._region})))
            self._keep("AmazonECS/Fargate", cached)
        return cached[0], cached[1]

    def _products(self, service: str, filters: Mapping[str, str]) -> list[str]:
        """Every ``PriceList`` item of ``GetProducts`` for ``service`` matching ``filters``."""
        items: list[str] = []
        token: str | None = None
        while True:
            page = self._call(
                "pricing",
                "get_products",
                ServiceCode=service,
                Filters=[{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in filters.items()],
                FormatVersion="aws_v1",
                **({"NextToken": token} if token else {}),
            )
            items += page.get("PriceList") or []
            token = page.get("NextToken")
            if not token:
                return items

    def _call(self, service: str, operation: str, **kwargs: Any) -> dict[str, Any]:
        """``operation`` of ``service``'s client; an AWS error as ``NoPriceError`` naming the IAM
        action (``ec2:DescribeInstances``) and the error code."""
        from botocore.exceptions import BotoCoreError, ClientError

        with self._making:
            if service not in self._made:
                self._made[service] = self._clients(service, PRICE_LIST_REGION if service == "pricing" else None)
            client = self._made[service]
        try:
            return dict(getattr(client, operation)(**kwargs))
        except ClientError as err:
            action = "".join(w.title() for w in operation.split("_"))
            raise NoPriceError(f"{service}:{action}: {err.response.get('Error', {}).get('Code', err)}") from err
        except BotoCoreError as err:
            raise NoPriceError(f"{service}: {err}") from err

    def _cached(self, key: str) -> list[float] | None:
        """The Price List's answer for ``key`` on disk, if younger than ``PRICE_LIST_MAX_AGE``."""
        try:
            entry = json.loads(self._cache_file.read_text()).get(key)
        except (OSError, ValueError, AttributeError):
            return None
        if not entry or self._clock.wall() - float(entry["at"]) > PRICE_LIST_MAX_AGE:
            return None
        return [float(v) for v in entry["prices"]]

    def _keep(self, key: str, prices: list[float]) -> None:
        """Keep ``prices`` for ``key`` on disk (owner-only); a cache that cannot be written
        is only slower."""
        try:
            self._cache_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            try:
                held = json.loads(self._cache_file.read_text())
            except (OSError, ValueError):
                held = {}
            held = held if isinstance(held, dict) else {}
            held[key] = {"prices": prices, "at": self._clock.wall()}
            tmp = self._cache_file.with_name(f".{self._cache_file.name}.{os.getpid()}.{threading.get_ident()}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as out:
                json.dump(held, out)
            os.replace(tmp, self._cache_file)
        except OSError as err:
            log.debug("AWS price cache %s not written: %s", self._cache_file, err)
