"""What a job cost: queue wait, run time and per-role resource-hours, from when each replica
really ran and what its role asked for.

Pure functions over plain records, so every scheduler turns its own records (the local
supervisor's ``state.json``, Batch's ``DescribeJobs`` entries) into ``Attempt`` values and
gets the same figures. Hours are *requested* resources times the seconds each replica ran:
what a scheduler reserves and a cloud bills, not what the process used. Memory is in GiB
(``memMB / 1024``), as Batch and the named resources count it. Priced with ``Rates``
(``core/rates.py``), the same hours give ``cost_usd``: per attempt, per role and in total.
Without rates, a scheduler may price each attempt itself (``Attempt.price_per_hour``: AWS
Batch's instance prices); a job with an attempt it could not price then has no total.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

from airflow_provider_torchx.core.rates import Rates
from airflow_provider_torchx.core.specs import Resource, Role


@dataclass(frozen=True)
class Attempt:
    """One run of one replica: when it started and ended (epoch seconds; None: unknown, e.g.
    it never started) and how it ended (exit code, the scheduler's reason)."""

    role: str
    replica: int
    number: int
    started: float | None
    ended: float | None
    exit_code: int | None = None
    reason: str = ""
    #: What this run's share of its machine cost per hour in US dollars, as its scheduler
    #: priced it (AWS's own prices, ``aws_batch/pricing.py``); None: not priced there. Rates
    #: given by the user win over it (``Usage.attempt_cost_usd``).
    price_per_hour: float | None = None
    #: What its scheduler found missing to price this run (it shows n/a, and a ``max_cost``
    #: guard cannot be held for it: ``Guards.unheld``); empty: priced, or not priced (yet).
    no_price: str = ""

    @property
    def seconds(self) -> float:
        """How long it ran (0 when it never started or its end is unknown)."""
        if self.started is None or self.ended is None:
            return 0.0
        return max(0.0, self.ended - self.started)


@dataclass(frozen=True)
class RoleUsage:
    """One role's cost: replica-seconds (``node_seconds``) and the resource-hours its request
    makes of them; None where the role asked for no amount (the null resource's ``-1``)."""

    role: str
    replicas: int
    node_seconds: float
    vcpu_hours: float | None
    gpu_hours: float | None
    memory_gb_hours: float | None
    #: GPUs, vCPUs and GiB of memory each replica asked for (None: none asked), to count a
    #: live job's open attempts and to price an attempt.
    gpus: float | None = None
    vcpus: float | None = None
    memory_gb: float | None = None

    def cost_per_hour(self, rates: Rates) -> float:
        """What one replica of this role costs per hour at ``rates``."""
        return rates.per_node_hour(self.gpus, self.vcpus, self.memory_gb)


def _hours(amount: float, node_seconds: float) -> float | None:
    return None if amount < 0 else amount * node_seconds / 3600.0


def role_usage(role: str, replicas: int, resource: Resource, attempts: Sequence[Attempt]) -> RoleUsage:
    """The cost of ``role`` from its ``attempts`` and the ``resource`` each replica asked for."""
    seconds = sum(a.seconds for a in attempts if a.role == role)
    mem_gib = resource.memMB / 1024.0 if resource.memMB >= 0 else -1.0
    return RoleUsage(
        role=role,
        replicas=replicas,
        node_seconds=seconds,
        vcpu_hours=_hours(resource.cpu, seconds),
        gpu_hours=_hours(resource.gpu, seconds),
        memory_gb_hours=_hours(mem_gib, seconds),
        gpus=None if resource.gpu < 0 else float(resource.gpu),
        vcpus=None if resource.cpu < 0 else float(resource.cpu),
        memory_gb=None if mem_gib < 0 else mem_gib,
    )


def _sum(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _when(ts: float | None) -> str:
    if ts is None:
        return "?"
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-4] + "Z"


def _fmt(value: float | None, digits: int = 4) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _priced(cost: float | None) -> str:
    """``, $1.23`` for a priced figure; nothing for a job not priced (None)."""
    return "" if cost is None else f", ${cost:.2f}"


def _fmt_s(value: float | None, unknown: str) -> str:
    """Seconds as ``12.00 s``; ``unknown`` (why there is no figure) when None."""
    return unknown if value is None else f"{value:.2f} s"


@dataclass(frozen=True)
class Usage:
    """A finished job's usage summary (see the module docstring).

    ``submitted``: when the scheduler accepted the job; ``first_running``: when its first
    replica started; ``ended``: when the job ended (epoch seconds, None where unknown).
    """

    submitted: float | None
    first_running: float | None
    ended: float | None
    roles: list[RoleUsage] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    #: Where the job checkpoints (``TORCHX_CHECKPOINT_DIR``; None: nowhere), which the task
    #: reporting the usage adds (``core/checkpoints.py``).
    checkpoint_dir: str | None = None
    #: The rates the job is priced at (None: not priced, ``cost_usd`` is None).
    rates: Rates | None = None

    @property
    def queue_wait_s(self) -> float | None:
        """Submitted to first replica running."""
        if self.submitted is None or self.first_running is None:
            return None
        return max(0.0, self.first_running - self.submitted)

    @property
    def run_time_s(self) -> float | None:
        """First replica running to the job's end."""
        if self.first_running is None or self.ended is None:
            return None
        return max(0.0, self.ended - self.first_running)

    @property
    def node_seconds(self) -> float:
        return sum(r.node_seconds for r in self.roles)

    @property
    def vcpu_hours(self) -> float | None:
        return _sum([r.vcpu_hours for r in self.roles])

    @property
    def gpu_hours(self) -> float | None:
        return _sum([r.gpu_hours for r in self.roles])

    @property
    def memory_gb_hours(self) -> float | None:
        return _sum([r.memory_gb_hours for r in self.roles])

    @property
    def priced(self) -> bool:
        """Whether the job is priced at all: at ``rates``, else at its scheduler's prices of
        at least one attempt (``Attempt.price_per_hour``)."""
        return self.rates is not None or any(a.price_per_hour is not None for a in self.attempts)

    def attempt_cost_usd(self, attempt: Attempt, now: float | None = None) -> float | None:
        """What ``attempt`` cost: at ``rates`` when given (they win), else at its own
        ``price_per_hour`` (None: that attempt could not be priced, or the job is not priced);
        an open attempt (started, no end) counts until ``now`` (None: it counts nothing yet)."""
        if not self.priced:
            return None
        if attempt.started is None:
            return 0.0
        ended = attempt.ended if attempt.ended is not None else now
        hours = 0.0 if ended is None else max(0.0, ended - attempt.started) / 3600.0
        if self.rates is None:
            return None if attempt.price_per_hour is None else attempt.price_per_hour * hours
        role = next((r for r in self.roles if r.role == attempt.role), None)
        return 0.0 if role is None else role.cost_per_hour(self.rates) * hours

    def _total(self, attempts: Sequence[Attempt], now: float | None) -> float | None:
        """What ``attempts`` cost together; None when the job is not priced or one of them
        that ran could not be (a sum without it would understate the cost)."""
        costs = [self.attempt_cost_usd(a, now) for a in attempts]
        return None if not self.priced or None in costs else sum(c or 0.0 for c in costs)

    def role_cost_usd(self, role: str) -> float | None:
        """What ``role``'s attempts cost (None: not priced)."""
        return self._total([a for a in self.attempts if a.role == role], None)

    @property
    def cost_usd(self) -> float | None:
        """What the job cost (None: not priced)."""
        return self.cost_so_far(None)

    def cost_so_far(self, now: float | None) -> float | None:
        """The cost as ``cost_usd`` counts it, with every open attempt taken to run until
        ``now`` (a live job's cost so far); None when not priced."""
        return self._total(self.attempts, now)

    def gpu_hours_at(self, now: float) -> float | None:
        """The GPU-hours counted as ``gpu_hours`` does, with every attempt still open (started,
        no end yet: a live job's) taken to run until ``now`` (epoch seconds); None where no
        role asked for GPUs."""
        gpus = {r.role: r.gpus for r in self.roles if r.gpus is not None}
        if not gpus:
            return None
        seconds = sum(
            gpus[a.role] * max(0.0, (now if a.ended is None else a.ended) - a.started)
            for a in self.attempts
            if a.started is not None and a.role in gpus
        )
        return seconds / 3600.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict: the records plus the derived figures (what XCom and lineage carry)."""
        return {
            "submitted": self.submitted,
            "first_running": self.first_running,
            "ended": self.ended,
            "queue_wait_s": self.queue_wait_s,
            "run_time_s": self.run_time_s,
            "node_seconds": self.node_seconds,
            "vcpu_hours": self.vcpu_hours,
            "gpu_hours": self.gpu_hours,
            "memory_gb_hours": self.memory_gb_hours,
            "attempts_count": len(self.attempts),
            "cost_usd": self.cost_usd,
            "rates": None if self.rates is None else self.rates.to_dict(),
            "roles": [asdict(r) | {"cost_usd": self.role_cost_usd(r.role)} for r in self.roles],
            "attempts": [asdict(a) | {"cost_usd": self.attempt_cost_usd(a)} for a in self.attempts],
            "checkpoint_dir": self.checkpoint_dir,
        }

    def format(self) -> str:
        """A readable block: times, totals, one line per role and per attempt."""
        lines = [
            f"Submitted:   {_when(self.submitted)}",
            f"Queue wait:  {_fmt_s(self.queue_wait_s, 'n/a (no replica ran)')} (submitted -> first replica running)",
            f"Run time:    {_fmt_s(self.run_time_s, 'n/a (no replica ran)')} (first replica running -> end, "
            f"{_when(self.ended)})",
            f"Total:       {self.node_seconds:.2f} node-s, {_fmt(self.vcpu_hours)} vCPU-h, "
            f"{_fmt(self.gpu_hours)} GPU-h, {_fmt(self.memory_gb_hours)} GB-h memory{_priced(self.cost_usd)}",
            "Roles:",
        ]
        for r in self.roles:
            lines.append(
                f"  {r.role}: {r.replicas} replica(s), {r.node_seconds:.2f} node-s, {_fmt(r.vcpu_hours)} vCPU-h, "
                f"{_fmt(r.gpu_hours)} GPU-h, {_fmt(r.memory_gb_hours)} GB-h memory"
                f"{_priced(self.role_cost_usd(r.role))}"
            )
        lines.append(f"Replica runs: {len(self.attempts)} (role[replica] #attempt: one line per run)")
        for a in self.attempts:
            code = "?" if a.exit_code is None else str(a.exit_code)
            reason = f" ({a.reason})" if a.reason else ""
            lines.append(
                f"  {a.role}[{a.replica}] #{a.number}: {a.seconds:.2f} s{_priced(self.attempt_cost_usd(a))}, "
                f"exit {code}{reason}"
            )
        if self.checkpoint_dir:
            lines.append(f"Checkpoints: {self.checkpoint_dir}")
        return "Usage:\n" + textwrap.indent("\n".join(lines), "  ")

    def __str__(self) -> str:
        return self.format()


def compute_usage(
    submitted: float | None,
    ended: float | None,
    roles: Sequence[Role],
    attempts: Sequence[Attempt],
) -> Usage:
    """The usage of a job submitted at ``submitted`` and ended at ``ended`` whose replicas ran
    ``attempts``; ``roles`` give each role's replica count and requested resource.

    An attempt without an end (its record was cut short, e.g. the supervisor died) is taken to
    have ended with the job.
    """
    closed = [
        a if a.ended is not None or a.started is None else Attempt(**{**asdict(a), "ended": ended}) for a in attempts
    ]
    starts = [a.started for a in closed if a.started is not None]
    return Usage(
        submitted=submitted,
        first_running=min(starts) if starts else None,
        ended=ended,
        roles=[role_usage(r.name, r.num_replicas, r.resource, closed) for r in roles],
        attempts=sorted(closed, key=lambda a: (a.started is None, a.started or 0.0)),  # stable: ties keep role order
    )
