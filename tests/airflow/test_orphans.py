"""The orphaned-jobs decision table (``orphans.decide``): one test per row of its docstring,
plus the setting and the grace period; the settings' checks; ``reaper.apply`` on real local
jobs."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

import psutil
import pytest

from airflow_provider_torchx.core.identity import TaskIdentity
from airflow_provider_torchx.core.runner import Runner
from airflow_provider_torchx.core.schedulers.api import CancelledBy
from airflow_provider_torchx.core.specs import AppDef, AppState, Role
from airflow_provider_torchx.orphans import Decision, JobView, Killed, TaskView, Verdict, decide, task_name
from tests.fixtures.clock import FakeClock

pytestmark = pytest.mark.airflow_line  # the listeners and the reaper

NOW = 10_000.0
LABELS = {"airflow.dag_id": "acc", "airflow.task_id": "job", "airflow.run_id": "r1", "airflow.map_index": "-1"}
IDENTITY = TaskIdentity("acc", "job", "r1")


def task(state: str | None, run_state: str | None = "running", **kw: object) -> TaskView:
    values: dict[str, object] = {"dag_known": True, "run_state": run_state, "found": True, "state": state}
    values |= {"try_number": 1, "try_started_at": NOW - 300, "ended_at": NOW - 120}
    values |= kw
    return TaskView(**values)  # type: ignore[arg-type]


def job(state: AppState = AppState.RUNNING, labels: dict[str, str] | None = None, **kw: object) -> JobView:
    identity = TaskIdentity.from_labels(LABELS if labels is None else labels)
    return JobView(state=state, identity=identity, created=NOW - 290, **kw)  # type: ignore[arg-type]


def verdict_of(t: TaskView | None, j: JobView | None = None, **kw: object) -> Decision:
    options: dict[str, object] = {"enabled": True, "grace": 30.0, "now": NOW} | kw
    return decide(t, j or job(), **options)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "state", ["up_for_retry", "up_for_reschedule", "scheduled", "queued", "running", "deferred", "restarting"]
)
def test_a_state_a_try_adopts_from_keeps_the_job(state: str) -> None:
    decision = verdict_of(task(state))
    assert decision.verdict == Verdict.KEEP and not decision.orphaned, decision


def test_no_state_keeps_the_job_its_next_try_adopts() -> None:
    """Cleared: the task instance has no state until its new try is scheduled."""
    decision = verdict_of(task(None, try_started_at=None, ended_at=None))
    assert decision.verdict == Verdict.KEEP and not decision.orphaned, decision


@pytest.mark.parametrize("state", ["failed", "success", "skipped", "removed", "upstream_failed"])
def test_an_ended_task_cancels_its_job(state: str) -> None:
    decision = verdict_of(task(state))
    assert decision == Decision(Verdict.CANCEL, f"task_{state}", f"task acc.job of run r1 ended {state}")


@pytest.mark.parametrize("state", ["success", "failed"])
@pytest.mark.parametrize("run_state", ["running", "success", "failed"])
def test_a_job_its_task_disowned_outlives_the_task(state: str, run_state: str) -> None:
    """``wait_for_completion=False`` (the task succeeds while its job runs on, for a sensor) or
    ``cancel_on_kill=False``: never cancelled with the task, marked or not."""
    for marked in (False, True):
        decision = verdict_of(task(state, run_state=run_state, disowned=True, marked=marked))
        assert decision.verdict == Verdict.KEEP and not decision.orphaned, decision


def test_a_state_a_user_set_reads_marked() -> None:
    decision = verdict_of(task("failed", marked=True))
    assert decision.detail == "task acc.job of run r1 was marked failed", decision
    run = verdict_of(task(None, run_state="failed", marked=True))
    assert run.detail == "task acc.job of run r1: its DAG run was marked failed", run


@pytest.mark.parametrize("run_state", ["failed", "success"])
def test_an_ended_dag_run_cancels_the_job_of_a_task_left_in_any_state(run_state: str) -> None:
    decision = verdict_of(task("deferred", run_state=run_state))
    assert decision.verdict == Verdict.CANCEL and decision.reason == f"dag_run_{run_state}", decision
    assert decision.detail == f"task acc.job of run r1: its DAG run ended {run_state}"


def test_a_deleted_dag_run_cancels_its_jobs() -> None:
    decision = verdict_of(TaskView(dag_known=True, run_state=None, found=False), first_seen=NOW - 31)
    assert decision.verdict == Verdict.CANCEL and decision.reason == "dag_run_deleted", decision


def test_a_cleared_task_whose_new_try_submitted_another_job_cancels_the_old_one() -> None:
    t = task("deferred", try_number=2, try_started_at=NOW - 60, ended_at=None)
    decision = verdict_of(t, job(newest_sibling_created=NOW - 50), first_seen=NOW - 40)
    assert decision.verdict == Verdict.CANCEL and decision.reason == "superseded", decision
    assert "try 2 submitted another job" in decision.detail


def test_the_newest_job_of_the_current_try_is_kept() -> None:
    t = task("running", try_number=2, try_started_at=NOW - 60, ended_at=None)
    newest = JobView(AppState.RUNNING, IDENTITY, created=NOW - 50, newest_sibling_created=NOW - 290)
    assert verdict_of(t, newest).verdict == Verdict.KEEP


def test_a_newer_job_from_before_the_current_try_does_not_supersede() -> None:
    """Both jobs predate the try: it has not chosen yet (it adopts the live one or fails)."""
    t = task("running", try_number=3, try_started_at=NOW - 10, ended_at=None)
    assert verdict_of(t, job(newest_sibling_created=NOW - 100)).verdict == Verdict.KEEP


def test_a_job_without_airflow_labels_is_never_touched() -> None:
    for labels in ({}, {"team": "ml"}, {**LABELS, "airflow.map_index": "x"}, {**LABELS, "airflow.run_id": ""}):
        decision = verdict_of(task("failed"), job(labels=labels))
        assert decision.verdict == Verdict.KEEP and not decision.orphaned, (labels, decision)


REFUSED = "job 'app-1': /store/app-1/request.json is corrupt (refused: it is a symbolic link)"


def test_a_refused_job_naming_no_task_is_cancelled_once_its_grace_passed() -> None:
    """Row "record refused, no identity labels readable": nothing can read or watch such a
    job, whoever submitted it: an orphan, cancelled once the grace passed since first seen
    (kept, still an orphan, with the setting off)."""
    refused = job(AppState.UNKNOWN, labels={}, refused=REFUSED)
    decision = verdict_of(None, refused, first_seen=NOW - 5)
    assert decision.verdict == Verdict.LATER and decision.reason == "record_refused", decision
    decision = verdict_of(None, refused, first_seen=NOW - 30)
    assert decision.verdict == Verdict.CANCEL and decision.reason == "record_refused", decision
    assert decision.detail.startswith("its record is refused and names no task instance") and REFUSED in decision.detail
    off = verdict_of(None, refused, first_seen=NOW - 30, enabled=False)
    assert off.verdict == Verdict.KEEP and off.orphaned, off


@pytest.mark.parametrize(("state", "verdict"), [("failed", Verdict.CANCEL), ("deferred", Verdict.KEEP)])
def test_a_refused_job_with_readable_labels_goes_through_the_rows(state: str, verdict: Verdict) -> None:
    """A job whose record is refused but whose labels could still be read is judged by its
    task instance as any other (its task's own components stop it when they find it so)."""
    assert verdict_of(task(state), job(AppState.UNKNOWN, refused=REFUSED)).verdict == verdict


@pytest.mark.parametrize("state", [AppState.SUCCEEDED, AppState.FAILED, AppState.CANCELLED])
def test_an_ended_job_is_left_alone(state: AppState) -> None:
    assert verdict_of(task("failed"), job(state)).verdict == Verdict.KEEP


def test_an_unreadable_state_asks_again_later() -> None:
    decision = verdict_of(None)
    assert decision.verdict == Verdict.LATER and not decision.orphaned, decision


def test_labels_naming_no_known_dag_ask_again_later() -> None:
    decision = verdict_of(TaskView(dag_known=False, run_state=None, found=False))
    assert decision.verdict == Verdict.LATER and not decision.orphaned, decision


def test_labels_naming_no_task_of_the_run_ask_again_later() -> None:
    decision = verdict_of(TaskView(dag_known=True, run_state="running", found=False))
    assert decision.verdict == Verdict.LATER and not decision.orphaned, decision


def test_a_state_outside_the_table_asks_again_later() -> None:
    assert verdict_of(task("some_future_state")).verdict == Verdict.LATER


def test_within_the_grace_period_an_orphan_waits() -> None:
    decision = verdict_of(task("failed", ended_at=NOW - 10))
    assert decision.verdict == Verdict.LATER and decision.reason == "task_failed", decision
    assert verdict_of(task("failed", ended_at=NOW - 10), grace=10).verdict == Verdict.CANCEL


def test_the_grace_period_counts_from_first_seen_without_an_end_date() -> None:
    t = task("failed", ended_at=None)
    assert verdict_of(t, first_seen=NOW - 5).verdict == Verdict.LATER
    assert verdict_of(t, first_seen=NOW - 30).verdict == Verdict.CANCEL
    assert verdict_of(t).verdict == Verdict.LATER  # first seen now


def test_a_zero_grace_cancels_at_once() -> None:
    assert verdict_of(task("success", ended_at=NOW), grace=0).verdict == Verdict.CANCEL


def test_with_the_setting_off_an_orphan_is_kept_but_still_reported() -> None:
    decision = verdict_of(task("failed"), enabled=False)
    assert decision.verdict == Verdict.KEEP and decision.orphaned and decision.reason == "task_failed", decision


def test_identity_and_names_of_mapped_tasks() -> None:
    labels = {**LABELS, "airflow.map_index": "3"}
    assert TaskIdentity.from_labels(labels) == ("acc", "job", "r1", 3)
    assert TaskIdentity.from_labels(labels).labels() == labels  # type: ignore[union-attr]
    assert task_name(TaskIdentity.from_labels(labels)) == "task acc.job[3] of run r1"
    assert task_name(IDENTITY) == "task acc.job of run r1"
    assert task_name(None) == "an unlabelled job"


# Killed: the task's own kill or cancel hook fired (the trigger's, or the operator's in the worker).
IN_TRIGGER, IN_WORKER = Killed(), Killed(in_worker=True)


@pytest.mark.parametrize("killed", [IN_TRIGGER, IN_WORKER], ids=["trigger", "worker"])
@pytest.mark.parametrize("state", ["failed", "deferred", None])
def test_killed_with_cancel_on_kill_off_keeps_the_job(killed: Killed, state: str | None) -> None:
    off = Killed(in_worker=killed.in_worker, cancel_on_kill=False)
    for t in (task(state), None):
        decision = verdict_of(t, killed=off)
        assert decision.verdict == Verdict.KEEP and not decision.orphaned, decision


def test_killed_in_the_trigger_with_an_unreadable_state_leaves_the_job_to_the_reaper() -> None:
    decision = verdict_of(None, killed=IN_TRIGGER)
    assert decision.verdict == Verdict.LATER and not decision.orphaned, decision


def test_killed_in_the_worker_without_a_state_at_hand_cancels_at_once() -> None:
    decision = verdict_of(None, killed=IN_WORKER, enabled=False)
    assert decision == Decision(Verdict.CANCEL, "killed", "task acc.job of run r1 was killed"), decision


def test_killed_while_still_deferred_keeps_the_job() -> None:
    """A triggerer restart or reassignment (Airflow 3.1/3.2 cancel the trigger then too)."""
    decision = verdict_of(TaskView.of_state("deferred", marked=True), killed=IN_TRIGGER)
    assert decision.verdict == Verdict.KEEP and not decision.orphaned, decision
    assert decision.why == "task instance still deferred: a triggerer restart or reassignment"


@pytest.mark.parametrize("state", [None, "restarting", "up_for_retry", "queued", "scheduled"])
def test_killed_when_cleared_or_retrying_keeps_the_job_for_the_next_try(state: str | None) -> None:
    """The next try adopts the job by its identity labels, or submits another one and the
    ``superseded`` row cancels this one."""
    decision = verdict_of(TaskView.of_state(state, marked=True), killed=IN_TRIGGER)
    assert decision.verdict == Verdict.KEEP and not decision.orphaned, decision


@pytest.mark.parametrize("state", ["failed", "success", "skipped", "removed", "upstream_failed"])
def test_killed_in_an_ended_state_cancels_at_once_whatever_the_setting(state: str) -> None:
    """The kill is the user's intent: no grace, and ``cancel_orphaned_jobs`` off changes nothing."""
    for enabled in (True, False):
        decision = verdict_of(TaskView.of_state(state, marked=True), killed=IN_TRIGGER, enabled=enabled, grace=600)
        expected = Decision(Verdict.CANCEL, f"task_{state}", f"task acc.job of run r1 was marked {state}")
        assert decision == expected, decision


def test_killed_keeps_what_the_table_never_touches() -> None:
    """No identity labels, an ended job, a job its task disowned, a state outside the table."""
    assert verdict_of(None, job(labels={}), killed=IN_WORKER).verdict == Verdict.KEEP
    assert verdict_of(None, job(AppState.SUCCEEDED), killed=IN_WORKER).verdict == Verdict.KEEP
    assert verdict_of(task("failed", disowned=True), killed=IN_TRIGGER).verdict == Verdict.KEEP
    assert verdict_of(task("some_future_state"), killed=IN_TRIGGER).verdict == Verdict.LATER


def test_what_a_trigger_reads_is_its_task_instances_state_alone() -> None:
    view = TaskView.of_state("failed")
    assert (view.dag_known, view.found, view.run_state) == (True, True, "running")
    assert (view.state, view.marked) == ("failed", False)
    assert verdict_of(view, grace=0).detail == "task acc.job of run r1 ended failed"


def test_the_settings_are_declared_with_their_defaults_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_torchx.provider_info import get_provider_info
    from airflow_provider_torchx.reaper.settings import ReaperSettings, reaper_settings

    options = get_provider_info()["config"]["torchx"]["options"]
    assert (options["cancel_orphaned_jobs"]["type"], options["cancel_orphaned_jobs"]["default"]) == ("boolean", "True")
    assert (options["orphan_grace"]["type"], options["orphan_grace"]["default"]) == ("float", "30")
    assert reaper_settings() == ReaperSettings(enabled=True, grace=30.0)
    monkeypatch.setenv("AIRFLOW__TORCHX__CANCEL_ORPHANED_JOBS", "False")
    monkeypatch.setenv("AIRFLOW__TORCHX__ORPHAN_GRACE", "45")
    assert reaper_settings() == ReaperSettings(enabled=False, grace=45.0)
    for bad in ("soon", "-1", "nan"):
        monkeypatch.setenv("AIRFLOW__TORCHX__ORPHAN_GRACE", bad)
        with pytest.raises(ValueError, match=rf"\[torchx\] orphan_grace: '{bad}'"):
            reaper_settings()


def test_apply_cancels_an_orphan_with_its_reason_and_leaves_the_others(local_jobs: tuple[Runner, list[str]]) -> None:
    """``reaper.apply`` on real local jobs: the orphan ends CANCELLED with the table's sentence
    as its cancel reason; the job a try adopts and the one still in its grace run on."""
    from airflow_provider_torchx.reaper.decisions import apply
    from airflow_provider_torchx.reaper.listing import LiveJob
    from airflow_provider_torchx.reaper.settings import ReaperSettings

    runner, handles = local_jobs
    app = AppDef(name="reap", roles=[Role(name="w", image="local", entrypoint="sh", args=["-c", "sleep 60"])])
    runs = {name: {**LABELS, "airflow.run_id": name} for name in ("ended", "adopted", "in_grace")}
    for labels in runs.values():
        handles.append(runner.run(app, "local_cwd", labels=labels))
    jobs = [
        LiveJob(h, "local_cwd", None, AppState.RUNNING, labels, time.time())
        for h, labels in zip(handles, runs.values(), strict=True)
    ]
    now = time.time()
    views = {
        ("acc", "job", "ended", -1): task("failed", ended_at=now - 31),
        ("acc", "job", "adopted", -1): task("up_for_retry"),
        ("acc", "job", "in_grace", -1): task("failed", ended_at=now - 5),
    }
    decisions = apply(jobs, views, settings=ReaperSettings(True, 30.0), now=now, where="test")
    assert [d.verdict for _, d in decisions] == [Verdict.CANCEL, Verdict.KEEP, Verdict.LATER]
    ended = runner.wait(handles[0], wait_interval=0.2, timeout=30, cancel_on_signal=False)
    assert ended is not None and ended.state == AppState.CANCELLED
    desc = runner.describe_app(handles[0])
    assert desc is not None and desc.cancel_reason == "task acc.job of run ended ended failed", desc
    assert desc.cancelled_by == CancelledBy.REAPER, desc
    for handle in handles[1:]:
        status = runner.describe_app(handle)
        assert status is not None and not status.state.is_terminal() and not status.cancel_requested, status


def test_the_reconciling_loop_takes_its_time_from_its_clock(
    monkeypatch: pytest.MonkeyPatch, fake_clock: FakeClock
) -> None:
    """On a fake clock: a round with an orphan in its grace asks for the next round when the
    grace ends; the loop waits what a round says, in half-second sleeps of its clock."""
    from airflow_provider_torchx.reaper import loop
    from airflow_provider_torchx.reaper.listing import LiveJob
    from airflow_provider_torchx.reaper.settings import ReaperSettings

    live = LiveJob("local_cwd://torchx/j", "local_cwd", None, AppState.RUNNING, LABELS, fake_clock.now - 300)
    ended = fake_clock.now - 25
    monkeypatch.setattr(loop, "reaper_settings", lambda: ReaperSettings(True, 30.0))
    monkeypatch.setattr(loop, "live_jobs", lambda: [live])
    monkeypatch.setattr(loop, "read_task_views", lambda ids: {live.identity: task("failed", ended_at=ended)})
    reconciler = loop.Reconciler(clock=fake_clock.clock)
    assert reconciler.round() == pytest.approx(5.1)  # the grace ends 5 s from now (+0.1)

    rounds: list[float] = []
    monkeypatch.setattr(reconciler, "round", lambda: rounds.append(fake_clock.now) or 3.0)
    reconciler.run(alive=lambda: len(rounds) < 3)
    assert rounds == [1000.0, 1003.0, 1006.0] and fake_clock.slept == [0.5] * 12


def test_no_reaping_thread_in_a_process_with_a_task_sdk_channel(monkeypatch: pytest.MonkeyPatch) -> None:
    """A task process, a triggerer or ``dag.test()`` (a Task SDK channel is set) starts no
    reaping thread: its reads would use the channel from a thread of ours."""
    from airflow.sdk.execution_time import task_runner

    from airflow_provider_torchx.reaper import listeners as reaper

    monkeypatch.setattr(reaper, "_announced", None)
    monkeypatch.setattr(reaper, "_component", "api-server")
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", object(), raising=False)
    called: list[int] = []
    reaper._submit(called.append, 1)
    assert reaper._announced is None and called == []


def test_the_loops_process_starts_without_a_pipe_and_is_signalled_only_while_it_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The reconciling loop's process is spawned: no pipe, whose write end a LocalExecutor
    worker forked meanwhile would keep (the start then waited as long as that worker lived);
    ``poll`` reaps it once it ended, and it is signalled only until then."""
    from airflow_provider_torchx.reaper.loop import LoopProcess

    def no_pipe() -> tuple[int, int]:
        raise AssertionError("the loop's start made a pipe")

    monkeypatch.setattr(os, "pipe", no_pipe)
    monkeypatch.setattr(os, "pipe2", no_pipe, raising=False)
    loop = LoopProcess([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        # posix_spawn returns once the child has replaced its memory, a moment before the kernel
        # has laid out its argument list: /proc/PID/cmdline reads empty until then.
        deadline = time.monotonic() + 10
        while not (cmdline := psutil.Process(loop.pid).cmdline()):
            assert time.monotonic() < deadline, "the spawned process showed no command line within 10 s"
            time.sleep(0.01)
        assert loop.poll() is None and cmdline[0] == sys.executable, cmdline
        loop.signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while loop.poll() is None:
            assert time.monotonic() < deadline, "the loop's process did not end on SIGTERM"
            time.sleep(0.05)
        assert loop.returncode == -signal.SIGTERM
        loop.signal(signal.SIGTERM)  # ended and reaped: its pid is no longer its own, nothing is sent
    finally:
        with contextlib.suppress(ProcessLookupError):
            if loop.poll() is None:
                os.kill(loop.pid, signal.SIGKILL)


def test_an_announcement_never_waits_for_the_loops_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """A DAG run's end announced in the scheduler while the loop's process is still being
    started (its start holds the start's lock) goes to the reaper's thread at once: the
    scheduler's loop is never held by the start."""
    from airflow.models.dagrun import DagRun

    from airflow_provider_torchx.reaper import listeners as reaper
    from airflow_provider_torchx.reaper import loop

    handed: list[str] = []
    monkeypatch.setattr(loop, "_loop", None)
    monkeypatch.setattr(reaper, "_component", "scheduler")
    monkeypatch.setattr(reaper, "reap_announced", lambda wanted, view, where: handed.append(where))
    run = DagRun(dag_id="d", run_id="r", state="success")
    with loop._loop_lock:  # a start in progress
        announcing = threading.Thread(target=reaper.on_dag_run_success, args=(run, "success"), daemon=True)
        announcing.start()
        announcing.join(timeout=10)
        assert not announcing.is_alive(), "the announcement waited for the loop's start"
    assert reaper._announced is not None
    reaper._announced.shutdown(wait=True)
    assert handed == ["announced by Airflow: DAG run success"]


def test_airflow_dags_test_runs_no_reaper(
    run_dag: Any, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """``airflow dags test`` announces its tasks' and run's ends in its own process, neither the
    api-server nor a scheduler: no reaping thread starts there and nothing is said of orphans.
    (It once listed every ``torchx`` connection after each run and warned that a defined one
    was not: that process's connection look-ups do not read the metadata database.)"""
    from airflow.models import Connection
    from airflow.utils.session import create_session

    from airflow_provider_torchx.reaper import listeners as reaper

    monkeypatch.setattr(reaper, "_component", None)
    monkeypatch.setattr(reaper, "_announced", None)
    conn_id = "torchx_dags_test_batch"
    extra = {"scheduler": "aws_batch", "cfg": "queue=q", "region_name": "us-east-1"}
    with create_session() as session:
        session.add(Connection(conn_id=conn_id, conn_type="torchx", extra=json.dumps(extra)))
    try:
        dag_run, out = run_dag("torchx_local_echo")
        if reaper._announced is not None:  # what it would say comes from its thread
            reaper._announced.shutdown(wait=True)
        out += "".join(capfd.readouterr())
    finally:
        with create_session() as session:
            session.query(Connection).filter(Connection.conn_id == conn_id).delete()
    assert str(dag_run.state) == "success", out[-3000:]
    assert reaper._announced is None, "a reaping thread started in `airflow dags test`"
    assert "orphaned jobs" not in out, out[-3000:]


def test_a_source_that_keeps_failing_is_said_once_until_it_changes_or_works_again(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The reconciling loop lists every source each round: a connection it cannot read is
    warned of once (again when the error changes), and its recovery is said once."""
    from airflow_provider_torchx import sources
    from airflow_provider_torchx.reaper import listing as reaper

    missing = LookupError("connection 'torchx_batch' is not defined")
    down = ConnectionError("the Batch endpoint is down")
    rounds: list[Exception | list[Any]] = [missing, missing, missing, missing, down, down, [], [], missing]
    answers = iter(rounds)

    def listings(connections: list[str], live: bool = False) -> Any:
        yield "torchx_batch", "aws_batch", next(answers)

    monkeypatch.setattr(sources, "torchx_connection_ids", lambda: ["torchx_batch"])
    monkeypatch.setattr(sources, "source_listings", listings)
    monkeypatch.setattr(reaper, "problems", reaper.ProblemLog())
    with caplog.at_level(logging.DEBUG, logger=reaper.log.name):
        for _ in rounds:
            assert reaper.live_jobs() == []
    said = [(r.levelname, r.getMessage()) for r in caplog.records if r.levelno >= logging.INFO]
    assert said == [
        (
            "WARNING",
            f"orphaned jobs: listing torchx_batch failed (LookupError: {missing}); said again only if that changes",
        ),
        (
            "WARNING",
            f"orphaned jobs: listing torchx_batch failed (ConnectionError: {down}); said again only if that changes",
        ),
        ("INFO", "orphaned jobs: listing torchx_batch works again"),
        (
            "WARNING",
            f"orphaned jobs: listing torchx_batch failed (LookupError: {missing}); said again only if that changes",
        ),
    ], said


def test_the_reaper_lists_and_cancels_running_jobs_whose_record_is_refused(
    airflow_env: Any, local_jobs: tuple[Runner, list[str]], tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Two running local jobs, one whose ``state.json`` and one whose directory were swapped
    (atomically) for symbolic links: the reaper's listing carries both (the first with its
    labels, the second with none it can read), nothing is skipped; ``apply`` cancels the first
    by its failed task's row and the second by the refused row, and both jobs' supervisors
    stop."""
    from airflow_provider_torchx.core.schedulers.local import store
    from airflow_provider_torchx.core.specs import parse_app_handle
    from airflow_provider_torchx.reaper.decisions import apply
    from airflow_provider_torchx.reaper.listing import live_jobs
    from airflow_provider_torchx.reaper.settings import ReaperSettings
    from tests.fixtures.files import swap_dir_for_symlink, swap_file_for_symlink

    runner, handles = local_jobs
    app = AppDef(name="refused", roles=[Role(name="w", image="local", entrypoint="sh", args=["-c", "sleep 300"])])
    by_state = {**LABELS, "airflow.run_id": "swapped_state"}
    handles += [runner.run(app, "local_cwd", labels=by_state), runner.run(app, "local_cwd", labels=LABELS)]
    deadline = time.monotonic() + 30
    while any((s := runner.status(h)) is None or s.state != AppState.RUNNING for h in handles):
        assert time.monotonic() < deadline, "the jobs did not start"
        time.sleep(0.1)
    sched: Any = runner._scheduler("local_cwd")
    state_id, dir_id = (parse_app_handle(h).app_id for h in handles)
    (tmp_path / "state.json").write_bytes((sched.job_dir(state_id) / store.STATE).read_bytes())
    swap_file_for_symlink(sched.job_dir(state_id) / store.STATE, tmp_path / "state.json")
    swap_dir_for_symlink(sched.job_dir(dir_id), tmp_path / "moved")

    with caplog.at_level(logging.WARNING):
        listed = {parse_app_handle(j.handle).app_id: j for j in live_jobs()}
    assert "skipping" not in caplog.text, caplog.text
    assert listed[state_id].labels == by_state and listed[state_id].state == AppState.UNKNOWN
    assert listed[dir_id].identity is None and "a directory on its way" in str(listed[dir_id].refused)
    jobs = [listed[state_id], listed[dir_id]]
    now = time.time()
    views = {listed[state_id].identity: task("failed", ended_at=now - 31)}
    decisions = apply(jobs, views, settings=ReaperSettings(True, 0.0), now=now, where="test")  # type: ignore[dict-item]
    assert [(d.verdict, d.reason) for _, d in decisions] == [
        (Verdict.CANCEL, "task_failed"),
        (Verdict.CANCEL, "record_refused"),
    ]
    deadline = time.monotonic() + 30
    while any(sched.records.running_supervisor(app_id) for app_id in (state_id, dir_id)):
        assert time.monotonic() < deadline, "a refused job's supervisor outlived the reaper's cancel"
        time.sleep(0.1)
    assert [j for j in live_jobs() if parse_app_handle(j.handle).app_id in (state_id, dir_id)] == []
