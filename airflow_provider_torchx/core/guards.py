"""Guardrails: the limits a watcher holds a live job to, as one pure rule.

``Guards.check`` looks at a job's status as a watcher already read it (no call of its own)
and says whether a guard tripped (docs/architecture.md, "Guardrails"):

- ``start_timeout`` (seconds): no replica has run within it of the job's submission. The
  submission time is the scheduler's (``AppStatus.usage_so_far.submitted``), so a task that
  reattaches to its job counts from when the job was submitted, not from its own start;
  ``since`` stands in only where the scheduler does not say.
- ``max_gpu_hours``: the job's GPU-hours, counted as the usage summary counts them (each
  replica's GPUs times its running time over every attempt, ``core/usage.py``), with the
  attempts still running counted up to now, went over the budget.
- ``max_cost`` (US dollars): the job's cost so far, counted as the usage summary prices it
  (``Usage.cost_so_far``), went over the budget. With ``rates`` (``core/rates.py``) the job is
  priced at them (they win); without, at the prices its scheduler gave its attempts in the
  status (AWS Batch: AWS's own, ``aws_batch/pricing.py``). A running attempt its scheduler
  cannot price (``Attempt.no_price``) leaves the cost so far unknown: it trips nothing, and
  the watcher says once that the guard cannot be held for it (``Guards.unheld``). A job
  nothing prices (no rates, a scheduler without the ``prices_attempts`` capability) cannot
  hold this guard: ``Guards.require_priced`` refuses it before anything is submitted.

Whoever watches acts on a ``Trip``: cancels the job (saying why) and fails its task without a
retry; ``Trip.message`` says which guard, its value, the state the job was in, for how long,
and the scheduler's own words for why. The scheduler's longer account of a job that does not
start (``Runner.wait_reason``) is asked for once, when the guard trips.

A watcher holds the guards only while it watches. So the task also hands them to the scheduler,
as run options of the same names wherever the scheduler declares them (``guard_cfg``,
``add_guard_option``), and the scheduler holds them without Airflow: the local supervisor
stops the job itself and records the ``Trip`` (the job's status then carries it:
``AppStatus.guard_trip``, and the task fails with the same message); a batch system bounds each
attempt's run time by the GPU budget (``budget_seconds``: AWS Batch's
``attemptDurationSeconds``, Slurm's ``--time``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from airflow_provider_torchx.core.errors import InvalidRunConfigError
from airflow_provider_torchx.core.numbers import positive_number
from airflow_provider_torchx.core.rates import Rates
from airflow_provider_torchx.core.runopts import CfgVal, runopts
from airflow_provider_torchx.core.specs import AppState, AppStatus
from airflow_provider_torchx.core.usage import Attempt, Usage

START_TIMEOUT = "start_timeout"
MAX_GPU_HOURS = "max_gpu_hours"
MAX_COST = "max_cost"
ATTEMPT_TIMEOUT = "attempt_timeout"


def positive_limit(name: str, value: Any, *, seconds: bool, unit: str = "GPU-hours") -> float | None:
    """``value`` as a float limit (a ``timedelta`` in seconds where ``seconds``, else a number
    of ``unit``), None for None; ``ValueError`` naming ``name``, the value and what is allowed
    for anything else than a finite number > 0."""
    if value is None:
        return None
    number = positive_number(value, seconds=seconds)
    if number is None:
        what = "a number of seconds or a timedelta" if seconds else f"a number of {unit}"
        raise ValueError(f"{name}: {value!r} is not allowed: expected {what} > 0 (or None: no limit)")
    return number


def smaller(*limits: float | None) -> float | None:
    """The smallest of the limits given (None: no limit)."""
    known = [x for x in limits if x is not None]
    return min(known) if known else None


def has_started(status: AppStatus) -> bool:
    """Whether some replica of the job has run: the job or a replica is RUNNING, or the
    scheduler recorded a replica's start (a job retried after running counts as started)."""
    if status.state == AppState.RUNNING:
        return True
    if any(rep.state == AppState.RUNNING for role in status.roles for rep in role.replicas):
        return True
    usage = status.usage_so_far or status.usage
    return usage is not None and usage.first_running is not None


def start_trip(
    limit: float, state: AppState, submitted: float | None, started: bool, reason: str, wall: float
) -> Trip | None:
    """The ``start_timeout`` rule: a job ``submitted`` (epoch seconds; None: undated, nothing
    to count) that has not ``started`` trips once ``wall`` is more than ``limit`` past its
    submission. ``Guards.check`` applies it to a watcher's look, the reaper to a listing."""
    if started or submitted is None or wall - submitted <= limit:
        return None
    return Trip(START_TIMEOUT, limit, state, wall - submitted, reason)


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _ran(usage: Usage, wall: float) -> float:
    """Seconds since the job's first replica ran (0: none has)."""
    return wall - usage.first_running if usage.first_running is not None else 0.0


@dataclass(frozen=True)
class Trip:
    """A guard that tripped: which (``guard``), its ``limit``, the job's ``state`` and how
    long it had been so (``for_s``: since its submission for ``start_timeout``, since it first
    ran for ``max_gpu_hours``), the scheduler's reason (``reason``: its status message) and,
    for ``max_gpu_hours``, the GPU-hours used; for ``max_cost``, the US dollars spent."""

    guard: str
    limit: float
    state: AppState
    for_s: float
    reason: str = ""
    gpu_hours: float | None = None
    cost_usd: float | None = None

    def message(self, app_handle: str, why: str = "") -> str:
        """What the task's error says: the guard, its value, what was seen and, for a job
        that did not start, the scheduler's account (``why``: ``Runner.wait_reason``)."""
        if self.guard == START_TIMEOUT:
            text = (
                f"{START_TIMEOUT}={self.limit:g}s: TorchX job {app_handle} did not start within {self.limit:g}s of "
                f"its submission: still {self.state.name} after {_duration(self.for_s)}"
            )
        elif self.guard == MAX_COST:
            text = (
                f"{MAX_COST}={self.limit:g}: TorchX job {app_handle} cost ${self.cost_usd or 0.0:.2f}, over its "
                f"budget of ${self.limit:.2f} ({self.state.name}, running for {_duration(self.for_s)})"
            )
        else:
            text = (
                f"{MAX_GPU_HOURS}={self.limit:g}: TorchX job {app_handle} used {self.gpu_hours or 0.0:.4f} GPU-hours, "
                f"over its budget of {self.limit:g} GPU-hours ({self.state.name}, running for {_duration(self.for_s)})"
            )
        details = [part for part in (self.reason, why) if part]
        if details:
            text += "; " + "; ".join(dict.fromkeys(details))
        return text + "; the job was cancelled and the task fails without retry"

    @classmethod
    def from_dict(cls, data: Any) -> Trip | None:
        """The trip ``to_dict`` gave (a scheduler's record of the guard it held); None for
        anything else."""
        try:
            gpu_hours, cost = data.get("gpu_hours"), data.get("cost_usd")
            return cls(
                guard=str(data["guard"]),
                limit=float(data["limit"]),
                state=AppState[str(data["state"])],
                for_s=float(data["for_s"]),
                reason=str(data.get("reason") or ""),
                gpu_hours=None if gpu_hours is None else float(gpu_hours),
                cost_usd=None if cost is None else float(cost),
            )
        except (AttributeError, KeyError, TypeError, ValueError):
            return None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able fields (what a trigger's event carries)."""
        return {
            "guard": self.guard,
            "limit": self.limit,
            "state": self.state.name,
            "for_s": self.for_s,
            "reason": self.reason,
            "gpu_hours": self.gpu_hours,
            "cost_usd": self.cost_usd,
        }


class GuardrailTrippedError(Exception):
    """Raised by a blocking watch (``JobWatch.wait``) whose guards tripped; carries the ``Trip``."""

    def __init__(self, trip: Trip) -> None:
        super().__init__(f"guard {trip.guard} tripped")
        self.trip = trip


@dataclass(frozen=True)
class Guards:
    """The guards a watcher holds a job to (see the module docstring); None: not set.
    ``since`` (epoch seconds): when the job was submitted, where its status does not say;
    ``rates``: what the job's hardware costs, for ``max_cost``."""

    start_timeout: float | None = None
    max_gpu_hours: float | None = None
    since: float | None = None
    max_cost: float | None = None
    rates: Rates | None = None

    @property
    def armed(self) -> bool:
        """Whether any guard is set."""
        return self.start_timeout is not None or self.max_gpu_hours is not None or self.max_cost is not None

    def require_priced(self, where: str, prices_attempts: bool = False) -> None:
        """``ValueError`` when ``max_cost`` is set but nothing prices the job: no rates, and
        its scheduler does not price its attempts itself (``prices_attempts``: the
        ``SchedulerCapabilities`` of that name); the budget could never trip. ``where`` names
        what would give the rates."""
        if self.max_cost is not None and self.rates is None and not prices_attempts:
            raise ValueError(
                f"{MAX_COST}={self.max_cost:g}: the job cannot be priced, so its budget could never be held; "
                f"give rates ({where})"
            )

    def check(self, status: AppStatus | None, wall: float) -> Trip | None:
        """The guard that ``status`` trips at ``wall`` (epoch seconds), if any. A job that
        ended (or is gone) trips nothing: it is no longer the watcher's to cancel."""
        if status is None or status.is_terminal():
            return None
        usage = status.usage_so_far
        if self.start_timeout is not None:
            submitted = usage.submitted if usage is not None and usage.submitted is not None else self.since
            trip = start_trip(self.start_timeout, status.state, submitted, has_started(status), status.msg, wall)
            if trip is not None:
                return trip
        if self.max_gpu_hours is not None and usage is not None:
            used = usage.gpu_hours_at(wall)
            if used is not None and used > self.max_gpu_hours:
                return Trip(MAX_GPU_HOURS, self.max_gpu_hours, status.state, _ran(usage, wall), status.msg, used)
        if self.max_cost is not None and usage is not None:
            priced = usage if self.rates is None else dataclasses.replace(usage, rates=self.rates)
            spent = priced.cost_so_far(wall)
            if spent is not None and spent > self.max_cost:
                return Trip(MAX_COST, self.max_cost, status.state, _ran(usage, wall), status.msg, cost_usd=spent)
        return None

    def unheld(self, status: AppStatus | None) -> list[Attempt]:
        """The attempts of a live ``status`` that ``max_cost`` cannot be held for: it is set,
        no rates price the job, and its scheduler could not price them (``Attempt.no_price``).
        What a watcher says once per attempt; the guard itself never trips on them."""
        usage = status.usage_so_far if status is not None and not status.is_terminal() else None
        if self.max_cost is None or self.rates is not None or usage is None:
            return []
        return [a for a in usage.attempts if a.no_price]


# ---------------------------------------------------------------------- held by the scheduler


def add_guard_option(opts: runopts, name: str, help: str) -> None:  # noqa: A002 - runopts' word
    """Declare the guard ``name`` (``START_TIMEOUT``, ``MAX_GPU_HOURS``) as a run option of a
    scheduler that holds it itself: a float > 0 (``positive_limit``'s rule), no default."""
    seconds = name == START_TIMEOUT

    def check(value: CfgVal) -> None:
        try:
            positive_limit(name, value, seconds=seconds)
        except ValueError as e:
            raise InvalidRunConfigError(f"cfg: {e}") from None

    opts.add(name, float, help, check=check)


def guard_cfg(guards: Guards, opts: runopts) -> dict[str, float]:
    """The guards set in ``guards`` that a scheduler declares as run options (``opts``: its
    run options), as cfg values: what the task hands the scheduler to hold without it (they
    replace the cfg's own values of those names)."""
    values = {START_TIMEOUT: guards.start_timeout, MAX_GPU_HOURS: guards.max_gpu_hours}
    return {name: value for name, value in values.items() if value is not None and opts.get(name) is not None}


def budget_seconds(max_gpu_hours: float | None, gpus: float, attempt_timeout: float | None) -> int | None:
    """How long (whole seconds, at least 1) an attempt holding ``gpus`` GPUs may run within a
    GPU budget of ``max_gpu_hours``, never longer than ``attempt_timeout`` (None: none set);
    None where neither bounds it. The rule a batch system's own time limit takes the budget
    by (AWS Batch's ``attemptDurationSeconds``, Slurm's ``--time``): each attempt alone stays
    within the budget; several attempts together are the watcher's and the reaper's to stop."""
    budget = None
    if max_gpu_hours is not None and gpus > 0:
        budget = max(1, math.floor(max_gpu_hours * 3600.0 / gpus))
    limit = smaller(budget, attempt_timeout)
    return None if limit is None else int(limit)
