"""Usage summaries of real local jobs: figures against jobs whose durations and resources are
known (``sleep 1`` replicas), and attempts of a retried role with their exit codes."""

from __future__ import annotations

import time

import pytest

from airflow_provider_torchx.core.rates import Rates
from airflow_provider_torchx.core.runner import get_runner
from airflow_provider_torchx.core.schedulers.local import LocalScheduler
from airflow_provider_torchx.core.specs import AppDef, Resource, Role

from .helpers import wait_done


def test_two_replicas_of_sleep_1(sched: LocalScheduler) -> None:
    app = AppDef(
        "sleepy",
        roles=[
            Role(
                "sleeper",
                entrypoint="sleep",
                args=["1"],
                num_replicas=2,
                resource=Resource(cpu=2, gpu=1, memMB=3072),
            )
        ],
    )
    before = time.time()
    app_id = sched.submit(app, {"auto_set_cuda_visible_devices": False, "allow_no_gpus": True})
    desc = wait_done(sched, app_id)
    after = time.time()
    usage = desc.usage
    assert usage is not None
    # the replicas start in either order; each ran once and exited 0
    assert sorted((a.role, a.replica, a.number, a.exit_code) for a in usage.attempts) == [
        ("sleeper", 0, 1, 0),
        ("sleeper", 1, 1, 0),
    ]
    # at least the second each sleeps; the upper bounds only leave room for a loaded machine
    for a in usage.attempts:
        assert 1.0 <= a.seconds < 3.0, a
    assert usage.submitted is not None and before <= usage.submitted <= after
    assert usage.queue_wait_s is not None and 0 <= usage.queue_wait_s <= after - before - 1.0
    assert usage.run_time_s is not None and 1.0 <= usage.run_time_s <= after - before
    (role,) = usage.roles
    assert role.replicas == 2
    assert role.node_seconds == pytest.approx(sum(a.seconds for a in usage.attempts))
    assert 2.0 <= role.node_seconds < 6.0
    # requested resources times the seconds each replica really ran
    assert role.vcpu_hours == pytest.approx(2 * role.node_seconds / 3600)
    assert role.gpu_hours == pytest.approx(1 * role.node_seconds / 3600)
    assert role.memory_gb_hours == pytest.approx(3 * role.node_seconds / 3600)
    assert usage.gpu_hours == role.gpu_hours
    assert "sleeper: 2 replica(s)" in usage.format()


def test_attempts_of_a_retried_role(sched: LocalScheduler, tmp_path: object) -> None:
    """The first run fails (exit 3), the retry succeeds: two attempts, their exit codes, and
    the failed run's seconds count too."""
    marker = f"{tmp_path}/ran-once"
    script = f"if [ -e {marker} ]; then exit 0; fi; touch {marker}; exit 3"
    app = AppDef("retry", roles=[Role("r", entrypoint="sh", args=["-c", script], max_retries=1)])
    desc = wait_done(sched, sched.submit(app))
    assert desc.state.name == "SUCCEEDED"
    usage = desc.usage
    assert usage is not None
    assert [(a.replica, a.number, a.exit_code) for a in usage.attempts] == [(0, 1, 3), (0, 2, 0)]
    # the null resource asks for no amounts: hours unknown, seconds still counted
    (role,) = usage.roles
    assert role.vcpu_hours is None and role.gpu_hours is None
    assert role.node_seconds == pytest.approx(sum(a.seconds for a in usage.attempts))


def test_a_job_submitted_with_rates_is_priced_by_whoever_describes_it(mark: str) -> None:
    """The rates travel with the job (its labels): the runner prices its usage at them, live
    (``usage_so_far``) and once it ended, with no rates of its own."""
    rates = Rates(gpu_hour=3600.0)  # $1 a GPU-second
    role = Role("sleeper", entrypoint="sleep", args=["1"], resource=Resource(cpu=1, gpu=2, memMB=64))
    with get_runner("test") as runner:
        cfg = {"auto_set_cuda_visible_devices": False, "allow_no_gpus": True}
        handle = runner.run(AppDef("priced", roles=[role]), "local_cwd", cfg, labels=rates.labels())
        status = runner.wait(handle, wait_interval=0.1)
        assert status is not None and status.usage is not None
        assert status.usage.rates == rates
        assert status.usage.cost_usd == pytest.approx(2 * status.usage.node_seconds)
        desc = runner.describe_app(handle)
        assert desc is not None and desc.usage is not None and desc.usage.cost_usd == status.usage.cost_usd
        unpriced = runner.run(AppDef("unpriced", roles=[role]), "local_cwd", cfg)
        done = runner.wait(unpriced, wait_interval=0.1)
        assert done is not None and done.usage is not None and done.usage.cost_usd is None
