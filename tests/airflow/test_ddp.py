"""Real PyTorch DDP through ``TorchXRunOperator``, with the test venv's ``torchrun``
(``scripts/torch-venv.sh``; these tests fail without it), on 2 nodes (gloo, CPU). In
``dag.test()``: 2 x 2 ranks succeed with every rank's lines in the task log once; a rank
aborting (SIGABRT, 2 x 2) fails the job fast, naming its replica, with the rank's own last stderr
lines (not its node sibling's) under the root cause, and leaves no process behind;
``max_retries=1`` runs the job again. ``on_kill`` (how Airflow stops a task) cancels a job
whose ranks all run and stops every one of them. A DDP job costs about 20 s here (``import
torch`` in every process): each case runs in one mode only, the other failure cases on 2 x 1."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import psutil
import pytest

from airflow_provider_torchx.core.components.dist import spmd
from airflow_provider_torchx.core.identity import TaskIdentity
from airflow_provider_torchx.core.runner import Runner
from airflow_provider_torchx.core.schedulers.local import store
from airflow_provider_torchx.core.specs import AppState
from airflow_provider_torchx.operators.torchx import TorchXRunOperator
from tests.airflow.helpers import wait_until
from tests.fixtures.airflow import assert_lines_once
from tests.fixtures.torch import DDP_SCRIPT, ddp_failure, torch_job_env
from tests.processes import processes_with_env

pytestmark = [pytest.mark.airflow, pytest.mark.torch, pytest.mark.usefixtures("torch_venv")]

ROLE = "ddp_train"


def all_reduce_lines(world: int) -> list[str]:
    total = sum(range(world))
    return [f"rank {r} of {world}: all_reduce sum {total}" for r in range(world)]


def job_dir_of(handle: str) -> Path:
    return Path(store.JobStore().job_dir(handle.rsplit("/", 1)[1]))


def submitted(out: str) -> str:
    """The handle of the job the task submitted."""
    found = re.search(r"Submitted (local_cwd://\S+)", out)
    assert found, out[-3000:]
    return found.group(1)


def processes_of(job_dir: Path) -> list[psutil.Process]:
    """The live processes of the job (they carry its directory in their environment)."""
    return processes_with_env(**{store.JOB_ENV: str(job_dir)})


def rank_lines(out: str, text: str) -> list[str]:
    """The ``[ddp_train/k] ...`` task-log lines that hold ``text``."""
    return re.findall(rf"\[{ROLE}/\d\] [^\n]*{re.escape(text)}[^\n]*", out)


def test_ddp_succeeds_with_every_ranks_lines_once(run_dag: Any) -> None:
    dag_run, out = run_dag("torchx_test_ddp", deferrable=True)
    assert dag_run.state == "success", ddp_failure(out)
    assert_lines_once(out, all_reduce_lines(4), ordered=False)
    for r in range(4):
        for step in range(3):
            assert len(rank_lines(out, f"rank {r} step {step} loss")) == 1, out[-4000:]
    assert len(set(re.findall(rf"\[{ROLE}/(\d)\] rank \d of 4", out))) == 2  # from both nodes


def test_a_rank_aborting_fails_the_job_fast_with_its_last_stderr_lines(run_dag: Any) -> None:
    dag_run, out = run_dag("torchx_test_ddp_crash", deferrable=False)
    assert dag_run.state == "failed"
    crashed = re.findall(rf"\[{ROLE}/(\d)\] rank 1 crashing at step 2", out)
    assert len(crashed) == 1, out[-4000:]
    # One exit code: the rank's (-6, in the root cause); the replica's 1 is said to be torchrun's.
    # The reason names the first replica to end: under load that can be the other node, whose
    # agent lost the rendezvous store when the crashed node went down (its own exit code 1).
    other = 1 - int(crashed[0])
    assert (
        f"failed replica {ROLE}/{crashed[0]} (torchrun's exit code for its failed rank 1)" in out
        or f"replica {other} exited with code 1; failed replica {ROLE}/{other}, exit code 1" in out
    ), ddp_failure(out)
    assert f"failed replica {ROLE}/{crashed[0]}, exit code" not in out, ddp_failure(out)
    # Rank 1 shares its node with rank 0 (2 x 2), whose collateral error (gloo's peer gone) the
    # node's stderr holds too: the failure's story is the root cause, the job's end, then rank
    # 1's own last stderr lines, and only its.
    root = re.search(
        rf"Root cause \(rank 1, replica {ROLE}/{crashed[0]}, exit code -6\): Signal 6 \(SIGABRT\) received by PID \d+\n"
        r"TorchX job .*\n"
        r"Last \d+ lines of rank 1's stderr:\n((?:(?!\d{4}-\d\d-\d\dT).*\n)+)",
        out,
    )
    assert root, ddp_failure(out)
    own = [line.strip() for line in root[1].splitlines()]
    assert "rank 1: corrupt shard, aborting" in own and "Fatal Python error: Aborted" in own, root[0]
    assert any(line.strip().startswith('File "') and "ddp_train.py" in line for line in own), root[0]  # its frame
    # The streamed log keeps the rank's lines, unprefixed by torchrun's tee (its summary's
    # entries are ``[0]:`` lines of their own).
    assert len(rank_lines(out, "Fatal Python error: Aborted")) == 1, ddp_failure(out)
    assert not re.search(rf"\[{ROLE}/\d\] \[(default)?\d\]:\S", out), ddp_failure(out)
    assert not re.search(r"Connection closed|Traceback|rank [023]\b|torch/distributed/run\.py", root[1]), root[0]
    assert "left behind" not in out, ddp_failure(out)  # torchrun and its ranks stopped, none escaped
    job_dir = job_dir_of(submitted(out))
    state = store.read_json(job_dir / store.STATE, job_dir)
    # Far below any collective or rendezvous timeout: the other rank did not wait in its all-reduce.
    assert state["state"] == "FAILED" and state["ended"] - state["started"] < 120, state
    assert not processes_of(job_dir)


def test_max_retries_runs_the_job_again(run_dag: Any) -> None:
    dag_run, out = run_dag("torchx_test_ddp_retry", deferrable=True)
    assert dag_run.state == "success", ddp_failure(out)
    assert len(rank_lines(out, "rank 1 crashing at step 1")) == 1, out[-4000:]
    job_dir = job_dir_of(submitted(out))
    state = store.read_json(job_dir / store.STATE, job_dir)
    assert state["state"] == "SUCCEEDED" and state["num_restarts"] == 1, state
    for line in all_reduce_lines(2):
        assert len(rank_lines(out, line)) == 1, out[-4000:]


def test_on_kill_stops_every_rank(local_jobs: tuple[Runner, list[str]]) -> None:
    runner, handles = local_jobs
    app = spmd("--steps", "1", "--hold", script=DDP_SCRIPT, j="2x1", env=torch_job_env())
    handle = runner.run(app, "local_cwd")
    handles.append(handle)
    job_dir = job_dir_of(handle)

    def holding() -> bool:
        files = [job_dir / ROLE / str(k) / "combined.log" for k in (0, 1)]
        logs = "".join(f.read_text() for f in files if f.exists())
        return all(line in logs for line in all_reduce_lines(2))

    wait_until(holding, timeout=180, what="both ranks to hold after their all-reduce")
    procs = processes_of(job_dir)
    ranks = [p for p in procs if DDP_SCRIPT in p.cmdline() and "torchrun" not in " ".join(p.cmdline())]
    assert len(ranks) == 2, [p.cmdline() for p in procs]

    op = TorchXRunOperator(task_id="t", app=app, scheduler="local_cwd")
    # What the try set when it submitted the job: its handle, runner and task instance.
    op.app_handle, op._runner, op._identity = handle, runner, TaskIdentity("torchx_test_ddp", "t", "manual")
    op.on_kill()
    status = runner.wait(handle, wait_interval=0.2, timeout=30, cancel_on_signal=False)
    assert status is not None and status.state == AppState.CANCELLED
    _, alive = psutil.wait_procs(procs, timeout=5)
    assert not alive and not processes_of(job_dir)


def test_the_raising_rank_is_the_root_cause_at_the_top_of_the_error(run_dag: Any) -> None:
    """Rank 1 (on node 1) raises; ``record`` writes it to torchrun's error file: the task's
    error starts with its exception, rank and last frames (``core/errorfile.py``)."""
    dag_run, out = run_dag("torchx_test_ddp_raise", deferrable=False)
    assert dag_run.state == "failed"
    crashed = re.findall(rf"\[{ROLE}/(\d)\] rank 1 crashing at step 2", out)  # the rendezvous places rank 1
    assert len(crashed) == 1, out[-4000:]
    root = f"Root cause (rank 1, replica {ROLE}/{crashed[0]}, exit code 1): RuntimeError: boom on rank 1"
    assert root in out, out[-4000:]
    error = out[out.index(root) :]
    assert re.match(re.escape(root) + r"\n  Last frames of its traceback:\n(  .*\n)+TorchX job \S+ ended FAILED", error)
    assert 'raise RuntimeError(f"boom on rank {rank}")' in error.split("TorchX job")[0]
