"""Submit once: a retried ``TorchXRunOperator`` adopts its task instance's job instead of
submitting a second one (real local jobs; a try is ``execute()`` with a task-instance stand-in,
the first one in a subprocess that is SIGKILLed like a dying worker)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from airflow.exceptions import AirflowException

try:
    from airflow.sdk.exceptions import TaskDeferred
except ImportError:  # Airflow 3.1
    from airflow.exceptions import TaskDeferred  # type: ignore[attr-defined,no-redef]

from airflow_provider_torchx.core.cursors import LogPosition
from airflow_provider_torchx.core.runner import Runner, get_runner
from airflow_provider_torchx.core.schedulers.api import DescribeAppResponse
from airflow_provider_torchx.core.specs import AppDef, AppState, Role
from airflow_provider_torchx.operators import adopt
from airflow_provider_torchx.operators.adopt import STATE_STORE_KEY, JobRecord, choose_job_to_adopt
from airflow_provider_torchx.operators.torchx import TorchXRunOperator
from airflow_provider_torchx.watch import cursor_file_for, task_identity
from tests.airflow.helpers import (
    FakeTaskStateStore,
    FakeTI,
    gated_app,
    gated_lines,
    refuse_record,
    run_deferred,
    still_running,
    wait_until,
)
from tests.fixtures.airflow import REPO, assert_lines_once

pytestmark = pytest.mark.airflow_line  # the task state store (3.3) or labels alone (before)

SLEEP = AppDef(name="sleeper", roles=[Role(name="s", image="local", entrypoint="sleep", args=["60"])])
ECHO = AppDef(name="echo", roles=[Role(name="e", image="local", entrypoint="sh", args=["-c", "echo e1; echo e2"])])
FAIL = AppDef(name="fail", roles=[Role(name="f", image="local", entrypoint="sh", args=["-c", "exit 3"])])

TRY_ONE = """
import sys
from airflow_provider_torchx.operators.torchx import TorchXRunOperator
from tests.airflow.helpers import FakeTI, gated_app

op = TorchXRunOperator(
    task_id="task", app=gated_app(sys.argv[1], 2), scheduler="local_cwd", poll_interval=0.2, deferrable=False
)
op.execute({"ti": FakeTI(try_number=1, run_id=sys.argv[2])})
"""


class Identity:
    """A task instance of its own (unique run id) and what the test needs around it."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.run_id = f"reattach__{uuid.uuid4().hex[:12]}"
        self.identity = task_identity({"ti": self.ti()})  # type: ignore[typeddict-item]
        self.labels = self.identity.labels()

    def ti(self, try_number: int = 1) -> FakeTI:
        return FakeTI(try_number=try_number, run_id=self.run_id)

    def context(self, try_number: int, store: FakeTaskStateStore | None = None) -> Any:
        ctx: dict[str, Any] = {"ti": self.ti(try_number)}
        if store is not None:
            ctx["task_state_store"] = store
        return ctx

    def jobs(self) -> list[str]:
        """Handles of every job carrying this identity, oldest first."""
        return [app.app_handle for app in self.runner.list("local_cwd", labels=self.labels)]

    def wait(self, handle: str) -> AppState:
        status = self.runner.wait(handle, wait_interval=0.1, timeout=30, cancel_on_signal=False)
        assert status is not None
        return status.state


@pytest.fixture
def ident() -> Iterator[Identity]:
    runner = get_runner(cancel_grace_period=4)
    identity = Identity(runner)
    yield identity
    for handle in identity.jobs():
        runner.delete(handle)


def operator(app: AppDef, **kwargs: Any) -> TorchXRunOperator:
    kwargs.setdefault("deferrable", False)
    return TorchXRunOperator(task_id="task", app=app, scheduler="local_cwd", poll_interval=0.2, **kwargs)


def submit_and_defer(ident: Identity, app: AppDef, store: FakeTaskStateStore | None = None) -> str:
    """Try 1 submits and defers (then, say, its worker and triggerer die): return the handle."""
    with pytest.raises(TaskDeferred):
        operator(app, deferrable=True).execute(ident.context(1, store))
    (handle,) = ident.jobs()
    return handle


# ---------------------------------------------------------------------- the decision


def job(state: AppState, cancel: bool = False, reported: bool | None = None, n: int = 1) -> JobRecord:
    return JobRecord(f"local_cwd://torchx/j-{n}", state, cancel, reported)


@pytest.mark.parametrize(
    ("candidates", "chosen"),
    [
        ([], None),
        ([job(AppState.RUNNING)], 0),
        ([job(AppState.PENDING)], 0),
        ([job(AppState.SUBMITTED)], 0),
        ([job(AppState.FAILED), job(AppState.RUNNING, n=2)], 1),
        ([job(AppState.RUNNING, cancel=True)], None),
        ([job(AppState.FAILED)], None),
        ([job(AppState.CANCELLED)], None),
        ([job(AppState.SUCCEEDED, reported=False)], 0),
        ([job(AppState.SUCCEEDED, reported=True)], None),
        ([job(AppState.SUCCEEDED, reported=None)], None),  # no try recorded watching it: a clear, rerun
        ([job(AppState.SUCCEEDED, cancel=True, reported=False)], None),
        ([job(AppState.SUCCEEDED, reported=False), job(AppState.SUCCEEDED, reported=False, n=2)], 1),
        ([job(AppState.SUCCEEDED, reported=False), job(AppState.RUNNING, n=2)], 1),  # live first
        ([job(AppState.RUNNING), job(AppState.RUNNING, cancel=True, n=2)], 0),
    ],
)
def test_which_job_a_retry_adopts(candidates: list[JobRecord], chosen: int | None) -> None:
    assert choose_job_to_adopt(candidates) == (None if chosen is None else candidates[chosen])


H = "local_cwd://torchx/j-1"


@pytest.mark.parametrize(
    ("state", "stored", "saved", "reported"),
    [
        (AppState.RUNNING, {"app_handle": H, "reported": True}, LogPosition(reported=True), None),  # not read
        (AppState.SUCCEEDED, None, None, None),  # no try recorded watching it
        (AppState.SUCCEEDED, None, LogPosition(), False),  # the cursor file alone (Airflow < 3.3)
        (AppState.SUCCEEDED, None, LogPosition(reported=True), True),
        (AppState.SUCCEEDED, {"app_handle": H, "reported": False}, None, False),  # the store alone (another host)
        (AppState.SUCCEEDED, {"app_handle": "local_cwd://torchx/other", "reported": False}, None, None),
        (AppState.SUCCEEDED, {"app_handle": H, "reported": True}, LogPosition(), True),  # either says reported
        (AppState.SUCCEEDED, {"app_handle": H, "reported": False}, LogPosition(reported=True), True),
    ],
)
def test_a_jobs_record_reads_its_report_by_one_precedence_rule(
    state: AppState, stored: dict[str, Any] | None, saved: LogPosition | None, reported: bool | None
) -> None:
    desc = DescribeAppResponse(app_id="j-1", state=state, cancel_requested=True)
    assert JobRecord.read(H, desc, stored, saved) == JobRecord(H, state, True, reported)


def test_two_live_candidates_are_an_error() -> None:
    with pytest.raises(AirflowException, match=r"2 live jobs .*j-1, local_cwd://torchx/j-2.*reattach_on_retry=False"):
        choose_job_to_adopt([job(AppState.RUNNING), job(AppState.PENDING, n=2)])


# ---------------------------------------------------------------------- real jobs


def test_retry_after_the_worker_was_killed_reattaches_and_logs_each_line_once(
    ident: Identity, tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = ident.runner
    first = subprocess.Popen(
        [sys.executable, "-c", TRY_ONE, str(tmp_path), ident.run_id],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:

        def submitted() -> list[str]:
            assert first.poll() is None, f"try 1 exited {first.returncode} first:\n{first.communicate()[0]}"
            return ident.jobs()

        handle = wait_until(submitted, 60, "try 1 to submit")[0]
        cursor_file = cursor_file_for(runner, handle, ident.identity)

        def try_one_logged_and_saved_lines_1_2() -> bool:
            position = cursor_file.load()
            if position is None or set(position.cursors) != {"w/0", "w/1"}:
                return False
            return all(
                len(runner.read_log(handle, "w", k).lines) == 2
                and runner.read_log(handle, "w", k, cursor=position.cursors[f"w/{k}"]).lines == []
                for k in (0, 1)
            )

        wait_until(try_one_logged_and_saved_lines_1_2, 60, "try 1 to log and save lines 1-2")
    finally:
        first.send_signal(signal.SIGKILL)
        first_out, _ = first.communicate(timeout=30)
    saved = cursor_file.load()
    assert saved is not None and not saved.reported

    # A deferrable retry adopts the job and hands the saved position to its trigger.
    capfd.readouterr()
    with pytest.raises(TaskDeferred) as deferred:
        operator(gated_app(str(tmp_path), 2), deferrable=True).execute(ident.context(2))
    kwargs = deferred.value.trigger.serialize()[1]
    assert kwargs["app_handle"] == handle
    assert (kwargs["log_cursors"], kwargs["cursor_seq"], kwargs["identity"]) == (
        saved.cursors,
        saved.seq,
        ident.labels,
    )

    # A worker-mode retry adopts the running job and logs only what try 1 had not.
    decided = threading.Event()
    real_find = adopt.find_earlier

    def find_then_signal(*args: Any) -> Any:
        try:
            return real_find(*args)
        finally:
            decided.set()

    monkeypatch.setattr(adopt, "find_earlier", find_then_signal)
    result: dict[str, Any] = {}
    retry = threading.Thread(
        target=lambda: result.update(
            handle=operator(gated_app(str(tmp_path), 2)).execute(ident.context(3)),
        )
    )
    capfd.readouterr()
    retry.start()
    assert decided.wait(60)
    (tmp_path / "gate").touch()
    retry.join(60)
    retry_out = capfd.readouterr().out
    assert result.get("handle") == handle, retry_out[-3000:]
    assert ident.jobs() == [handle]  # nothing resubmitted
    for k in (0, 1):  # the same replica processes, never restarted
        assert len((tmp_path / f"pids-{k}").read_text().split()) == 1
    assert f"Retry: reattaching to {handle} (RUNNING)" in retry_out
    assert retry_out.index("reattaching") < retry_out.index("[w/")
    assert "[w/0] w0 line 1" in first_out
    assert_lines_once(first_out + retry_out, gated_lines(2))
    done = cursor_file.load()
    assert done is not None and done.reported and done.seq > saved.seq


def test_retry_adopts_a_succeeded_job_no_try_reported_then_a_clear_reruns(
    ident: Identity, capfd: pytest.CaptureFixture[str]
) -> None:
    handle = submit_and_defer(ident, ECHO)
    assert ident.wait(handle) == AppState.SUCCEEDED
    capfd.readouterr()
    assert operator(ECHO).execute(ident.context(2)) == handle
    out = capfd.readouterr().out
    assert f"Retry: reattaching to {handle} (SUCCEEDED)" in out
    assert_lines_once(out, ["[e/0] e1", "[e/0] e2"])
    assert ident.jobs() == [handle]
    # Try 2 reported it: clearing the task (try 3) runs the job again.
    again = operator(ECHO).execute(ident.context(3))
    assert again != handle and ident.jobs() == [handle, again]
    assert "SUCCEEDED, reported by an earlier try" in capfd.readouterr().out


@pytest.mark.parametrize("end", ["failed", "cancelled"])
def test_retry_after_a_failed_or_cancelled_job_submits_a_new_one(ident: Identity, end: str) -> None:
    handle = submit_and_defer(ident, FAIL if end == "failed" else SLEEP)
    if end == "cancelled":
        ident.runner.cancel(handle)
    assert ident.wait(handle) == (AppState.FAILED if end == "failed" else AppState.CANCELLED)
    new = operator(SLEEP, wait_for_completion=False).execute(ident.context(2))
    assert new != handle and ident.jobs() == [handle, new]


def test_retry_never_adopts_a_job_with_a_cancel_request(ident: Identity) -> None:
    stubborn = AppDef(
        name="stubborn",
        roles=[
            Role(name="s", image="local", entrypoint="sh", args=["-c", "trap '' TERM; while :; do sleep 0.1; done"])
        ],
    )
    handle = submit_and_defer(ident, stubborn)
    wait_until(lambda: ident.runner.status(handle).state == AppState.RUNNING, 30, "the job to run")  # type: ignore[union-attr]
    ident.runner.cancel(handle)  # it ignores SIGTERM: RUNNING for the 4 s grace period
    new = operator(SLEEP, wait_for_completion=False).execute(ident.context(2))
    desc = ident.runner.describe_app(handle)
    assert desc is not None and desc.state == AppState.RUNNING and desc.cancel_requested
    assert new != handle and ident.jobs() == [handle, new]


def test_two_live_jobs_of_one_task_instance_fail_the_retry(ident: Identity) -> None:
    handles = [ident.runner.run(SLEEP, "local_cwd", labels=ident.labels) for _ in range(2)]
    with pytest.raises(AirflowException, match="2 live jobs carry this task instance's identity") as err:
        operator(SLEEP).execute(ident.context(2))
    assert all(h in str(err.value) for h in handles)
    assert ident.jobs() == handles  # nothing submitted


@pytest.mark.parametrize("how", ["state", "dir"])
def test_a_retry_stops_a_running_job_whose_record_is_refused_and_fails_without_retry(
    ident: Identity, how: str, tmp_path: Path
) -> None:
    """The earlier try's job, still running, whose ``state.json`` (found by its labels) or
    directory (found by the handle the task state store keeps: no label of it is readable)
    was swapped for a symbolic link: the retry stops it (its supervisor and replicas are
    gone), submits nothing, beside it or after it, and fails without retry, as the trigger
    would have."""
    from airflow_provider_torchx._compat import AirflowFailException

    store = FakeTaskStateStore()
    handle = submit_and_defer(ident, SLEEP, store)
    processes = refuse_record(ident.runner, handle, how, tmp_path)
    with pytest.raises(AirflowFailException, match=rf"{handle} cannot be adopted: job .*cancelled it\. Not retried"):
        operator(SLEEP, wait_for_completion=False).execute(ident.context(2, store))
    assert still_running(processes) == [], "the refused job outlived the retry"
    assert set(ident.jobs()) <= {handle}, "a job was submitted after the refused one"
    ident.runner.delete(handle)


@pytest.mark.parametrize("how", ["state", "dir"])
def test_a_retry_after_the_refused_job_was_stopped_and_its_end_written_fails_without_retry(
    ident: Identity, how: str, tmp_path: Path
) -> None:
    """The trigger stopped the job whose ``state.json`` (its supervisor then wrote the end over
    the link: the record reads as an ordinary CANCELLED job) or directory was swapped, yet the
    try failed in a retryable way (as an Airflow 3.1 resume can): the retry, without a task
    state store (Airflow < 3.3), finds that job (by its labels and its end's
    ``stopped_while_refused``; by its cursor file where its directory names no task), submits
    nothing and fails without retry, as the trigger's event would have. Once the job is
    deleted, as its message says, the next try submits one."""
    from airflow_provider_torchx._compat import AirflowFailException
    from airflow_provider_torchx.triggers.torchx import TorchXJobTrigger

    handle = submit_and_defer(ident, SLEEP)
    processes = refuse_record(ident.runner, handle, how, tmp_path)
    (event,) = run_deferred(TorchXJobTrigger(handle, poll_interval=0.2, identity=ident.labels))
    assert still_running(processes) == [] and event["refused"] is True, event
    if how == "state":
        ended = ident.runner.describe_app(handle)
        assert ended is not None and ended.state == AppState.CANCELLED and ended.stopped_while_refused, ended
    job_store = ident.runner._scheduler("local_cwd").store  # type: ignore[attr-defined]
    before = job_store.app_ids()
    with pytest.raises(AirflowFailException, match=rf"{handle} cannot be adopted: job .*cancelled it\. Not retried"):
        operator(SLEEP, deferrable=True).execute(ident.context(2))
    assert job_store.app_ids() == before, "the retry submitted a job after the refused one"
    ident.runner.delete(handle)
    with pytest.raises(TaskDeferred):
        operator(SLEEP, deferrable=True).execute(ident.context(3))
    assert len(job_store.app_ids() - before) == 1, "the try after the delete submitted no job"


def test_a_deferred_try_whose_jobs_record_is_refused_fails_without_retry_once_the_job_stopped(
    ident: Identity, tmp_path: Path
) -> None:
    """The trigger stops the job whose ``state.json`` was swapped for a link (then yields a
    ``refused`` error); the resumed task fails without retry (``AirflowFailException``)."""
    from airflow_provider_torchx._compat import AirflowFailException
    from airflow_provider_torchx.triggers.torchx import TorchXJobTrigger

    handle = submit_and_defer(ident, SLEEP)
    processes = refuse_record(ident.runner, handle, "state", tmp_path)
    (event,) = run_deferred(TorchXJobTrigger(handle, poll_interval=0.2, identity=ident.labels))
    assert still_running(processes) == [] and event["refused"] is True, event
    with pytest.raises(AirflowFailException, match=r"cannot be watched: job .*Not retried"):
        operator(SLEEP, deferrable=True).execute_complete(ident.context(1), event)


def test_reattach_off_always_submits(ident: Identity) -> None:
    handle = submit_and_defer(ident, SLEEP)
    new = operator(SLEEP, wait_for_completion=False, reattach_on_retry=False).execute(ident.context(2))
    assert new != handle and ident.jobs() == [handle, new]


@pytest.mark.parametrize("reattach", [True, False], ids=["reattach", "reattach-off"])
def test_a_retry_lists_and_describes_its_earlier_jobs_once(
    ident: Identity, reattach: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retry after two failed jobs: the look for a job to adopt and the new job's attempt
    number share one listing of the task instance's jobs and one description of each
    (``adopt.find_earlier``, ``Earlier.attempts``), and the new job still continues past both
    jobs' attempts (``TORCHX_ATTEMPT`` 2 on try 2)."""
    failed = [ident.runner.run(FAIL, "local_cwd", labels=ident.labels) for _ in range(2)]
    assert [ident.wait(handle) for handle in failed] == [AppState.FAILED] * 2
    listed: list[Any] = []
    described: list[str] = []
    real_list, real_describe = Runner.list, Runner.describe_app

    def counted_list(self: Runner, scheduler: str, cfg: Any = None, labels: Any = None, **kwargs: Any) -> Any:
        listed.append(dict(labels or {}))
        return real_list(self, scheduler, cfg, labels, **kwargs)

    def counted_describe(self: Runner, app_handle: str) -> Any:
        described.append(app_handle)
        return real_describe(self, app_handle)

    monkeypatch.setattr(Runner, "list", counted_list)
    monkeypatch.setattr(Runner, "describe_app", counted_describe)
    new = operator(SLEEP, wait_for_completion=False, reattach_on_retry=reattach).execute(ident.context(2))
    monkeypatch.undo()
    assert listed.count(ident.labels) == 1, listed
    assert [described.count(handle) for handle in failed] == [1, 1], described
    desc = ident.runner.describe_app(new)
    assert desc is not None and [r.env["TORCHX_ATTEMPT"] for r in desc.roles] == ["2"]
    ident.runner.cancel(new)


def test_task_state_store_keeps_the_handle_and_whether_it_was_reported(ident: Identity) -> None:
    store = FakeTaskStateStore()
    handle = submit_and_defer(ident, ECHO, store)
    assert store.values[STATE_STORE_KEY] == {"app_handle": handle, "reported": False}
    assert ident.wait(handle) == AppState.SUCCEEDED
    # The retry runs on another host: no cursor file there, only the store says "not reported".
    cursor_file_for(ident.runner, handle, ident.identity).path.unlink()
    assert operator(ECHO).execute(ident.context(2, store)) == handle
    assert store.values[STATE_STORE_KEY] == {"app_handle": handle, "reported": True}
    assert ident.jobs() == [handle]


def test_a_stored_handle_of_another_task_instance_is_not_adopted(ident: Identity) -> None:
    other = ident.runner.run(SLEEP, "local_cwd", labels={**ident.labels, "airflow.task_id": "other"})
    try:
        store = FakeTaskStateStore()
        store.values[STATE_STORE_KEY] = {"app_handle": other, "reported": False}
        new = operator(SLEEP, wait_for_completion=False).execute(ident.context(2, store))
        assert new != other and ident.jobs() == [new]
        assert store.values[STATE_STORE_KEY] == {"app_handle": new, "reported": True}
    finally:
        ident.runner.delete(other)


@pytest.mark.airflow
def test_a_dag_run_keeps_the_handle_in_the_task_state_store(run_dag: Any) -> None:
    """Airflow >= 3.3 (AIP-103): the handle, marked reported once the task succeeded."""
    dag_run, out = run_dag("torchx_local_echo", deferrable=True)
    assert dag_run.state == "success", out[-3000:]
    handle = dag_run.get_task_instance("echo").xcom_pull(task_ids="echo")
    try:
        from airflow.models.task_state_store import TaskStateStoreModel
    except ImportError:  # Airflow < 3.3: no task state store; the run must still succeed
        return
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.query(TaskStateStoreModel).filter_by(run_id=dag_run.run_id, task_id="echo").all()
        stored = {row.key: json.loads(row.value) for row in rows}
    assert stored == {STATE_STORE_KEY: {"app_handle": handle, "reported": True}}


def test_an_adopted_job_keeps_its_checkpoint_dir_and_attempt(ident: Identity, tmp_path: Path) -> None:
    """A retry that reattaches changes nothing of the job, even when the root was changed
    since: the XCom names the location the job was given."""
    first = operator(SLEEP, checkpoint_root=str(tmp_path / "a"), deferrable=True)
    with pytest.raises(TaskDeferred):
        first.execute(ident.context(1))
    (handle,) = ident.jobs()
    given = first.checkpoint_dir
    assert given is not None and given.startswith(str(tmp_path / "a"))
    retry = operator(SLEEP, checkpoint_root=str(tmp_path / "b"), deferrable=True)
    ctx = ident.context(2)
    with pytest.raises(TaskDeferred):
        retry.execute(ctx)
    assert ident.jobs() == [handle]
    assert ctx["ti"].xcoms["checkpoint_dir"] == given
    desc = ident.runner.describe_app(handle)
    assert desc is not None and desc.checkpoint_dir == given
    assert [r.env["TORCHX_ATTEMPT"] for r in desc.roles] == ["0"]
    assert not (tmp_path / "b").exists()
