"""Small helpers shared by the local scheduler tests."""

from __future__ import annotations

import time

from airflow_provider_torchx.core.schedulers.api import DescribeAppResponse
from airflow_provider_torchx.core.schedulers.local import LocalScheduler
from airflow_provider_torchx.core.specs import AppDef, Role


def sh_app(*scripts: str, name: str = "app", **role_kwargs: object) -> AppDef:
    """An app with one role per shell script (roles ``r0``, ``r1``, ...)."""
    return AppDef(
        name,
        roles=[
            Role(f"r{i}", entrypoint="sh", args=["-c", script], **role_kwargs)  # type: ignore[arg-type]
            for i, script in enumerate(scripts)
        ],
    )


def wait_done(sched: LocalScheduler, app_id: str, timeout: float = 30.0) -> DescribeAppResponse:
    """Wait for the job to be terminal (event-driven through ``wait_for_change``), then settle
    it as ``Runner.wait`` does (``finalize``: a job whose supervisor died is stopped)."""
    deadline = time.monotonic() + timeout
    while True:
        desc = sched.describe(app_id)
        assert desc is not None
        if desc.state.is_terminal():
            return sched.finalize(app_id) or desc
        assert time.monotonic() < deadline, f"{app_id} still {desc.state} after {timeout} s"
        sched.wait_for_change(app_id, min(5.0, deadline - time.monotonic()))


def wait_running(sched: LocalScheduler, app_id: str, timeout: float = 20.0) -> DescribeAppResponse:
    """Wait until every replica of the job runs."""
    deadline = time.monotonic() + timeout
    while True:
        desc = sched.describe(app_id)
        assert desc is not None
        reps = [r for role in desc.roles_statuses for r in role.replicas]
        if reps and all(r.state.name == "RUNNING" for r in reps):
            return desc
        assert time.monotonic() < deadline, f"{app_id} not running after {timeout} s: {desc}"
        time.sleep(0.02)


def wait_for_line(sched: LocalScheduler, app_id: str, role: str, text: str, timeout: float = 20.0) -> None:
    """Wait until ``text`` appears in the combined log of replica 0 of ``role``."""
    deadline = time.monotonic() + timeout
    while not any(text in line for line in sched.log_iter(app_id, role)):
        assert time.monotonic() < deadline, f"{text!r} never appeared in {app_id}/{role}"
        time.sleep(0.02)
