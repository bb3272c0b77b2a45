"""The failure-kind decision table (``core/failures.py``'s ``classify``), one test per row of
docs/behaviour.md ("Failure kinds"), on what the schedulers report: AWS Batch ``DescribeJobs``
entries shaped as the API reference documents them (ECS, Fargate, EKS; ``statusReason``,
``attempts[].container.reason``/``exitCode``, ``isTerminated``) read through the Batch
scheduler's own ``describe_response``, and real local jobs (exit 1, a rank that raises under a
torchrun stand-in, SIGKILL from outside)."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_torchx.core.errorfile import RootCause, find_root_cause
from airflow_provider_torchx.core.failures import Failure, FailureKind, classify, signal_of
from airflow_provider_torchx.core.runner import Runner, get_runner
from airflow_provider_torchx.core.schedulers.api import CancelledBy, DescribeAppResponse
from airflow_provider_torchx.core.schedulers.aws_batch.status import CANCEL_REASON, describe_response
from airflow_provider_torchx.core.specs import AppDef, AppState, ReplicaStatus, Role, RoleStatus
from tests.core.aws_batch.fakes import SPOT_RECLAIMED, attempt, child_job, container_job, mnp_job
from tests.core.aws_batch.test_eks import eks_attempt, single_eks_job
from tests.core.test_errorfile import STANDIN

APP, INFRA, CAPACITY, CONFIG = FailureKind.APP, FailureKind.INFRA, FailureKind.CAPACITY, FailureKind.CONFIG


def batch(job: dict[str, Any], nodes: dict[int, dict[str, Any]] | None = None) -> DescribeAppResponse:
    return describe_response("q1:app-1", job, nodes or {}, "us-west-2")


def failed_container(reason: str, exit_code: int | None = None, container_reason: str | None = None) -> dict[str, Any]:
    """A single-node ECS job that FAILED with ``reason`` (its ``statusReason``), its
    container's exit code and reason as AWS sets them."""
    job = container_job(status="FAILED", statusReason=reason)
    if exit_code is not None:
        job["container"]["exitCode"] = exit_code
    if container_reason is not None:
        job["container"]["reason"] = container_reason
    return job


def kind_of(desc: DescribeAppResponse, root: RootCause | None = None, **kw: Any) -> FailureKind | None:
    got = classify(desc, root, **kw)
    return None if got is None else got.kind


def cause(error: str, exit_code: int | None = 1, replica: str = "trainer/0") -> RootCause:
    return RootCause(error=error, replica=replica, rank=0, exit_code=exit_code)


# ------------------------------------------------------------------ row 1: a guard tripped


def test_a_start_timeout_on_a_resource_wait_is_capacity() -> None:
    pending = batch(container_job(status="RUNNABLE", statusReason="CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY"))
    assert classify(pending, guard="start_timeout") == Failure(CAPACITY, "guard start_timeout tripped")


def test_any_other_guard_is_a_guardrail() -> None:
    running = batch(container_job(status="RUNNING"))
    assert kind_of(running, guard="max_gpu_hours") == FailureKind.GUARDRAIL


# ------------------------------------------------------------------ row 2: the task's own wait


def test_the_tasks_own_deadline_is_timeout() -> None:
    assert kind_of(batch(container_job(status="RUNNING")), timed_out=True) == FailureKind.TIMEOUT


# ------------------------------------------------------------------ row 3: cancelled


def test_a_cancel_through_us_is_cancelled_naming_who() -> None:
    job = container_job(
        status="FAILED",
        statusReason=f"{CANCEL_REASON} through aws_batch",
        tags={"airflow-torchx/cancel-requested": "user"},
    )
    assert classify(batch(job)) == Failure(FailureKind.CANCELLED, "cancelled by user")


def test_a_terminatejob_from_outside_with_batchs_evidence_is_cancelled() -> None:
    job = failed_container("stopped by ops: disk full", exit_code=143)
    job["isTerminated"] = True
    assert kind_of(batch(job)) == FailureKind.CANCELLED


def test_a_reason_never_seen_without_evidence_is_an_ordinary_failure() -> None:
    """No ``isTerminated``/``isCancelled``: the wording decides no cancel; no exit code and a
    reason the table does not know: the platform ended it (row 9)."""
    desc = batch(failed_container("A reason AWS adds tomorrow"))
    assert desc.cancel_reason is None
    assert classify(desc) == Failure(INFRA, "A reason AWS adds tomorrow")


# ------------------------------------------------------------------ row 4: the final attempt's reason


def test_an_image_that_cannot_be_pulled_is_config() -> None:
    reason = "CannotPullContainerError: pull image manifest has been retried 5 time(s): not found"
    assert classify(batch(failed_container(reason))) == Failure(CONFIG, f"{reason} on main/0")


def test_fargate_secrets_it_cannot_get_are_config() -> None:
    job = failed_container("ResourceInitializationError: unable to pull secrets or registry auth: execution resource")
    job["platformCapabilities"] = ["FARGATE"]
    assert kind_of(batch(job)) == CONFIG


def test_a_compute_environment_that_can_never_run_it_is_config() -> None:
    assert kind_of(batch(failed_container("MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT - no instance fits"))) == CONFIG


def test_an_eks_pod_whose_image_cannot_be_pulled_is_config() -> None:
    job = single_eks_job()
    job["eksProperties"]["podProperties"]["containers"][0].update(exitCode=None, reason="ImagePullBackOff")
    job["statusReason"] = "ImagePullBackOff"
    assert kind_of(batch(job)) == CONFIG


def test_no_capacity_is_capacity() -> None:
    assert kind_of(batch(failed_container("CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY"))) == CAPACITY


def test_the_jobs_own_attempt_timeout_is_timeout() -> None:
    assert kind_of(batch(failed_container("Job attempt duration exceeded timeout", 137))) == FailureKind.TIMEOUT


def test_a_terminated_host_is_infra() -> None:
    got = classify(batch(failed_container(SPOT_RECLAIMED)))
    assert got == Failure(INFRA, f"{SPOT_RECLAIMED} on main/0")


def test_the_oom_killer_under_essential_container_exited_is_infra() -> None:
    """ECS says why in the container's reason, under the job's generic one."""
    job = failed_container(
        "Essential container in task exited", 137, "OutOfMemoryError: Container killed due to memory usage"
    )
    assert kind_of(batch(job)) == INFRA


def test_an_earlier_attempts_reclaim_does_not_decide_the_final_exit() -> None:
    job = container_job(
        status="FAILED",
        statusReason="Essential container in task exited",
        attempts_allowed=3,
        attempts=[attempt(SPOT_RECLAIMED, n=1), attempt("Essential container in task exited", exit_code=3, n=2)],
    )
    job["container"]["exitCode"] = 3
    assert classify(batch(job)) == Failure(APP, "exit code 3 on main/0")


def test_an_eks_pod_oomkilled_on_its_last_attempt_is_infra() -> None:
    job = single_eks_job()
    job["eksAttempts"][-1] = eks_attempt(1110, 1200, 137, "aws-batch.abc-2", "ip-10-0-0-2.ec2.internal", "OOMKilled")
    job["eksProperties"]["podProperties"]["containers"][0].update(exitCode=137, reason="OOMKilled")
    assert kind_of(batch(job)) == INFRA


# ------------------------------------------------------------------ row 5: the root cause is the collective's


@pytest.mark.parametrize(
    "error",
    [
        "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error",
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer",
        "RendezvousTimeoutError: ",
        "RuntimeError: [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE)",
    ],
)
def test_a_collective_or_rendezvous_root_cause_is_infra(error: str) -> None:
    desc = batch(*multinode_failed_on(1, exit_code=1))
    assert kind_of(desc, cause(error, replica="trainer/1")) == INFRA


def multinode_failed_on(node: int, exit_code: int) -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
    """A multi-node job (2 trainer nodes, 1 ps) whose node ``node`` failed with ``exit_code``."""
    job = mnp_job(status="FAILED", statusReason="Essential container in task exited")
    nodes = {
        n: child_job("j1", n, "FAILED" if n == node else "SUCCEEDED", exit_code if n == node else 0) for n in range(3)
    }
    return job, nodes


# ------------------------------------------------------------------ row 6: a signal


def test_a_rank_killed_by_sigkill_from_outside_is_infra() -> None:
    """torchrun exits 1; its rank's own code, -9, is in the root cause."""
    desc = batch(*multinode_failed_on(0, exit_code=1))
    got = classify(desc, cause("Signal 9 (SIGKILL) received by PID 4242", exit_code=-9))
    assert got == Failure(INFRA, "SIGKILL on trainer/0")


def test_a_rank_that_aborts_itself_is_app() -> None:
    desc = batch(*multinode_failed_on(0, exit_code=1))
    assert kind_of(desc, cause("Signal 6 (SIGABRT) received by PID 4242", exit_code=-6)) == APP


def test_a_container_killed_by_sigkill_without_a_reason_is_infra() -> None:
    assert classify(batch(failed_container("Essential container in task exited", 137))) == Failure(
        INFRA, "SIGKILL on main/0"
    )


def test_a_container_that_segfaults_is_app() -> None:
    assert kind_of(batch(failed_container("Essential container in task exited", 139))) == APP


# ------------------------------------------------------------------ row 7: a command that cannot run


def test_a_command_not_found_is_config() -> None:
    assert kind_of(batch(failed_container("Essential container in task exited", 127))) == CONFIG


# ------------------------------------------------------------------ row 8: the job's own code


def test_a_non_zero_exit_is_app() -> None:
    assert classify(batch(failed_container("Essential container in task exited", 1))) == Failure(
        APP, "exit code 1 on main/0"
    )


def test_an_exception_in_a_rank_is_app_naming_its_type() -> None:
    desc = batch(*multinode_failed_on(1, exit_code=1))
    got = classify(desc, cause("ValueError: shard 17 is corrupt", exit_code=1, replica="trainer/1"))
    assert got == Failure(APP, "ValueError on trainer/1")
    assert got.text() == "app failure — ValueError on trainer/1"


# ------------------------------------------------------------------ row 9 and what is not a failure


def test_a_failure_with_no_exit_code_and_no_known_reason_is_infra() -> None:
    desc = DescribeAppResponse(
        state=AppState.FAILED, roles_statuses=[RoleStatus("w", [ReplicaStatus(0, AppState.FAILED, "w")])]
    )
    assert classify(desc) == Failure(INFRA, "no exit code and no known reason")


@pytest.mark.parametrize("state", [AppState.SUCCEEDED, AppState.RUNNING, AppState.PENDING])
def test_a_job_that_did_not_fail_has_no_kind(state: AppState) -> None:
    assert classify(DescribeAppResponse(state=state)) is None


@pytest.mark.parametrize(
    ("code", "sig"),
    [(-9, signal.SIGKILL), (137, signal.SIGKILL), (143, signal.SIGTERM), (1, None), (0, None), (None, None)],
)
def test_signal_of_reads_both_conventions(code: int | None, sig: signal.Signals | None) -> None:
    assert signal_of(code) == sig


# ------------------------------------------------------------------ real local jobs


@pytest.fixture
def runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Runner]:
    monkeypatch.setenv("AIRFLOW_TORCHX_STATE_DIR", str(tmp_path / "state"))
    with get_runner() as r:
        yield r


def local_kind(runner: Runner, handle: str) -> Failure | None:
    status = runner.wait(handle, wait_interval=0.1, timeout=60, cancel_on_signal=False)
    assert status is not None and status.is_terminal()
    desc = runner.describe_app(handle)
    assert desc is not None
    return classify(desc, find_root_cause(runner, handle, status))


def test_a_local_job_that_exits_1_is_app(runner: Runner) -> None:
    app = AppDef("exit1", roles=[Role("w", image="local", entrypoint="sh", args=["-c", "exit 1"])])
    assert local_kind(runner, runner.run(app, "local_cwd")) == Failure(APP, "exit code 1 on w/0")


def test_a_local_rank_that_raises_is_app_naming_its_exception(runner: Runner) -> None:
    app = AppDef("ddp", roles=[Role("trainer", image="local", entrypoint=sys.executable, args=[STANDIN, "2", "1"])])
    assert local_kind(runner, runner.run(app, "local_cwd")) == Failure(APP, "RuntimeError on trainer/0")


def test_a_local_replica_sigkilled_from_outside_is_infra(runner: Runner, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    script = f"import os, time; open('{pid_file}.tmp', 'w').write(str(os.getpid())); "
    script += f"os.rename('{pid_file}.tmp', '{pid_file}'); time.sleep(60)"
    role = Role("w", image="local", entrypoint=sys.executable, args=["-c", script])
    handle = runner.run(AppDef("killed", roles=[role]), "local_cwd")
    deadline = time.monotonic() + 30
    while not pid_file.exists():
        assert time.monotonic() < deadline, "the replica never started"
        time.sleep(0.05)
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    assert local_kind(runner, handle) == Failure(INFRA, "SIGKILL on w/0")


def test_a_cancel_by_a_user_is_cancelled(runner: Runner) -> None:
    app = AppDef("cancelled", roles=[Role("w", image="local", entrypoint="sleep", args=["60"])])
    handle = runner.run(app, "local_cwd")
    runner.cancel(handle, reason="airflow-torchx cancel by alice", by=CancelledBy.USER)
    assert local_kind(runner, handle) == Failure(FailureKind.CANCELLED, "cancelled by user")
