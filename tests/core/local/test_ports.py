"""Ports per job on the local scheduler: every ``port_map`` entry of a role gets a free port of
its own per job, the same in every replica of the role, in ``TORCHX_PORT_<NAME>``."""

from __future__ import annotations

from pathlib import Path

from airflow_provider_torchx.core.schedulers.local import LocalScheduler, ledger
from airflow_provider_torchx.core.specs import AppDef, AppState, Role
from tests.core.local.helpers import wait_done
from tests.fixtures.clock import FakeClock


def test_each_job_gets_its_own_ports_shared_by_its_replicas(sched: LocalScheduler) -> None:
    role = Role(
        "node",
        entrypoint="sh",
        args=["-c", "echo ports $TORCHX_PORT_C10D $TORCHX_PORT_TENSOR_BOARD"],
        num_replicas=2,
        port_map={"c10d": 29500, "tensor-board": 6006},
    )
    app_ids = [sched.schedule(sched.submit_dryrun(AppDef("ports", roles=[role]), {})) for _ in range(2)]
    seen = []
    for app_id in app_ids:
        assert wait_done(sched, app_id).state == AppState.SUCCEEDED
        lines = {line for k in (0, 1) for line in sched.log_iter(app_id, "node", k)}
        assert len(lines) == 1, lines  # both replicas got the same ports
        seen += [int(p) for p in lines.pop().split()[1:]]
    assert len(seen) == 4 and len(set(seen)) == 4, seen
    assert 29500 not in seen
    reserved = ledger.read(sched.store.root)["ports"]
    assert sorted(map(int, reserved)) == sorted(seen) and set(reserved.values()) == set(app_ids)


def test_reservations_of_ended_jobs_are_dropped(sched: LocalScheduler) -> None:
    app = AppDef("p", roles=[Role("r", entrypoint="true", port_map={"x": 1})])
    first = sched.schedule(sched.submit_dryrun(app, {}))
    wait_done(sched, first)
    second = sched.schedule(sched.submit_dryrun(app, {}))
    assert set(ledger.read(sched.store.root)["ports"].values()) == {second}
    wait_done(sched, second)


def test_a_job_without_a_supervisor_is_over_only_start_timeout_after_its_creation(
    tmp_path: Path, fake_clock: FakeClock
) -> None:
    """``ledger.job_over`` on a fake clock: a job dir whose supervisor never recorded itself
    holds its reservations for ``START_TIMEOUT`` after the dir was made, then is over."""
    job_dir = tmp_path / "job-1"
    job_dir.mkdir()
    made = job_dir.stat().st_mtime
    fake_clock.now = made + ledger.START_TIMEOUT
    assert not ledger.job_over(str(tmp_path), "job-1", fake_clock.clock)
    fake_clock.advance(1.0)
    assert ledger.job_over(str(tmp_path), "job-1", fake_clock.clock)
    assert ledger.job_over(str(tmp_path), "job-2", fake_clock.clock)  # no such job: over
