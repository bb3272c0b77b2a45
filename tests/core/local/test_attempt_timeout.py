"""``attempt_timeout``: the supervisor stops an attempt that runs too long, with no watcher
running, as a failed attempt: retried while ``max_retries`` allow (each attempt with the full
time), else the job is FAILED, naming the option and its value, and no process is left."""

from __future__ import annotations

import time
from pathlib import Path

from airflow_provider_torchx.core.schedulers.api import Stream
from airflow_provider_torchx.core.schedulers.local import LocalScheduler
from airflow_provider_torchx.core.specs import AppState, RetryPolicy
from tests.core.local.conftest import wait_gone
from tests.core.local.helpers import sh_app, wait_done, wait_for_line

#: Ignores SIGTERM and has a child and a grandchild that leaves the group: the grace period's
#: SIGKILL must reach the whole tree.
STUBBORN = "trap '' TERM; sleep 30 & (setsid sleep 30 &); echo ready; wait"

#: What the replicas printed (a restart's note goes to stderr: ``test_resume.py``).
STDOUT = Stream.STDOUT


def test_an_attempt_over_the_timeout_fails_the_job_and_leaves_no_process(sched: LocalScheduler, mark: str) -> None:
    t0 = time.monotonic()
    app_id = sched.submit(sh_app("sleep 30", STUBBORN), cfg={"attempt_timeout": 1})
    wait_for_line(sched, app_id, "r1", "ready")
    desc = wait_done(sched, app_id, timeout=15.0)
    took = time.monotonic() - t0
    assert desc.state == AppState.FAILED, desc
    assert desc.msg.startswith("role 'r0' replica 0 ran longer than attempt_timeout=1 (seconds) and was stopped"), desc
    replicas = {rs.role: rs.replicas[0] for rs in desc.roles_statuses}
    assert replicas["r0"].state == AppState.FAILED
    assert replicas["r0"].msg == "stopped: ran longer than attempt_timeout=1 (seconds)"
    assert replicas["r1"].state == AppState.CANCELLED  # stopped by fail-fast, SIGKILLed after the grace
    # 1 s, the grace period (2 s) for the stubborn tree, and the start-up: not the sleeps' 30 s
    assert took < 1 + sched.cancel_grace_period + 5.0, took
    assert wait_gone(mark, 5.0) == []


def test_a_job_within_the_timeout_is_untouched(sched: LocalScheduler) -> None:
    desc = wait_done(sched, sched.submit(sh_app("sleep 0.2; echo done"), cfg={"attempt_timeout": 30}))
    assert desc.state == AppState.SUCCEEDED and desc.num_restarts == 0, desc


def test_a_timed_out_attempt_is_retried_with_the_full_time_again(sched: LocalScheduler, tmp_path: Path) -> None:
    """The first attempt hangs past the 2 s timeout; the second, started after it, needs 0.5 s
    and succeeds: its clock started at its own start."""
    flag = tmp_path / "timed-out-once"
    script = f"echo run; if [ ! -f {flag} ]; then touch {flag}; sleep 30; fi; sleep 0.5"
    app = sh_app(script, "echo run; sleep 30", max_retries=1, retry_policy=RetryPolicy.APPLICATION)
    app.roles[1].args = ["-c", "echo run; sleep 1"]
    desc = wait_done(sched, sched.submit(app, cfg={"attempt_timeout": 2}))
    assert desc.state == AppState.SUCCEEDED and desc.num_restarts == 1, desc
    assert list(sched.log_iter(desc.app_id, "r0", streams=STDOUT)) == ["run\n", "run\n"]
    # the whole application restarted
    assert list(sched.log_iter(desc.app_id, "r1", streams=STDOUT)) == ["run\n", "run\n"]


def test_timed_out_attempts_use_up_the_retries_then_fail(sched: LocalScheduler, mark: str) -> None:
    app = sh_app("echo run; sleep 30", max_retries=1, retry_policy=RetryPolicy.REPLICA)
    desc = wait_done(sched, sched.submit(app, cfg={"attempt_timeout": 1}), timeout=20.0)
    assert desc.state == AppState.FAILED and desc.num_restarts == 1, desc
    assert (
        desc.msg
        == "role 'r0' replica 0 ran longer than attempt_timeout=1 (seconds) and was stopped (after 1 restart(s))"
    )
    assert list(sched.log_iter(desc.app_id, "r0", streams=STDOUT)) == ["run\n", "run\n"]
    assert wait_gone(mark, 5.0) == []
