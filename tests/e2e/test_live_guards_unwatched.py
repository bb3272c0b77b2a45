"""Guards that hold while nobody watches, on a live deployment (issue: a job used 2.35x its GPU
budget and a PENDING job ran 54 s past its ``start_timeout`` while the triggerer was down).

With the triggerer stopped before the tasks run, two deferred tasks submit local jobs on
faked GPUs (``tests/e2e/dags/torchx_e2e_guards.py``): one over its GPU budget, one held PENDING
past its ``start_timeout`` (the test's own job holds the GPUs it needs). No watcher runs, yet
each job's supervisor stops it within its limit plus one supervisor tick, and records the
trip. Once the triggerer is back, each task fails as a watcher's trip fails it: the guard's
line in its task log, no retry."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from airflow_provider_torchx.core.guards import MAX_GPU_HOURS, START_TIMEOUT, Trip
from airflow_provider_torchx.core.schedulers.local import gpus, supervisor
from airflow_provider_torchx.core.specs import AppDef, AppState, Resource, Role, parse_app_handle
from tests.e2e.conftest import _deployment
from tests.e2e.dags.torchx_e2e_guards import BUDGET_S, START_TIMEOUT_S
from tests.e2e.deployment import wait_until
from tests.e2e.live import LiveAirflow

pytestmark = [pytest.mark.airflow]

BUDGET = "torchx_e2e_guard_budget"
START = "torchx_e2e_guard_start"
FOUR_GPUS = "0,1,2,3"
#: The supervisor's tick: the longest it sleeps with a replica running.
TICK = supervisor._TRACK_INTERVAL


@pytest.fixture(scope="module")
def live_gpus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveAirflow]:
    """A live deployment for local jobs on a host with 4 faked GPUs."""
    with _deployment(tmp_path_factory.mktemp("live-guards"), {gpus.GPUS_ENV: FOUR_GPUS}) as live:
        yield live


def ended(live: LiveAirflow, handle: str, within: float) -> Trip:
    """The guard trip of the job ``handle`` once it ended (CANCELLED by its supervisor)."""
    app_id = parse_app_handle(handle).app_id
    desc = wait_until(
        lambda: (d := live.scheduler.describe(app_id)) is not None and d.state.is_terminal() and d,
        within,
        f"{handle} to end",
        seen=lambda: str(live.scheduler.describe(app_id)),
    )
    assert desc.state == AppState.CANCELLED and desc.guard_trip is not None, desc
    return desc.guard_trip


def test_guards_hold_while_the_triggerer_is_down(live_gpus: LiveAirflow, monkeypatch: pytest.MonkeyPatch) -> None:
    live, api = live_gpus, live_gpus.deployment
    monkeypatch.setenv(gpus.GPUS_ENV, FOUR_GPUS)
    holder_app = AppDef(
        "holder", roles=[Role("g", entrypoint="sh", args=["-c", "sleep 600"], resource=Resource(1, 2, 64))]
    )
    holder = live.scheduler.schedule(live.scheduler.submit_dryrun(holder_app, {"auto_set_cuda_visible_devices": True}))
    for dag_id in (BUDGET, START):
        api.wait_for_dag(dag_id)
    api.stop_component("triggerer", signal.SIGTERM)
    try:
        budget_run = live.trigger(BUDGET, {})
        budget_job = live.app_handle(BUDGET, budget_run)  # submitted first: it gets the 2 free GPUs
        start_run = live.trigger(START, {})
        start_job = live.app_handle(START, start_run)
        for dag_id, run_id in ((BUDGET, budget_run), (START, start_run)):
            api.wait_for_state(dag_id, run_id, "job", {"deferred"})

        spent = ended(live, budget_job, BUDGET_S + 60)
        assert spent.guard == MAX_GPU_HOURS and spent.state == AppState.RUNNING, spent
        assert BUDGET_S < spent.for_s <= BUDGET_S + TICK, spent  # its replica's running time at the trip
        waited = ended(live, start_job, START_TIMEOUT_S + 60)
        assert waited.guard == START_TIMEOUT and waited.state == AppState.PENDING, waited
        assert START_TIMEOUT_S < waited.for_s <= START_TIMEOUT_S + TICK, waited  # since its submission
        assert waited.reason.startswith("waiting for 3 GPUs, ") and f"held by {holder}" in waited.reason, waited
        for dag_id, run_id in ((BUDGET, budget_run), (START, start_run)):
            assert api.task_instance(dag_id, run_id, "job")["state"] == "deferred"  # nobody watched
    finally:
        api.start_component("triggerer")
        live.scheduler.cancel(holder)

    for dag_id, run_id, guard in ((BUDGET, budget_run, MAX_GPU_HOURS), (START, start_run, START_TIMEOUT)):
        ti = api.wait_for_state(dag_id, run_id, "job", {"failed"}, timeout=180)
        assert ti["try_number"] == 1, ti  # a guard fails the task without retry
        lines = [e for e in live.log(dag_id, run_id) if f"Guardrail {guard} tripped: {guard}=" in e]
        assert len(lines) == 1, live.log(dag_id, run_id)[-30:]
        assert "the job was cancelled and the task fails without retry" in lines[0]
