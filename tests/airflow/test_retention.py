"""``[torchx] retain_finished``: a task that submits a local job prunes the store's jobs that
ended longer ago (never a live one), at most hourly; empty (the default) keeps everything. It
never removes a checkpoint; what ``prune --checkpoints`` asks Airflow of a location's task
instance (``checkpointing.task_states``) is read from the database."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_torchx.checkpointing import task_states
from airflow_provider_torchx.core import checkpoints
from airflow_provider_torchx.core.checkpoint_prune import TaskState
from airflow_provider_torchx.core.identity import TaskIdentity
from airflow_provider_torchx.core.runner import get_runner
from airflow_provider_torchx.core.schedulers.local.scheduler import LocalScheduler, create_cwd_scheduler
from airflow_provider_torchx.hooks.torchx import close_runners
from airflow_provider_torchx.retention import PRUNE_EVERY_S, apply_retention
from tests.core.local.helpers import sh_app, wait_done
from tests.fixtures.clock import FakeClock

pytestmark = pytest.mark.airflow


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A private job store with one job that ended and one that runs."""
    monkeypatch.setenv("AIRFLOW_TORCHX_STATE_DIR", str(tmp_path / "state"))
    sched = create_cwd_scheduler("torchx")
    ended = sched.submit(sh_app("echo old"))
    wait_done(sched, ended)
    live = sched.submit(sh_app("sleep 300"))
    time.sleep(1.1)  # the ended job is now older than 1 s
    yield sched, ended, live
    sched.cancel(live)
    wait_done(sched, live)


def _ids(sched: LocalScheduler) -> set[str]:
    return {a.app_id for a in sched.list()}


def test_a_task_prunes_what_ended_before_the_retention(
    run_dag: Any, store: Any, monkeypatch: pytest.MonkeyPatch, own_runners: None
) -> None:
    sched, ended, live = store
    monkeypatch.setenv("AIRFLOW__TORCHX__RETAIN_FINISHED", "1s")
    dag_run, out = run_dag("torchx_local_echo", deferrable=False)
    assert dag_run.state == "success", out[-3000:]
    assert "TorchX retention: removed 1 job(s) that ended over 1s ago" in out, out[-3000:]
    assert ended not in _ids(sched) and live in _ids(sched)

    again = sched.submit(sh_app("echo newer"))
    wait_done(sched, again)
    time.sleep(1.1)
    assert apply_retention(get_runner(), "local_cwd") == 0, "at most one prune an hour"
    assert again in _ids(sched)


def test_a_store_is_pruned_at_most_once_an_hour_of_the_clock(
    store: Any, monkeypatch: pytest.MonkeyPatch, fake_clock: FakeClock
) -> None:
    """The once-an-hour rule on a fake clock: a prune, none within the hour after it (a job
    that ended meanwhile stays), the next one an hour later; never the live job."""
    sched, ended, live = store
    monkeypatch.setenv("AIRFLOW__TORCHX__RETAIN_FINISHED", "1s")
    fake_clock.now = time.time()
    assert apply_retention(get_runner(), "local_cwd", clock=fake_clock.clock) == 1 and ended not in _ids(sched)
    again = sched.submit(sh_app("echo newer"))
    wait_done(sched, again)
    time.sleep(1.1)  # older than the retention (the store's prune reads the system's time)
    fake_clock.advance(PRUNE_EVERY_S - 1)
    assert apply_retention(get_runner(), "local_cwd", clock=fake_clock.clock) == 0 and again in _ids(sched)
    fake_clock.advance(1)
    assert apply_retention(get_runner(), "local_cwd", clock=fake_clock.clock) == 1
    assert again not in _ids(sched) and live in _ids(sched)


def test_off_by_default_and_a_bad_value_is_logged(
    store: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    sched, ended, live = store
    monkeypatch.delenv("AIRFLOW__TORCHX__RETAIN_FINISHED", raising=False)
    assert apply_retention(get_runner(), "local_cwd") == 0 and ended in _ids(sched)
    monkeypatch.setenv("AIRFLOW__TORCHX__RETAIN_FINISHED", "a month")
    with caplog.at_level(logging.WARNING):
        assert apply_retention(get_runner(), "local_cwd") == 0
    assert "[torchx] retain_finished: 'a month' is not a duration" in caplog.text
    assert apply_retention(get_runner(), "aws_batch") == 0 and {ended, live} <= _ids(sched)


@pytest.fixture
def own_runners() -> Iterator[None]:
    """The shared runners a DAG run of the test builds use its store: none before it, and none
    left after it for the next tests (whose jobs live in another store)."""
    close_runners()
    yield
    close_runners()


def test_retention_never_removes_a_checkpoint_and_the_database_tells_a_locations_task(
    run_dag: Any, store: Any, monkeypatch: pytest.MonkeyPatch, own_runners: None
) -> None:
    """``utils.echo`` leaves no checkpoint directory (only its owner-only parents); a location
    written long ago by a finished task instance outlives the prune of its jobs; and the
    reader ``prune --checkpoints`` uses reads the task instance and its DAG run."""
    sched, _, _ = store
    dag_run, out = run_dag("torchx_local_echo", deferrable=False)
    assert dag_run.state == "success", out[-3000:]
    identity = TaskIdentity("torchx_local_echo", "echo", dag_run.run_id)
    assert len(sched.list(labels=identity.labels())) == 1
    location = Path(dag_run.get_task_instance("echo").xcom_pull(task_ids="echo", key="checkpoint_dir"))
    assert location.name == "echo" and checkpoints.checkpoint_dir(str(location.parents[2]), identity) == str(location)
    assert location.parent.is_dir() and not location.exists(), "a job that never saves creates nothing"
    assert oct(location.parent.stat().st_mode & 0o777) == "0o700"
    location.mkdir()
    (location / "step-1.pt").write_bytes(b"w")
    for path in (location / "step-1.pt", location):
        os.utime(path, (1, 1))
    monkeypatch.setenv("AIRFLOW__TORCHX__RETAIN_FINISHED", "1s")
    time.sleep(1.1)
    assert apply_retention(get_runner(), "local_cwd") >= 1
    assert not sched.list(labels=identity.labels()) and (location / "step-1.pt").exists()

    gone_run = identity._replace(run_id="no_such_run")
    no_dag = TaskIdentity("no_such_dag", "echo", dag_run.run_id)
    states = task_states([identity, gone_run, no_dag])
    assert states[gone_run] == TaskState(dag_known=True) and states[no_dag] == TaskState(dag_known=False)
    mine = states[identity]
    assert (mine.dag_known, mine.run_state, mine.ti_found, mine.ti_state) == (True, "success", True, "success")
    assert mine.run_ended_at == dag_run.end_date.timestamp()


def test_a_plugin_scheduler_with_the_prune_capability_is_pruned_through_the_contract(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``acme`` (``tests/plugin``) declares ``prune``: retention calls its ``Scheduler.prune``
    (no local store involved), once an hour per scheduler: a local prune just before does not
    hold it back, and its own prune holds back its next one."""
    from airflow_provider_torchx.core.runner import Runner
    from tests.plugin.acme_scheduler import create_scheduler

    monkeypatch.setenv("AIRFLOW_TORCHX_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("ACME_JOBS_DIR", str(tmp_path / "acme"))
    monkeypatch.setenv("AIRFLOW__TORCHX__RETAIN_FINISHED", "1s")
    runner = Runner("torchx", {"acme": create_scheduler, "local_cwd": create_cwd_scheduler})
    old, live = runner.run(sh_app("echo old"), "acme"), runner.run(sh_app("sleep 300"), "acme")
    runner.wait(old, wait_interval=0.1)
    time.sleep(1.1)
    assert apply_retention(runner, "local_cwd") == 0, "nothing of the local store ended"
    assert apply_retention(runner, "acme") == 1
    assert [a.app_handle for a in runner.list("acme")] == [live], "the ended job's directory is gone"
    done = runner.run(sh_app("echo newer"), "acme")
    runner.wait(done, wait_interval=0.1)
    time.sleep(1.1)
    assert apply_retention(runner, "acme") == 0 and len(runner.list("acme")) == 2, "at most one prune an hour"
    runner.cancel(live)


def test_a_scheduler_that_cannot_reach_its_cluster_is_skipped_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Retention runs after the job was submitted: a Slurm controller (or client) out of reach
    at that moment is a warning, never the task's failure."""
    from airflow_provider_torchx.core.runner import Runner
    from airflow_provider_torchx.core.schedulers.slurm import record
    from airflow_provider_torchx.core.schedulers.slurm.commands import SlurmCommands
    from airflow_provider_torchx.core.schedulers.slurm.scheduler import SlurmScheduler

    monkeypatch.setenv("AIRFLOW_TORCHX_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("AIRFLOW__TORCHX__RETAIN_FINISHED", "1s")
    index = record.JobIndex(tmp_path / "index")
    record.write_json(str(tmp_path / "jobs" / "7" / record.JOB_FILE), {"name": "t", "roles": []})
    index.add("7", str(tmp_path / "jobs" / "7"))  # a job this host submitted: prune asks Slurm
    no_commands = SlurmCommands(env={"PATH": str(tmp_path)})
    runner = Runner("torchx", {"slurm": lambda name, **kw: SlurmScheduler(name, commands=no_commands, index=index)})
    with caplog.at_level(logging.WARNING):
        assert apply_retention(runner, "slurm") == 0
    assert "TorchX retention (retain_finished=1s) skipped: slurm: squeue is not installed" in caplog.text
    assert (tmp_path / "jobs" / "7" / record.JOB_FILE).is_file()
