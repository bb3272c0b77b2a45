"""A capacity ladder with real local jobs (docs/architecture.md, "Capacity ladder"): two
``torchx`` connections on this host, the first asking the GPU ledger for GPUs another job holds
(``AIRFLOW_TORCHX_LOCAL_GPUS``), the second asking for none. The job moves after the first
rung's ``start_timeout`` (in the worker and deferred), or after its ``max_infra_failures``, and
resumes on the second with the same checkpoint location and the attempt number continued; an
app failure does not move. A task that does not wait for completion moves its job until it
started and returns the handle of that rung, which a ``TorchXJobSensor`` then follows. A worker
SIGKILLed in the middle of a move leaves at most one live job, which the retry adopts; the box
moves to Slurm and to AWS Batch (moto server) likewise, and a Batch Spot queue's job whose host
is reclaimed moves to an on-demand queue."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

try:
    from airflow.sdk.exceptions import TaskDeferred
except ImportError:  # Airflow 3.1
    from airflow.exceptions import TaskDeferred  # type: ignore[attr-defined,no-redef]

from airflow_provider_torchx.core.runner import Runner
from airflow_provider_torchx.core.schedulers.api import CancelledBy
from airflow_provider_torchx.core.specs import AppDef, AppState, BindMount, Resource, Role
from airflow_provider_torchx.failures import FailureKind, TorchXAppFailure, TorchXConfigRefused
from airflow_provider_torchx.operators.torchx import TorchXRunOperator
from tests.airflow.helpers import CFG, Counter, FakeTI, ended, run_deferred, wait_until
from tests.core.aws_batch.fakes import SPOT_RECLAIMED
from tests.fixtures.aws import create_job_queue

POLL = 0.5
LADDER = ["torchx_box", "torchx_spare"]


def conn(monkeypatch: pytest.MonkeyPatch, conn_id: str, **extra: Any) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "torchx", "extra": extra}))


@pytest.fixture
def rungs(monkeypatch: pytest.MonkeyPatch, two_gpus: Counter) -> Counter:
    """``torchx_box``: local jobs given GPUs from the ledger of a 2-GPU host (``two_gpus``),
    start_timeout 2 s; ``torchx_spare``: local jobs that ask the ledger for none. Metrics counted."""
    conn(monkeypatch, "torchx_box", scheduler="local_cwd", cfg=CFG, start_timeout=2, max_infra_failures=1)
    conn(monkeypatch, "torchx_spare", scheduler="local_cwd")
    return two_gpus


def trainer(script: str = "") -> AppDef:
    """One replica asking for 2 GPUs that says where it checkpoints and its attempt, then runs ``script``."""
    says = 'echo "ckpt=$TORCHX_CHECKPOINT_DIR attempt=$TORCHX_ATTEMPT"'
    role = Role("t", image="local", entrypoint="sh", args=["-c", f"{says}; {script}"], resource=Resource(1, 2, 64))
    return AppDef(name="trainer", roles=[role])


def operator(app: AppDef, **kwargs: Any) -> TorchXRunOperator:
    options: dict[str, Any] = {"poll_interval": POLL, "deferrable": False, "torchx_conn_id": LADDER} | kwargs
    return TorchXRunOperator(task_id="task", app=app, **options)


def assert_moved(runner: Runner, ti: FakeTI, rungs: Counter, out: str, why: str) -> tuple[str, str]:
    """The ladder left ``torchx_box`` for ``torchx_spare`` once, for ``why``; the spare's job
    succeeded with the box's checkpoint location and the attempt after the box's. Returns both jobs."""
    steps = ti.xcoms["ladder"]
    assert [(s["conn_id"], s["outcome"]) for s in steps] == [("torchx_box", "moved"), ("torchx_spare", "succeeded")]
    first, second = steps[0]["app_handle"], steps[1]["app_handle"]
    assert ti.xcoms["app_handle"] == second and first != second
    assert all("submitted_at" in s and "ended_at" in s for s in steps), steps
    left, taken = runner.describe_app(first), runner.describe_app(second)
    assert left is not None and taken is not None
    if why == "start_timeout":  # the task's watcher held it (not the scheduler) and cancelled for the move
        assert left.state == AppState.CANCELLED and left.cancelled_by == CancelledBy.TASK
        assert left.cancel_reason == "moved to torchx_spare: it did not start within start_timeout=2s"
    else:  # ended before the move: nothing left to cancel
        assert left.state == AppState.FAILED
    assert taken.state == AppState.SUCCEEDED
    assert left.labels["torchx.rung"] == "torchx_box" and taken.labels["torchx.rung"] == "torchx_spare"
    identity = {k: v for k, v in left.labels.items() if k.startswith("airflow.")}
    assert identity and all(taken.labels[k] == v for k, v in identity.items())
    assert left.checkpoint_dir is not None and taken.checkpoint_dir == left.checkpoint_dir
    assert f"[t/0] ckpt={left.checkpoint_dir} attempt=1" in out, out[-3000:]
    moves = [line for line in out.splitlines() if "Ladder: leaving rung 1 'torchx_box' (local_cwd)" in line]
    assert len(moves) == 1 and f"job {first}: " in moves[0], out[-3000:]
    assert "; moving to rung 2 'torchx_spare' (local_cwd)" in moves[0]
    tags = {"scheduler": "local_cwd", "dag_id": "adhoc_airflow", "task_id": "task", "from": "torchx_box"}
    assert rungs.of("torchx.job.moved") == [{**tags, "to": "torchx_spare", "why": why}]
    return first, second


def test_a_job_that_cannot_start_moves_to_the_next_rung_in_the_worker(
    local_jobs: tuple[Runner, list[str]], holder: str, rungs: Counter, capfd: pytest.CaptureFixture[str]
) -> None:
    runner, handles = local_jobs
    ti = FakeTI(run_id="ladder-worker")
    op = operator(trainer())
    try:
        assert op.execute({"ti": ti}) == ti.xcoms["app_handle"]  # type: ignore[arg-type]
    finally:
        handles.extend(s["app_handle"] for s in ti.xcoms.get("ladder", []))
    out, err = capfd.readouterr()
    first, _ = assert_moved(runner, ti, rungs, out + err, "start_timeout")
    assert "it did not start within start_timeout=2s" in ti.xcoms["ladder"][0]["reason"]
    assert runner.status(holder).state == AppState.RUNNING  # type: ignore[union-attr]  # untouched
    assert ended(runner, first) == AppState.CANCELLED
    assert rungs.of("torchx.job.failed") == []
    totals = ti.xcoms["usage"]["ladder"]  # both rungs' jobs summed: the box's never ran
    assert (totals["jobs"], totals["known"], totals["attempts_count"]) == (2, 2, 1), totals
    assert totals["node_seconds"] == ti.xcoms["usage"]["node_seconds"], totals
    assert "Ladder (2 jobs, every rung tried): " in out + err


def test_a_job_that_cannot_start_moves_to_the_next_rung_deferred(
    local_jobs: tuple[Runner, list[str]], holder: str, rungs: Counter, capfd: pytest.CaptureFixture[str]
) -> None:
    runner, handles = local_jobs
    ti = FakeTI(run_id="ladder-deferred")
    op = operator(trainer(), deferrable=True)
    try:
        with pytest.raises(TaskDeferred) as deferred:
            op.execute({"ti": ti})  # type: ignore[arg-type]
        (event,) = run_deferred(deferred.value.trigger)
        assert event["status"] == "guardrail" and event["guard"] == "start_timeout"
        # A fresh operator resumes (as a worker does), moves the job and defers again.
        with pytest.raises(TaskDeferred) as again:
            operator(trainer(), deferrable=True).execute_complete(
                {"ti": ti},  # type: ignore[arg-type]
                event,
                **deferred.value.kwargs,
            )
        assert again.value.kwargs["ladder"]["rung"] == 1
        (last,) = run_deferred(again.value.trigger)
        assert last["status"] == "success"
        result = operator(trainer(), deferrable=True).execute_complete(
            {"ti": ti},  # type: ignore[arg-type]
            last,
            **again.value.kwargs,
        )
    finally:
        handles.extend(s["app_handle"] for s in ti.xcoms.get("ladder", []))
    assert result == ti.xcoms["app_handle"]
    out, err = capfd.readouterr()
    assert_moved(runner, ti, rungs, out + err, "start_timeout")


def test_an_infra_failure_moves_after_the_rungs_max_infra_failures(
    local_jobs: tuple[Runner, list[str]], rungs: Counter, capfd: pytest.CaptureFixture[str]
) -> None:
    """A replica killed by SIGKILL (the OOM killer's signal) is an infra failure; the box takes one."""
    runner, handles = local_jobs
    ti = FakeTI(run_id="ladder-infra")
    killed_on_the_box = '[ -n "$CUDA_VISIBLE_DEVICES" ] && kill -KILL $$$$; true'  # $$ is the macros' "$"
    try:
        operator(trainer(killed_on_the_box)).execute({"ti": ti})  # type: ignore[arg-type]
    finally:
        handles.extend(s["app_handle"] for s in ti.xcoms.get("ladder", []))
    out, err = capfd.readouterr()
    assert_moved(runner, ti, rungs, out + err, "max_infra_failures")
    totals = ti.xcoms["usage"]["ladder"]  # both rungs' jobs ran: one attempt each
    assert (totals["jobs"], totals["known"], totals["attempts_count"]) == (2, 2, 2), totals
    assert ti.xcoms["ladder"][0]["reason"] == "1 capacity/infra failures there (max_infra_failures=1)"


def test_an_app_failure_on_the_first_rung_does_not_move(
    local_jobs: tuple[Runner, list[str]], rungs: Counter, capfd: pytest.CaptureFixture[str]
) -> None:
    runner, handles = local_jobs
    ti = FakeTI(run_id="ladder-app")
    try:
        with pytest.raises(TorchXAppFailure) as raised:
            operator(trainer("exit 3")).execute({"ti": ti})  # type: ignore[arg-type]
    finally:
        handles.extend(s["app_handle"] for s in ti.xcoms.get("ladder", []))
    assert raised.value.kind == FailureKind.APP
    (step,) = ti.xcoms["ladder"]
    assert (step["conn_id"], step["outcome"], step["app_handle"]) == ("torchx_box", "failed", ti.xcoms["app_handle"])
    assert rungs.of("torchx.job.moved") == []
    out, err = capfd.readouterr()
    assert "Ladder: leaving" not in out + err
    ours = runner.list("local_cwd", None, {"airflow.run_id": "ladder-app"})
    assert [a.app_handle for a in ours] == [step["app_handle"]]  # nothing submitted to the spare


def test_a_ladder_whose_rungs_checkpoint_apart_fails_before_submitting_naming_the_rung(
    local_jobs: tuple[Runner, list[str]], rungs: Counter, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    runner, _ = local_jobs
    conn(monkeypatch, "torchx_spare", scheduler="local_cwd", checkpoint_root=str(tmp_path / "elsewhere"))
    ti = FakeTI(run_id="ladder-apart")
    with pytest.raises(TorchXConfigRefused, match=r"torchx_conn_id\[1\]: rung 'torchx_spare' \(local_cwd\)"):
        operator(trainer(), dryrun=True).execute({"ti": ti})  # type: ignore[arg-type]
    assert ti.xcoms == {}
    assert runner.list("local_cwd", None, {"airflow.run_id": "ladder-apart"}) == []


def test_a_bad_max_infra_failures_extra_fails_naming_the_connection(
    rungs: Counter, monkeypatch: pytest.MonkeyPatch
) -> None:
    conn(monkeypatch, "torchx_spare", scheduler="local_cwd", max_infra_failures=0)
    with pytest.raises(TorchXConfigRefused, match=r"connection 'torchx_spare' extra max_infra_failures: 0"):
        operator(trainer(), dryrun=True).execute({"ti": FakeTI(run_id="ladder-bad")})  # type: ignore[arg-type]


def test_a_ladder_refuses_a_scheduler_override_and_a_bad_list_at_parse_time_and_takes_not_waiting() -> None:
    with pytest.raises(ValueError, match=r"^scheduler: 'local_cwd' is not allowed with a ladder"):
        TorchXRunOperator(task_id="t", app=trainer(), torchx_conn_id=LADDER, scheduler="local_cwd")
    with pytest.raises(ValueError, match=r"^torchx_conn_id: an empty list is not allowed"):
        TorchXRunOperator(task_id="t", app=trainer(), torchx_conn_id=[])
    op = TorchXRunOperator(task_id="t", app=trainer(), torchx_conn_id=LADDER, wait_for_completion=False)
    assert op.rungs == tuple(LADDER) and op.wait_for_completion is False


def submit_without_waiting(app: AppDef, ti: FakeTI, deferrable: bool) -> tuple[str, dict[str, Any] | None]:
    """Run a ladder's task that does not wait for completion, in the worker or deferred (through
    the real trigger, watching until the job started, and ``execute_complete``): the handle it
    returns, and the trigger's event (None in the worker)."""
    if not deferrable:
        return operator(app, wait_for_completion=False).execute({"ti": ti}), None  # type: ignore[arg-type]
    with pytest.raises(TaskDeferred) as deferred:
        operator(app, deferrable=True, wait_for_completion=False).execute({"ti": ti})  # type: ignore[arg-type]
    assert deferred.value.trigger.until_started is True
    (event,) = run_deferred(deferred.value.trigger)
    resumed = operator(app, deferrable=True, wait_for_completion=False)
    return resumed.execute_complete({"ti": ti}, event, **deferred.value.kwargs), event  # type: ignore[arg-type]


def sensed(handle: str, run_id: str, deferrable: bool) -> list[str]:
    """A ``TorchXJobSensor`` on ``handle`` run to its end (poked in the worker, or deferred
    through the real trigger); returns its task's XCom keys (it succeeded: no exception)."""
    from airflow_provider_torchx.sensors.torchx import TorchXJobSensor

    sensor = TorchXJobSensor(task_id="sense", app_handle=handle, poke_interval=POLL, deferrable=deferrable)
    ti = FakeTI(run_id=run_id)
    if deferrable:
        with pytest.raises(TaskDeferred) as deferred:
            sensor.execute({"ti": ti})  # type: ignore[arg-type]
        (event,) = run_deferred(deferred.value.trigger)
        assert sensor.execute_complete({"ti": ti}, event) == handle  # type: ignore[arg-type]
    else:
        wait_until(lambda: sensor.poke({"ti": ti}), what=f"the sensor to see {handle} end")  # type: ignore[arg-type]
    return sorted(ti.xcoms)


@pytest.mark.parametrize("deferrable", [False, True], ids=["worker", "deferred"])
def test_a_task_that_does_not_wait_moves_its_job_until_it_starts_and_the_sensor_follows_its_last_rung(
    local_jobs: tuple[Runner, list[str]],
    holder: str,
    rungs: Counter,
    deferrable: bool,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """``wait_for_completion=False`` on a ladder: the box's GPUs are held, so the task moves the
    job after the box's ``start_timeout`` (in the worker, or through the real trigger and
    ``execute_complete``), returns the spare's handle (the last rung: at once) and disowns it;
    the box's job is cancelled for the move, and a ``TorchXJobSensor`` on the returned handle
    sees the spare's job succeed."""
    runner, handles = local_jobs
    run_id = f"ladder-submit-{'deferred' if deferrable else 'worker'}"
    ti = FakeTI(run_id=run_id)
    app = trainer("sleep 1")
    try:
        handle, event = submit_without_waiting(app, ti, deferrable)
        assert event is None or (event["status"], event["guard"]) == ("guardrail", "start_timeout"), event
    finally:
        handles.extend(s["app_handle"] for s in ti.xcoms.get("ladder", []))
    steps = ti.xcoms["ladder"]
    assert [(s["conn_id"], s["outcome"]) for s in steps] == [("torchx_box", "moved"), ("torchx_spare", "running")]
    first, second = steps[0]["app_handle"], steps[1]["app_handle"]
    assert handle == second == ti.xcoms["app_handle"] == ti.xcoms["torchx_disowned"]
    assert ended(runner, first) == AppState.CANCELLED  # a cancel is delivered, then lands
    left = runner.describe_app(first)
    assert left is not None and left.cancelled_by == CancelledBy.TASK
    assert left.cancel_reason == "moved to torchx_spare: it did not start within start_timeout=2s"
    out, err = capfd.readouterr()
    assert f"Ladder: leaving rung 1 'torchx_box' (local_cwd), job {first}: " in out + err
    assert (
        f"Ladder: job {second} is on the last rung 2 'torchx_spare' (local_cwd); returning its handle at once "
        "(wait_for_completion=False)" in out + err
    ), (out + err)[-3000:]
    assert [m["why"] for m in rungs.of("torchx.job.moved")] == ["start_timeout"]
    assert "usage" in sensed(handle, run_id, deferrable)
    assert ended(runner, second) == AppState.SUCCEEDED
    assert runner.status(holder).state == AppState.RUNNING  # type: ignore[union-attr]  # untouched


@pytest.mark.parametrize("deferrable", [False, True], ids=["worker", "deferred"])
def test_a_task_that_does_not_wait_returns_its_first_rungs_job_once_it_runs(
    local_jobs: tuple[Runner, list[str]],
    rungs: Counter,
    deferrable: bool,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """The box's GPUs are free: the job starts on the first rung, and the task returns that
    rung's handle once the job is RUNNING (deferred: the trigger's ``started`` event), saying
    the ladder moves it no more; nothing is moved, cancelled or submitted elsewhere."""
    runner, handles = local_jobs
    run_id = f"ladder-starts-{'deferred' if deferrable else 'worker'}"
    ti = FakeTI(run_id=run_id)
    app = trainer("sleep 3")
    try:
        handle, event = submit_without_waiting(app, ti, deferrable)
        assert event is None or (event["status"], event["state"]) == ("started", "RUNNING"), event
        assert runner.status(handle).state == AppState.RUNNING  # type: ignore[union-attr]
    finally:
        handles.extend(s["app_handle"] for s in ti.xcoms.get("ladder", []))
    (step,) = ti.xcoms["ladder"]
    assert (step["conn_id"], step["outcome"], step["app_handle"]) == ("torchx_box", "running", handle)
    assert ti.xcoms["app_handle"] == ti.xcoms["torchx_disowned"] == handle
    out, err = capfd.readouterr()
    assert (
        f"Ladder: job {handle} left PENDING (RUNNING) on rung 1 'torchx_box' (local_cwd); returning its handle "
        "(wait_for_completion=False): the ladder no longer moves it" in out + err
    ), (out + err)[-3000:]
    assert "Ladder: leaving" not in out + err and rungs.of("torchx.job.moved") == []
    assert [a.app_handle for a in runner.list("local_cwd", None, {"airflow.run_id": run_id})] == [handle]
    assert ended(runner, handle) == AppState.SUCCEEDED


def test_a_retry_adopts_the_job_on_the_rung_it_moved_to(
    local_jobs: tuple[Runner, list[str]], holder: str, rungs: Counter, capfd: pytest.CaptureFixture[str]
) -> None:
    """Try 1 moved its job to the spare and deferred; its worker is gone. Try 2 (in the worker)
    finds the job on the spare and reattaches to it: nothing new is submitted on either rung."""
    runner, handles = local_jobs
    ti = FakeTI(run_id="ladder-retry")
    try:
        with pytest.raises(TaskDeferred) as deferred:
            operator(trainer("sleep 3"), deferrable=True).execute({"ti": ti})  # type: ignore[arg-type]
        (event,) = run_deferred(deferred.value.trigger)
        with pytest.raises(TaskDeferred):
            operator(trainer("sleep 3"), deferrable=True).execute_complete(
                {"ti": ti},  # type: ignore[arg-type]
                event,
                **deferred.value.kwargs,
            )
        on_the_spare = ti.xcoms["app_handle"]
        retry = FakeTI(try_number=2, run_id="ladder-retry")
        assert operator(trainer("sleep 3")).execute({"ti": retry}) == on_the_spare  # type: ignore[arg-type]
    finally:
        handles.extend(s["app_handle"] for s in ti.xcoms.get("ladder", []))
    out, err = capfd.readouterr()
    assert "Retry: this task instance's newest job is on rung 2 'torchx_spare' (local_cwd)" in out + err
    assert re.search(rf"Retry: reattaching to {re.escape(on_the_spare)} \((PENDING|RUNNING)\), submitted", out + err)
    assert [(s["conn_id"], s["app_handle"], s["outcome"]) for s in retry.xcoms["ladder"]] == [
        ("torchx_spare", on_the_spare, "succeeded")
    ]
    ours = runner.list("local_cwd", None, {"airflow.run_id": "ladder-retry"})
    assert len(ours) == 2  # the box's cancelled job and the spare's: none submitted by the retry


#: Try 1 of a ladder task in a worker that is SIGKILLed in the middle of the move (argv: run
#: id, where): after the box's job was cancelled and before the spare's is submitted, or right
#: after the spare's job was submitted.
TRY_ONE_KILLED = """
import os, signal, sys
from airflow_provider_torchx.operators.climb import Climb
from airflow_provider_torchx.operators.torchx import TorchXRunOperator
from tests.airflow.helpers import FakeTI
from tests.airflow.test_ladder_jobs import operator, trainer

run_id, where = sys.argv[1:]
if where == "before_resubmit":
    submit = TorchXRunOperator._submit_or_adopt
    def killed_before_moving(self, *args, moving=False, **kwargs):
        if moving:
            os.kill(os.getpid(), signal.SIGKILL)
        return submit(self, *args, moving=moving, **kwargs)
    TorchXRunOperator._submit_or_adopt = killed_before_moving
else:
    record = Climb.submitted
    def killed_once_moved(self, context, handle):
        record(self, context, handle)
        if self.index > 0:
            os.kill(os.getpid(), signal.SIGKILL)
    Climb.submitted = killed_once_moved
operator(trainer("sleep 5")).execute({"ti": FakeTI(run_id=run_id)})
"""


@pytest.mark.parametrize("where", ["before_resubmit", "after_resubmit"])
def test_a_worker_killed_during_a_move_leaves_at_most_one_live_job_and_the_retry_goes_on_with_it(
    local_jobs: tuple[Runner, list[str]], holder: str, rungs: Counter, where: str, capfd: pytest.CaptureFixture[str]
) -> None:
    """Try 1's worker is SIGKILLed between cancelling the box's job and submitting the spare's,
    or just after submitting it. Killed before: no job is left live (the box's was cancelled),
    and the retry goes on to the spare (the move's target) and submits its job there. Killed
    after: the spare's job is the one live job, and the retry adopts it, submitting nothing."""
    from tests.fixtures.airflow import REPO  # not at import: it sets a fresh state dir, and try 1 imports this module

    runner, handles = local_jobs
    run_id = f"ladder-killed-{where}"

    def ours() -> list[Any]:
        return runner.list("local_cwd", None, {"airflow.run_id": run_id})

    try:
        first = subprocess.run(
            [sys.executable, "-c", TRY_ONE_KILLED, run_id, where], cwd=REPO, capture_output=True, text=True, timeout=120
        )
        assert first.returncode == -9, first.stdout[-3000:] + first.stderr[-3000:]
        jobs = ours()
        box = [a.app_handle for a in jobs if a.labels["torchx.rung"] == "torchx_box"]
        spare = [a.app_handle for a in jobs if a.labels["torchx.rung"] == "torchx_spare"]
        assert len(box) == 1 and ended(runner, box[0]) == AppState.CANCELLED
        assert len(spare) == (0 if where == "before_resubmit" else 1), jobs
        live = [a.app_handle for a in ours() if not a.state.is_terminal()]
        assert live == spare  # exactly one live job once the spare's was submitted, none before

        retry = FakeTI(try_number=2, run_id=run_id)
        handle = operator(trainer("sleep 5")).execute({"ti": retry})  # type: ignore[arg-type]
    finally:
        handles.extend(a.app_handle for a in ours())
    out, err = capfd.readouterr()
    assert ended(runner, handle) == AppState.SUCCEEDED
    taken = runner.describe_app(handle)
    assert taken is not None and taken.labels["torchx.rung"] == "torchx_spare"
    if where == "after_resubmit":
        assert handle == spare[0] and len(ours()) == 2, "the retry submitted nothing"
        assert re.search(rf"Retry: reattaching to {re.escape(handle)} \((PENDING|RUNNING)\)", out + err)
    else:
        assert len(ours()) == 2, "the retry submitted on the spare alone"
        assert f"Retry: this task instance's job {box[0]} was moving to rung 2 'torchx_spare'" in out + err
        assert [(s["conn_id"], s["outcome"]) for s in retry.xcoms["ladder"]] == [("torchx_spare", "succeeded")]
    assert [a.app_handle for a in ours() if a.state == AppState.SUCCEEDED] == [handle]


@pytest.mark.slurm
def test_a_job_that_cannot_start_on_the_box_moves_to_slurm_and_checkpoints_in_the_same_place(
    local_jobs: tuple[Runner, list[str]],
    holder: str,
    rungs: Counter,
    slurm_cluster: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """The box's GPUs are all held; the job moves to the real Slurm cluster (its second rung, a
    job directory the nodes share) and writes into the checkpoint location the box's job was given."""
    runner, handles = local_jobs
    conn(monkeypatch, "torchx_spare", scheduler="slurm", cfg=f"job_dir={tmp_path / 'jobs'}")
    root = str(tmp_path / "ckpt")
    app = trainer('mkdir -p "$TORCHX_CHECKPOINT_DIR" && echo "attempt $TORCHX_ATTEMPT" > "$TORCHX_CHECKPOINT_DIR/step"')
    app.roles[0].mounts = [BindMount(root, root)]  # the path every rung sees (Slurm mounts nothing: docs)
    ti = FakeTI(run_id="ladder-slurm")
    try:
        handle = operator(app, checkpoint_root=root).execute({"ti": ti})  # type: ignore[arg-type]
    finally:
        handles.extend(s["app_handle"] for s in ti.xcoms.get("ladder", []))
    steps = ti.xcoms["ladder"]
    assert [(s["conn_id"], s["outcome"]) for s in steps] == [("torchx_box", "moved"), ("torchx_spare", "succeeded")]
    assert handle == steps[1]["app_handle"] and handle.startswith("slurm://")
    left = runner.describe_app(steps[0]["app_handle"])
    assert left is not None and left.state == AppState.CANCELLED and left.cancelled_by == CancelledBy.TASK
    assert left.cancel_reason == "moved to torchx_spare: it did not start within start_timeout=2s"
    assert left.checkpoint_dir is not None and left.checkpoint_dir.startswith(root + "/")
    assert Path(left.checkpoint_dir, "step").read_text() == "attempt 1\n"  # written on Slurm, same place
    out, err = capfd.readouterr()
    assert "moving to rung 2 'torchx_spare' (slurm)" in out + err
    assert rungs.of("torchx.job.moved")[0]["to"] == "torchx_spare"


def test_the_watcher_not_the_box_holds_a_moving_rungs_start_timeout(rungs: Counter) -> None:
    """The task's watcher holds the box's start_timeout (its trip cancels with the move's
    reason), so the request the box's scheduler is handed carries none."""
    request = operator(trainer(), dryrun=True).execute({"ti": FakeTI(run_id="ladder-held")})  # type: ignore[arg-type]
    assert request["start_timeout"] is None, request


@pytest.mark.docker
def test_a_job_that_cannot_start_on_the_box_moves_to_aws_batch_and_checkpoints_in_the_same_place(
    local_jobs: tuple[Runner, list[str]],
    holder: str,
    rungs: Counter,
    batch_queue: str,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Local box -> a Batch queue (moto server, real containers), both checkpointing under one
    ``s3://`` root: the box's job cannot start (its GPUs are held), moves after the box's
    ``start_timeout``, and the Batch job runs with the same identity, checkpoint location and
    the attempt continued, and succeeds."""
    from airflow_provider_torchx.hooks.torchx import TorchXHook

    conn(monkeypatch, "torchx_batch_rung", scheduler="aws_batch", cfg=f"queue={batch_queue}", region_name="us-east-1")
    runner, handles = local_jobs
    ti = FakeTI(run_id="ladder-batch")
    app = trainer()
    for role in app.roles:
        role.image = "busybox:local"  # the Batch rung's image; the box runs in its own directory
    op = operator(app, torchx_conn_id=["torchx_box", "torchx_batch_rung"], checkpoint_root="s3://bucket/ckpt")
    batch = TorchXHook("torchx_batch_rung").get_runner()
    try:
        assert op.execute({"ti": ti}) == ti.xcoms["app_handle"]  # type: ignore[arg-type]
    finally:
        steps = ti.xcoms.get("ladder", [])
        handles.extend(s["app_handle"] for s in steps if s["app_handle"].startswith("local_cwd://"))
        for s in steps:
            if s["app_handle"].startswith("aws_batch://"):
                batch.cancel(s["app_handle"])
    out, err = capfd.readouterr()
    tried = [(s["conn_id"], s["outcome"]) for s in steps]
    assert tried == [("torchx_box", "moved"), ("torchx_batch_rung", "succeeded")], tried
    left, taken = runner.describe_app(steps[0]["app_handle"]), batch.describe_app(steps[1]["app_handle"])
    assert left is not None and taken is not None
    assert left.state == AppState.CANCELLED and left.cancelled_by == CancelledBy.TASK
    assert left.cancel_reason == "moved to torchx_batch_rung: it did not start within start_timeout=2s"
    assert taken.state == AppState.SUCCEEDED
    assert left.labels["torchx.rung"] == "torchx_box" and taken.labels["torchx.rung"] == "torchx_batch_rung"
    identity = {k: v for k, v in left.labels.items() if k.startswith("airflow.")}
    assert identity and all(taken.labels[k] == v for k, v in identity.items())
    assert left.checkpoint_dir == taken.checkpoint_dir == "s3://bucket/ckpt/dag/ladder-batch/task"
    assert f"ckpt={taken.checkpoint_dir} attempt=1" in out + err, (out + err)[-3000:]
    assert [m["to"] for m in rungs.of("torchx.job.moved")] == ["torchx_batch_rung"]


@pytest.fixture(scope="module")
def ondemand_queue(aws_env: str) -> str:
    """A second job queue on the moto server: the ladder's on-demand rung."""
    return create_job_queue("torchx-ladder-ondemand")


def reclaim_when_running(queue: str, stop: threading.Event) -> threading.Thread:
    """A thread that ends the first job it sees RUNNING on ``queue`` as AWS ends an attempt whose
    Spot host was reclaimed: TerminateJob with Batch's own reason (moto cannot lose a host)."""
    import boto3

    batch = boto3.client("batch")

    def reclaim() -> None:
        while not stop.wait(0.3):
            running = batch.list_jobs(jobQueue=queue, jobStatus="RUNNING")["jobSummaryList"]
            if running:
                batch.terminate_job(jobId=running[0]["jobId"], reason=SPOT_RECLAIMED)
                return

    thread = threading.Thread(target=reclaim, daemon=True)
    thread.start()
    return thread


@pytest.mark.docker
def test_a_batch_job_whose_host_is_reclaimed_moves_to_the_next_queue_and_resumes(
    batch_queue: str,
    ondemand_queue: str,
    rungs: Counter,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """A Spot queue (``max_infra_failures=1``) -> an on-demand queue, both on the moto server
        with real containers, checkpointing under one ``s3://`` root. The Spot job's running attempt
        ends with ``Host EC2 (instance i-...) terminated.``: the job moves, and the on-demand job
        carries the same identity and checkpoint location, with the attempt continued (``TORCHX_ATTEMPT``
    1 after the Spot job's 0), and succeeds."""
    from airflow_provider_torchx.hooks.torchx import TorchXHook

    aws = {"scheduler": "aws_batch", "region_name": "us-east-1"}
    conn(monkeypatch, "torchx_spot", cfg=f"queue={batch_queue}", max_infra_failures=1, **aws)
    conn(monkeypatch, "torchx_ondemand", cfg=f"queue={ondemand_queue}", **aws)
    app = trainer('[ "$TORCHX_ATTEMPT" != 0 ] || sleep 60')  # the first attempt runs until its host goes
    app.roles[0].image = "busybox:local"
    app.roles[0].resource = Resource(1, 0, 64)
    ti = FakeTI(run_id="ladder-reclaim")
    op = operator(app, torchx_conn_id=["torchx_spot", "torchx_ondemand"], checkpoint_root="s3://bucket/ckpt")
    batch = TorchXHook("torchx_spot").get_runner()
    stop = threading.Event()
    reclaimer = reclaim_when_running(batch_queue, stop)
    try:
        assert op.execute({"ti": ti}) == ti.xcoms["app_handle"]  # type: ignore[arg-type]
    finally:
        stop.set()
        reclaimer.join()
        for s in ti.xcoms.get("ladder", []):
            batch.cancel(s["app_handle"])
    out, err = capfd.readouterr()
    steps = ti.xcoms["ladder"]
    assert [(s["conn_id"], s["outcome"]) for s in steps] == [("torchx_spot", "moved"), ("torchx_ondemand", "succeeded")]
    assert steps[0]["reason"] == "1 capacity/infra failures there (max_infra_failures=1)"
    left, taken = batch.describe_app(steps[0]["app_handle"]), batch.describe_app(steps[1]["app_handle"])
    assert left is not None and taken is not None
    assert left.state == AppState.FAILED and left.msg.startswith(SPOT_RECLAIMED), left.msg
    assert taken.state == AppState.SUCCEEDED
    assert left.labels["torchx.rung"] == "torchx_spot" and taken.labels["torchx.rung"] == "torchx_ondemand"
    identity = {k: v for k, v in left.labels.items() if k.startswith("airflow.")}
    assert identity and all(taken.labels[k] == v for k, v in identity.items())
    assert left.checkpoint_dir == taken.checkpoint_dir == "s3://bucket/ckpt/dag/ladder-reclaim/task"
    assert f"ckpt={taken.checkpoint_dir} attempt=1" in out + err, (out + err)[-3000:]
    moves = [line for line in (out + err).splitlines() if "Ladder: leaving rung 1 'torchx_spot' (aws_batch)" in line]
    assert len(moves) == 1 and "moving to rung 2 'torchx_ondemand' (aws_batch)" in moves[0], (out + err)[-3000:]
    assert [(m["to"], m["why"]) for m in rungs.of("torchx.job.moved")] == [("torchx_ondemand", "max_infra_failures")]
