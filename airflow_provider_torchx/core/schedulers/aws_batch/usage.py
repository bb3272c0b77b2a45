"""A Batch job's usage summary from its ``DescribeJobs`` entries (see ``core/usage.py``).

Pure functions over the shapes of the AWS API reference (``JobDetail``): the job's
``createdAt``/``startedAt``/``stoppedAt`` (epoch milliseconds) and ``attempts[]`` (each with
``startedAt``, ``stoppedAt``, ``container.exitCode``/``reason`` and ``statusReason``). Both job
shapes: a multi-node job (``nodeProperties``), whose nodes are its child jobs ``jobId#N``,
each with its own attempts; and a single-node ``container`` job, whose one replica is the job.
Where a node's child job is not known (moto models none), the node is taken to have run as
long as its parent job ran, which is what a multi-node job's nodes do. A job on EKS has
``eksAttempts`` instead (read through ``eks.as_ecs_shape``).

Given a ``Price`` (``pricing.AttemptPricer.price`` or ``price_soon``), each attempt carries
AWS's price for it (``Attempt.price_per_hour``): an ended one over its window, an open one at the
price now (what a live job's cost so far counts); one that cannot be priced carries what is
missing (``Attempt.no_price``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from airflow_provider_torchx.core.schedulers.aws_batch.eks import as_ecs_shape
from airflow_provider_torchx.core.schedulers.aws_batch.render import node_ranges
from airflow_provider_torchx.core.schedulers.aws_batch.status import epoch_seconds
from airflow_provider_torchx.core.specs import NULL_RESOURCE, Resource, Role
from airflow_provider_torchx.core.usage import Attempt, Usage, compute_usage

#: US dollars per hour of an attempt: (the job entry it belongs to, its attempt detail,
#: its number, the resource its replica reserved) to a price; where it cannot be priced, what
#: is missing (a ``str``); None: not priced yet.
Price = Callable[[Mapping[str, Any], Mapping[str, Any], int, Resource], float | str | None]


def _reason(entry: Mapping[str, Any]) -> str:
    return str(entry.get("statusReason") or (entry.get("container") or {}).get("reason") or "")


def _exit_code(entry: Mapping[str, Any]) -> int | None:
    code = (entry.get("container") or {}).get("exitCode")
    return None if code is None else int(code)


def replica_attempts(
    role: str,
    replica: int,
    entry: Mapping[str, Any],
    price: Price | None = None,
    resource: Resource = NULL_RESOURCE,
) -> list[Attempt]:
    """The runs of one replica from its job entry: its ``attempts`` that started, else (none
    listed yet) the entry's own ``startedAt``/``stoppedAt`` as one run. The last run's exit
    code, where its attempt leaves it out (moto), is the entry's ``container.exitCode``. With
    ``price``, each run is priced for ``resource``, what the replica reserved."""
    runs = [a for a in entry.get("attempts") or [] if a.get("startedAt") is not None] or (
        [entry] if entry.get("startedAt") is not None else []
    )
    attempts = []
    for n, run in enumerate(runs, start=1):
        priced = None if price is None else price(entry, run, n, resource)
        attempts.append(
            Attempt(
                role=role,
                replica=replica,
                number=n,
                started=epoch_seconds(run.get("startedAt")),
                ended=epoch_seconds(run.get("stoppedAt")),
                exit_code=_exit_code(run) if _exit_code(run) is not None or n < len(runs) else _exit_code(entry),
                reason=_reason(run),
                price_per_hour=None if isinstance(priced, str) else priced,
                no_price=priced if isinstance(priced, str) else "",
            )
        )
    return attempts


def batch_usage(
    job: Mapping[str, Any],
    nodes: Mapping[int, Mapping[str, Any]],
    roles: Sequence[Role],
    price: Price | None = None,
) -> Usage:
    """The usage of ``job`` (ended), its child jobs ``nodes`` by node index (may be empty) and
    its ``roles`` as ``describe`` rebuilt them (resources from the job's containers). A job on
    EKS counts its ``eksAttempts`` (``eks.as_ecs_shape``). ``price``: what prices its
    attempts (None: not priced here)."""
    resources = {r.name: r.resource for r in roles}
    job = as_ecs_shape(job)
    nodes = {n: as_ecs_shape(child) for n, child in nodes.items()}
    attempts = [
        attempt
        for name, first, last, _ in node_ranges(job)  # a single-node job: node 0, the job itself
        for k, node in enumerate(range(first, last + 1))
        for attempt in replica_attempts(name, k, nodes.get(node, job), price, resources.get(name, NULL_RESOURCE))
    ]
    return compute_usage(epoch_seconds(job.get("createdAt")), epoch_seconds(job.get("stoppedAt")), roles, attempts)
