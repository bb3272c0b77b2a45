"""The local supervisor's policy: what it does when a replica exits, an attempt runs out of
``attempt_timeout``, a replica fails, a cancel comes or a guard trips, as pure functions of what
the supervisor knows (docs/local-faults.md). The supervisor (``supervisor.py``) only applies
their answers to processes; each rule is a row of ``tests/core/local/test_policy.py``.

Standard library only, and nothing imported: the supervisor loads this before it forks the
replicas, when a job's start waits for it (no ``re``, ``enum``, ``json``, ``typing`` or
``dataclasses``). Replicas are named by ``(role, index)``; states and retry policies are their
names as text (``AppState``'s and ``RetryPolicy``'s values).

The guards (``start_timeout``, ``max_gpu_hours``) are ``core/guards.py``'s, held here without a
watcher: ``guard_trip`` trips where ``Guards.check`` would on the same records, and returns the
trip in ``Trip.to_dict``'s shape, so that the job's description gives the task the very
message a watcher's trip gives (``Trip.message``).
"""

from __future__ import annotations

TYPE_CHECKING = False  # not ``typing``: it would slow the supervisor's start-up
if TYPE_CHECKING:
    from typing import Any

#: ``core/guards.py``'s guard names (a test checks that they agree).
START_TIMEOUT = "start_timeout"
MAX_GPU_HOURS = "max_gpu_hours"


class _Decision:
    """A decision: its fields (``__slots__``) compare by value."""

    __slots__: tuple[str, ...] = ()

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other._values() == self._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"{type(self).__name__}({fields})"


class Exited(_Decision):
    """A replica's process exited: its ``state``, its ``msg`` and whether the exit is a
    failure the retry policy must answer (``failure``: not one the supervisor caused)."""

    __slots__ = ("failure", "msg", "state")

    def __init__(self, state: str, msg: str = "", failure: bool = False) -> None:
        self.state, self.msg, self.failure = state, msg, failure


class Restart(_Decision):
    """Restart ``group`` (replicas, ``(role, index)``), stopping those still running; ``msg``
    is the job's message while it runs (the task log's progress notes show it)."""

    __slots__ = ("group", "msg")

    def __init__(self, group: list[tuple[str, int]], msg: str) -> None:
        self.group, self.msg = group, msg


class Fail(_Decision):
    """End the job FAILED with ``msg``, stopping every replica (fail-fast)."""

    __slots__ = ("msg",)

    def __init__(self, msg: str) -> None:
        self.msg = msg


def timed_out_text(attempt_timeout: float | None) -> str:
    """How an attempt stopped by ``attempt_timeout`` is described."""
    return f"ran longer than attempt_timeout={attempt_timeout} (seconds)"


def exit_text(role: str, idx: int, code: int, signal_name: str | None = None) -> str:
    """Why replica ``idx`` of ``role`` ended with exit ``code`` (``signal_name``: the signal
    that killed it, for a negative code)."""
    if code < 0 and signal_name:
        return f"role {role!r} replica {idx} was killed by {signal_name} (exit code {code})"
    return f"role {role!r} replica {idx} exited with code {code}"


def exited(code: int, *, timed_out: bool, stopping: bool, attempt_timeout: float | None = None) -> Exited:
    """What a replica's exit with ``code`` means: an attempt the supervisor stopped for
    ``attempt_timeout`` FAILED (its failure was answered when it timed out), one it stopped
    otherwise (fail-fast, a restart of its group, a cancel) CANCELLED, 0 SUCCEEDED, anything
    else a FAILED attempt for the retry policy."""
    if timed_out:
        return Exited("FAILED", f"stopped: {timed_out_text(attempt_timeout)}")
    if stopping:
        return Exited("CANCELLED")
    if code == 0:
        return Exited("SUCCEEDED")
    return Exited("FAILED", failure=True)


def attempt_deadline(started: float, attempt_timeout: float | None) -> float | None:
    """When an attempt started at ``started`` runs out of ``attempt_timeout`` (None or 0: never)."""
    return started + attempt_timeout if attempt_timeout else None


def is_timed_out(deadline: float | None, now: float) -> bool:
    """Whether an attempt with ``deadline`` (``attempt_deadline``) ran out of time at ``now``."""
    return deadline is not None and now >= deadline


def after_failure(
    failed: tuple[str, int],
    what: str,
    *,
    replicas: list[tuple[str, int]],
    max_retries: int,
    policy: str,
    retries_used: int,
    restarts: int,
) -> Restart | Fail:
    """Replica ``failed``'s attempt failed (``what`` says how): restart its group while its
    role's ``retries_used`` < ``max_retries`` (``policy``: REPLICA the replica, ROLE its role,
    anything else the whole application), else fail the job (``restarts``: the job's restarts
    so far, named in the message)."""
    role = failed[0]
    if retries_used < max_retries:
        if policy == "REPLICA":
            group = [failed]
        elif policy == "ROLE":
            group = [x for x in replicas if x[0] == role]
        else:
            group = list(replicas)
        return Restart(group, f"{what}; restart {retries_used + 1}/{max_retries} of role {role!r} ({policy})")
    return Fail(what + (f" (after {restarts} restart(s))" if restarts else ""))


def cancel_grace(cancel: dict[str, Any] | None, default: float) -> float:
    """The grace period between SIGTERM and SIGKILL a cancel asks for (``cancel.json``'s
    ``grace``), else ``default`` (the request's)."""
    return float((cancel or {}).get("grace", default))


def succeeded(states: list[str]) -> bool:
    """Whether the job succeeded: every replica SUCCEEDED."""
    return all(state == "SUCCEEDED" for state in states)


# ---------------------------------------------------------------------- guards


def gpu_seconds(runs: list[tuple[float, list[tuple[float, float | None]]]], now: float) -> float:
    """The GPU-seconds of ``runs`` up to ``now``: per replica, its GPUs and its attempts'
    ``(started, ended)`` (None: still running, counted up to ``now``), as
    ``Usage.gpu_hours_at`` counts them (times 3,600)."""
    return sum(
        gpus * max(0.0, (now if ended is None else ended) - started)
        for gpus, attempts in runs
        for started, ended in attempts
    )


def guard_trip(
    *,
    start_timeout: float | None,
    max_gpu_hours: float | None,
    submitted: float,
    first_running: float | None,
    runs: list[tuple[float, list[tuple[float, float | None]]]],
    msg: str,
    now: float,
) -> dict[str, Any] | None:
    """The guard that trips at ``now`` (epoch seconds), in ``Trip.to_dict``'s shape, or None:
    ``start_timeout`` once the job, ``submitted`` at that time, has not run (``first_running``
    None) for longer than the limit; ``max_gpu_hours`` once the GPU-hours of ``runs``
    (``gpu_seconds``) are over the budget. ``msg``: the job's message (why it waits)."""
    if start_timeout is not None and first_running is None and now - submitted > start_timeout:
        return _trip(START_TIMEOUT, start_timeout, "PENDING", now - submitted, msg, None)
    if max_gpu_hours is not None and any(gpus > 0 for gpus, _ in runs):
        used = gpu_seconds(runs, now) / 3600.0
        if used > max_gpu_hours:
            ran = now - first_running if first_running is not None else 0.0
            return _trip(MAX_GPU_HOURS, max_gpu_hours, "RUNNING", ran, msg, used)
    return None


def next_guard_check(
    *,
    start_timeout: float | None,
    max_gpu_hours: float | None,
    submitted: float,
    first_running: float | None,
    runs: list[tuple[float, list[tuple[float, float | None]]]],
    now: float,
) -> float | None:
    """When (epoch seconds) ``guard_trip`` may next trip: the start deadline while the job has
    not run, or the moment the GPUs running now spend what is left of the budget; None: no
    guard can trip without a change (which the supervisor acts on anyway)."""
    times = []
    if start_timeout is not None and first_running is None:
        times.append(submitted + start_timeout)
    running = sum(gpus for gpus, attempts in runs for _, ended in attempts if ended is None)
    if max_gpu_hours is not None and running > 0:
        times.append(now + max(0.0, max_gpu_hours * 3600.0 - gpu_seconds(runs, now)) / running)
    return min(times) if times else None


def guard_msg(trip: dict[str, Any]) -> str:
    """The message of the job the supervisor stopped (CANCELLED, as a watcher's trip cancels
    it) for ``trip``, in the watcher's cancel reason's words; the description gives the task
    ``Trip.message``."""
    return f"guardrail {trip['guard']}={trip['limit']:g} tripped: the supervisor stopped the job"


def _trip(guard: str, limit: float, state: str, for_s: float, reason: str, gpu_hours: float | None) -> dict[str, Any]:
    """A trip in ``Trip.to_dict``'s shape (a supervisor prices nothing: no ``cost_usd``)."""
    return {
        "guard": guard,
        "limit": limit,
        "state": state,
        "for_s": for_s,
        "reason": reason,
        "gpu_hours": gpu_hours,
        "cost_usd": None,
    }
