"""The guards the local supervisor holds itself (run options ``start_timeout``,
``max_gpu_hours``: ``supervisor.py``, ``policy.guard_trip``), on real processes with faked GPUs
(``AIRFLOW_TORCHX_LOCAL_GPUS``) and nobody watching: the test only reads the job's record
once it ended. A job over its GPU budget and a job held PENDING past its ``start_timeout``
each stop within the limit plus one supervisor tick, end CANCELLED with the trip recorded, and
their description gives the message a watcher's trip gives."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from airflow_provider_torchx.core.errors import InvalidRunConfigError
from airflow_provider_torchx.core.guards import MAX_GPU_HOURS, START_TIMEOUT, Trip
from airflow_provider_torchx.core.runopts import CfgVal
from airflow_provider_torchx.core.schedulers.api import DescribeAppResponse
from airflow_provider_torchx.core.schedulers.local import LocalScheduler, gpus, supervisor
from airflow_provider_torchx.core.specs import AppDef, AppState, Resource, Role
from tests.core.local.conftest import wait_gone
from tests.core.local.helpers import wait_done, wait_running

ON = {"auto_set_cuda_visible_devices": True}
#: The supervisor's tick: the longest it sleeps with a replica running (``_TRACK_INTERVAL``).
TICK = supervisor._TRACK_INTERVAL


@pytest.fixture(autouse=True)
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(gpus.GPUS_ENV, "0,1")


def gpu_app(name: str, gpu: int) -> AppDef:
    """One replica asking for ``gpu`` GPUs that sleeps (``mark``'s environment: ``wait_gone``)."""
    role = Role("g", entrypoint="sh", args=["-c", "sleep 60"], resource=Resource(1, gpu, 64))
    return AppDef(name, roles=[role])


def submit(sched: LocalScheduler, app: AppDef, **cfg: CfgVal) -> str:
    return sched.schedule(sched.submit_dryrun(app, {**ON, **cfg}))


@pytest.fixture
def holder(sched: LocalScheduler, mark: str) -> Iterator[str]:
    """A job holding both GPUs, running, until the test ends."""
    app_id = submit(sched, gpu_app("holder", 2))
    wait_running(sched, app_id)
    yield app_id
    sched.cancel(app_id)
    wait_done(sched, app_id)


def the_trip(desc: DescribeAppResponse) -> Trip:
    assert desc.state == AppState.CANCELLED, desc
    assert desc.guard_trip is not None, desc
    return desc.guard_trip


def test_a_job_over_its_gpu_budget_stops_within_a_tick_with_nobody_watching(sched: LocalScheduler, mark: str) -> None:
    budget = 2 * 2.0 / 3600  # two seconds of two GPUs
    app_id = submit(sched, gpu_app("spender", 2), max_gpu_hours=budget)
    trip = the_trip(wait_done(sched, app_id))
    assert (trip.guard, trip.limit, trip.state) == (MAX_GPU_HOURS, budget, AppState.RUNNING)
    assert trip.gpu_hours is not None and budget < trip.gpu_hours <= budget + 2 * TICK / 3600, trip
    assert 2.0 < trip.for_s <= 2.0 + TICK, trip  # the replica ran the budget's time and one tick at most
    desc = sched.describe(app_id)
    assert desc is not None and desc.msg == "guardrail max_gpu_hours=0.00111111 tripped: the supervisor stopped the job"
    (replica,) = desc.roles_statuses[0].replicas
    assert replica.state == AppState.CANCELLED
    assert trip.message(f"local_cwd://test/{app_id}").startswith(
        f"max_gpu_hours=0.00111111: TorchX job local_cwd://test/{app_id} used 0.00"
    )
    assert wait_gone(mark, 5.0) == []


def test_a_job_held_pending_past_its_start_timeout_stops_with_nobody_watching(
    sched: LocalScheduler, holder: str, mark: str
) -> None:
    app_id = submit(sched, gpu_app("waiter", 1), start_timeout=1.5)
    desc = wait_done(sched, app_id)
    trip = the_trip(desc)
    assert (trip.guard, trip.limit, trip.state) == (START_TIMEOUT, 1.5, AppState.PENDING)
    assert 1.5 < trip.for_s <= 1.5 + TICK, trip
    assert trip.reason == f"waiting for 1 GPU, 0 free, held by {holder} (0,1)"
    (replica,) = desc.roles_statuses[0].replicas
    assert replica.state == AppState.CANCELLED and replica.msg.startswith("never started"), replica
    message = trip.message(f"local_cwd://test/{app_id}")
    assert message.startswith(f"start_timeout=1.5s: TorchX job local_cwd://test/{app_id} did not start within 1.5s")
    assert "the task fails without retry" in message
    holding = sched.describe(holder)
    assert holding is not None and holding.state == AppState.RUNNING  # nothing it held was freed


def test_a_job_stopped_while_it_waited_leaves_the_gpu_queue(sched: LocalScheduler, holder: str) -> None:
    """Once the holder ends, a job submitted after the tripped waiter runs."""
    waiter = submit(sched, gpu_app("waiter", 2), start_timeout=0.5)
    assert the_trip(wait_done(sched, waiter)).guard == START_TIMEOUT
    later = submit(sched, gpu_app("later", 2))
    sched.cancel(holder)
    wait_done(sched, holder)
    wait_running(sched, later)
    sched.cancel(later)
    wait_done(sched, later)


def test_a_job_within_its_guards_is_untouched(sched: LocalScheduler) -> None:
    role = Role("g", entrypoint="sh", args=["-c", "sleep 0.2"], resource=Resource(1, 1, 64))
    desc = wait_done(sched, submit(sched, AppDef("ok", roles=[role]), start_timeout=30, max_gpu_hours=1.0))
    assert desc.state == AppState.SUCCEEDED and desc.guard_trip is None, desc


@pytest.mark.parametrize(("name", "value"), [(START_TIMEOUT, 0), (MAX_GPU_HOURS, -1.0), (MAX_GPU_HOURS, "inf")])
def test_a_bad_guard_is_refused_naming_it_and_nothing_is_submitted(
    sched: LocalScheduler, name: str, value: CfgVal
) -> None:
    with pytest.raises(InvalidRunConfigError, match=rf"cfg: {name}: .* is not allowed: expected a number"):
        sched.submit_dryrun(gpu_app("bad", 1), {**ON, name: value})
    assert sched.list() == []


def test_the_request_carries_the_guards_for_the_supervisor(sched: LocalScheduler) -> None:
    request = sched.submit_dryrun(gpu_app("r", 1), {**ON, START_TIMEOUT: 90, MAX_GPU_HOURS: "0.5"}).request
    assert (request.start_timeout, request.max_gpu_hours) == (90.0, 0.5)
