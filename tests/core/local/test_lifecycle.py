"""Jobs outlive their launcher; cancel, delete and supervisor death leave no process behind."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from airflow_provider_torchx.core.schedulers.api import CancelledBy
from airflow_provider_torchx.core.schedulers.local import LocalScheduler, create_cwd_scheduler, procfs, store
from airflow_provider_torchx.core.specs import AppState
from tests.core.local.conftest import marked_processes, no_jobs_on_disk, wait_gone
from tests.core.local.helpers import sh_app, wait_done, wait_for_line, wait_running

REPO = str(Path(__file__).resolve().parents[3])
# A replica that ignores SIGTERM and has a child and a grandchild (which leaves the group).
STUBBORN = "trap '' TERM; sleep 300 & (setsid sleep 300 &); echo ready; wait"


def test_cancel_kills_the_whole_tree_sigterm_then_sigkill(sched: LocalScheduler, mark: str) -> None:
    app_id = sched.submit(sh_app(STUBBORN, "sleep 300", num_replicas=2))
    wait_running(sched, app_id)
    wait_for_line(sched, app_id, "r0", "ready")
    assert len(marked_processes(mark)) >= 7  # supervisor + 4 replicas + children
    t0 = time.monotonic()
    sched.cancel(app_id, reason="airflow-torchx cancel by alice")
    assert time.monotonic() - t0 < 2.0  # returns before the grace period is over
    desc = wait_done(sched, app_id)
    assert desc.state == AppState.CANCELLED and desc.cancel_requested
    assert desc.cancel_reason == "airflow-torchx cancel by alice"
    assert desc.msg.startswith("cancelled by request: airflow-torchx cancel by alice"), desc.msg
    assert all(r.state == AppState.CANCELLED for rs in desc.roles_statuses for r in rs.replicas)
    assert wait_gone(mark, 5.0) == []
    assert time.monotonic() - t0 < sched.cancel_grace_period + 5.0
    sched.cancel(app_id)  # idempotent on a terminal job
    assert sched.describe(app_id).state == AppState.CANCELLED  # type: ignore[union-attr]


def test_who_cancelled_is_a_field_of_the_cancel_record(sched: LocalScheduler) -> None:
    """``by`` is kept in ``cancel.json`` and read back as ``cancelled_by``; a record without it
    reads as not said, one with a value outside the vocabulary is corrupt."""
    app_id = sched.submit(sh_app("sleep 300"))
    wait_running(sched, app_id)
    sched.cancel(app_id, by=CancelledBy.USER)
    desc = wait_done(sched, app_id)
    assert (desc.state, desc.cancelled_by, desc.cancel_reason) == (AppState.CANCELLED, CancelledBy.USER, None)
    assert desc.msg.startswith("cancelled by request of the user"), desc.msg
    path = sched.job_dir(app_id) / store.CANCEL
    record = json.loads(path.read_text())
    assert record["by"] == "user"
    path.write_text(json.dumps({k: v for k, v in record.items() if k != "by"}))
    assert sched.describe(app_id).cancelled_by is None  # type: ignore[union-attr]
    path.write_text(json.dumps(record | {"by": "someone"}))
    with pytest.raises(store.CorruptEntryError, match="'by' is 'someone', not one of task, reaper, user or null"):
        sched.describe(app_id)


def test_cancel_of_unknown_or_malformed_ids_does_nothing(sched: LocalScheduler, state_dir: Path) -> None:
    sched.cancel("nope-123")
    sched.cancel("../etc")
    sched.delete("nope-123")
    assert sched.describe("nope-123") is None and sched.describe("a/b") is None
    assert no_jobs_on_disk(state_dir)


def test_supervisor_death_kills_the_replicas_and_fails_the_job(sched: LocalScheduler, mark: str) -> None:
    app_id = sched.submit(sh_app(STUBBORN, num_replicas=2))
    wait_running(sched, app_id)
    wait_for_line(sched, app_id, "r0", "ready")
    sup = json.loads((sched.job_dir(app_id) / "supervisor.json").read_text())
    assert procfs.signal_if_same(sup["pid"], sup["start"], signal.SIGKILL)
    desc = wait_done(sched, app_id)
    assert desc.state == AppState.FAILED and "supervisor" in desc.msg and "died" in desc.msg
    assert wait_gone(mark, 5.0) == []


LAUNCHER = textwrap.dedent(
    """
    import os, signal, sys
    from airflow_provider_torchx.core.schedulers.local import create_cwd_scheduler
    from tests.core.local.helpers import sh_app
    sched = create_cwd_scheduler("launcher")
    ids = [sched.submit(sh_app(script)) for script in sys.argv[1:]]
    print(" ".join(ids), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def launch_and_die(*scripts: str) -> list[str]:
    """Submit one job per script from a process that then SIGKILLs itself."""
    proc = subprocess.run(
        [sys.executable, "-c", LAUNCHER, *scripts], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    return proc.stdout.split()


def test_jobs_outlive_a_sigkilled_launcher(sched: LocalScheduler, mark: str) -> None:
    tailed, cancelled = launch_and_die("for i in 1 2 3 4 5; do echo line $i; sleep 0.1; done", STUBBORN)
    # describe and tail from this process, to the end
    lines = list(sched.log_iter(tailed, "r0", should_tail=True))
    assert lines == [f"line {i}\n" for i in range(1, 6)]
    desc = sched.describe(tailed)
    assert desc is not None and desc.state == AppState.SUCCEEDED
    # cancel the other one from this process
    wait_running(sched, cancelled)
    sched.cancel(cancelled)
    assert wait_done(sched, cancelled).state == AppState.CANCELLED
    assert wait_gone(mark, 5.0) == []


CONCURRENT = textwrap.dedent(
    """
    from airflow_provider_torchx.core.schedulers.local import create_cwd_scheduler
    from tests.core.local.helpers import sh_app
    sched = create_cwd_scheduler("many")
    print(" ".join(sched.submit(sh_app("echo $$", name="same")) for _ in range(5)))
    """
)


def test_twenty_jobs_from_four_processes_get_distinct_ids_and_complete(sched: LocalScheduler) -> None:
    procs = [
        subprocess.Popen([sys.executable, "-c", CONCURRENT], stdout=subprocess.PIPE, text=True, cwd=REPO)
        for _ in range(4)
    ]
    ids = []
    for p in procs:
        out, _ = p.communicate(timeout=60)
        assert p.returncode == 0
        ids += out.split()
    assert len(ids) == 20 and len(set(ids)) == 20
    for app_id in ids:
        assert wait_done(sched, app_id).state == AppState.SUCCEEDED
    assert {r.app_id for r in sched.list()} == set(ids)


def test_delete_cancels_a_running_job_and_removes_it(sched: LocalScheduler, mark: str, state_dir: Path) -> None:
    running = sched.submit(sh_app("sleep 300"))
    done = sched.submit(sh_app("true"))
    other = create_cwd_scheduler("other")
    assert wait_done(other, done).state == AppState.SUCCEEDED
    wait_running(sched, running)
    sched.delete(running)
    sched.delete(done)
    assert sched.describe(running) is None and sched.describe(done) is None
    assert other.describe(done) is None  # it had the job cached; the store is the truth
    assert no_jobs_on_disk(state_dir)
    assert wait_gone(mark, 5.0) == []
    with pytest.raises(ValueError, match="no app"):
        sched.read_log(done, "r0")


def test_signals_go_only_to_the_same_process() -> None:
    proc = subprocess.Popen(["sleep", "30"])
    try:
        start = procfs.start_time(proc.pid)
        assert start is not None
        assert not procfs.signal_if_same(proc.pid, start + 1, signal.SIGTERM)  # a "reused" pid
        time.sleep(0.1)
        assert proc.poll() is None and psutil.pid_exists(proc.pid)
        assert procfs.signal_if_same(proc.pid, start, signal.SIGTERM)
        assert proc.wait(5) == -signal.SIGTERM
        assert not procfs.is_alive(proc.pid, start)
    finally:
        proc.kill()
        proc.wait()


def test_a_job_cancelled_right_after_submit_ends_cancelled(mark: str) -> None:
    sched = create_cwd_scheduler("test", cancel_grace_period=2.0)
    app_id = sched.submit(sh_app("sleep 30"))
    sched.cancel(app_id)
    desc = wait_done(sched, app_id)
    assert desc.state == AppState.CANCELLED and desc.cancel_requested


def test_a_job_of_another_host_in_a_shared_store_is_reported_not_judged(sched: LocalScheduler, mark: str) -> None:
    app_id = sched.submit(sh_app("sleep 300"))
    wait_running(sched, app_id)
    request = sched.job_dir(app_id) / "request.json"
    record = json.loads(request.read_text())
    record["host"] = "elsewhere"
    request.write_text(json.dumps(record))
    sup = json.loads((sched.job_dir(app_id) / "supervisor.json").read_text())
    assert procfs.signal_if_same(sup["pid"], sup["start"], signal.SIGKILL)  # as if its pid meant nothing here
    time.sleep(0.2)
    remote = create_cwd_scheduler("other")
    desc = remote.describe(app_id)
    assert desc is not None and desc.state == AppState.RUNNING  # what was recorded; no pid check
    with pytest.raises(RuntimeError, match="'elsewhere'"):
        remote.cancel(app_id)
    t0 = time.monotonic()
    remote.wait_for_change(app_id, 0.2)  # sleeps: no process of that host to watch
    assert time.monotonic() - t0 >= 0.15
    record["host"] = socket.gethostname()
    request.write_text(json.dumps(record))
    desc = create_cwd_scheduler("local").finalize(app_id)  # back on its host: judged and stopped
    assert desc is not None and desc.state == AppState.FAILED and "died" in desc.msg
