"""Reclaim to resume on one box: a replica killed from outside is restarted with the same
``TORCHX_CHECKPOINT_DIR`` and the next ``TORCHX_ATTEMPT``, and the job says why it restarted."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from airflow_provider_torchx.core import checkpoints
from airflow_provider_torchx.core.schedulers.api import Stream
from airflow_provider_torchx.core.schedulers.local import LocalScheduler
from airflow_provider_torchx.core.schedulers.local.supervisor import RESTART_PREFIX
from airflow_provider_torchx.core.specs import AppState, RetryPolicy
from tests.core.local.helpers import sh_app, wait_done


def _pid_when_written(path: Path, timeout: float = 20.0) -> int:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.02)
    return int(path.read_text())


def test_sigkilled_replica_restarts_with_the_same_dir_and_the_next_attempt(
    sched: LocalScheduler, tmp_path: Path
) -> None:
    location = str(tmp_path / "ckpt" / "dag" / "run" / "task")
    pid_file = tmp_path / "pid-${replica_id}"
    script = (
        'echo "attempt=$TORCHX_ATTEMPT dir=$TORCHX_CHECKPOINT_DIR"; '
        f'if [ "$TORCHX_ATTEMPT" = 0 ]; then echo $$$$ > {pid_file}; exec sleep 60; fi'
    )
    app = sh_app(script, max_retries=1, retry_policy=RetryPolicy.APPLICATION)
    app.roles[0].num_replicas = 2
    checkpoints.place(app, location, 0, host_paths=True)
    app_id = sched.submit(app)
    victim, _ = _pid_when_written(tmp_path / "pid-0"), _pid_when_written(tmp_path / "pid-1")  # both running
    os.kill(victim, signal.SIGKILL)  # as a host reclaim or the OOM killer
    desc = wait_done(sched, app_id)
    assert desc.state == AppState.SUCCEEDED and desc.num_restarts == 1, desc
    assert "replica 0 was killed by SIGKILL" in desc.msg and "restart 1/1" in desc.msg, desc.msg
    assert desc.checkpoint_dir == location
    why = "role 'r0' replica 0 was killed by SIGKILL (exit code -9); restart 1/1 of role 'r0' (APPLICATION)"
    for k in (0, 1):  # the log says the replica restarted, as which attempt and why
        assert list(sched.log_iter(app_id, "r0", k)) == [
            f"attempt=0 dir={location}\n",
            f"{RESTART_PREFIX} 1: {why}\n",
            f"attempt=1 dir={location}\n",
        ]


def test_attempts_count_on_from_the_requested_one(sched: LocalScheduler, tmp_path: Path) -> None:
    """The request's ``TORCHX_ATTEMPT`` (the earlier jobs' attempts) plus this job's restarts;
    without one the first attempt is 0."""
    flag = tmp_path / "failed-once"
    script = f'echo "attempt=$TORCHX_ATTEMPT"; if [ ! -f {flag} ]; then touch {flag}; exit 1; fi'
    app = sh_app(script, max_retries=1, retry_policy=RetryPolicy.REPLICA)
    checkpoints.place(app, None, 2, host_paths=True)
    app_id = sched.submit(app)
    assert wait_done(sched, app_id).state == AppState.SUCCEEDED
    assert list(sched.log_iter(app_id, "r0", streams=Stream.STDOUT)) == ["attempt=2\n", "attempt=3\n"]
    plain = sched.submit(sh_app('echo "attempt=$TORCHX_ATTEMPT"'))
    assert wait_done(sched, plain).state == AppState.SUCCEEDED
    assert list(sched.log_iter(plain, "r0")) == ["attempt=0\n"]


def test_default_root_is_beside_the_job_store(sched: LocalScheduler, state_dir: Path) -> None:
    assert sched.default_checkpoint_root() == str(state_dir / "checkpoints")
