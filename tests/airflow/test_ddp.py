"""Real PyTorch DDP through ``TorchXRunOperator`` in ``dag.test()``: 2 nodes x 2 ranks (gloo,
CPU) with the test venv's ``torchrun`` (``scripts/torch-venv.sh``; the tests fail without it).
A run succeeds with every rank's lines in the task log once; a rank exiting 1 fails the job
fast, naming its replica and exit code, and leaves no process behind; ``max_retries=1`` runs
the job again; the operator's timeout cancels the job and stops every rank. Each DDP job costs
about 20 s here (``import torch`` in 6 processes), so each case runs in one mode only."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import psutil
import pytest

from airflow_provider_torchx.core.runner import get_runner
from airflow_provider_torchx.core.schedulers.local import store
from airflow_provider_torchx.core.specs import AppState
from tests.fixtures.airflow import assert_lines_once

pytestmark = [pytest.mark.airflow, pytest.mark.usefixtures("torch_venv")]

ROLE = "ddp_train"
ALL_REDUCE = [f"rank {r} of 4: all_reduce sum 6" for r in range(4)]


def job_of(out: str) -> tuple[str, Path]:
    """The handle of the job the task submitted, and its directory in the store."""
    found = re.search(r"Submitted (local_cwd://\S+)", out)
    assert found, out[-3000:]
    handle = found.group(1)
    return handle, Path(store.JobStore().job_dir(handle.rsplit("/", 1)[1]))


def processes_of(job_dir: Path) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(store.JOB_ENV) == str(job_dir) and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def rank_lines(out: str, text: str) -> list[str]:
    """The ``[ddp_train/k] ...`` task-log lines that hold ``text``."""
    return re.findall(rf"\[{ROLE}/\d\] [^\n]*{re.escape(text)}[^\n]*", out)


def test_ddp_succeeds_with_every_ranks_lines_once(run_dag: Any) -> None:
    dag_run, out = run_dag("torchx_test_ddp", deferrable=True)
    assert dag_run.state == "success", out[-4000:]
    assert_lines_once(out, ALL_REDUCE, ordered=False)
    for r in range(4):
        assert len(rank_lines(out, f"rank {r} step 2 loss")) == 1, out[-4000:]
    assert len(set(re.findall(rf"\[{ROLE}/(\d)\] rank \d of 4", out))) == 2  # from both nodes


def test_a_rank_exiting_1_fails_the_job_fast_naming_its_replica(run_dag: Any) -> None:
    dag_run, out = run_dag("torchx_test_ddp_crash", deferrable=False)
    assert dag_run.state == "failed"
    crashed = re.findall(rf"\[{ROLE}/(\d)\] rank 3 crashing at step 2", out)
    assert len(crashed) == 1, out[-4000:]
    assert f"failed replica {ROLE}/{crashed[0]}, exit code 1" in out, out[-4000:]
    _, job_dir = job_of(out)
    state = store.read_json(job_dir / store.STATE)
    assert state["state"] == "FAILED" and state["ended"] - state["started"] < 120, state
    assert not processes_of(job_dir)


def test_max_retries_runs_the_job_again(run_dag: Any) -> None:
    dag_run, out = run_dag("torchx_test_ddp_retry", deferrable=True)
    assert dag_run.state == "success", out[-4000:]
    assert len(rank_lines(out, "rank 1 crashing at step 1")) == 1, out[-4000:]
    _, job_dir = job_of(out)
    assert store.read_json(job_dir / store.STATE)["num_restarts"] == 1
    for line in ALL_REDUCE:
        assert len(rank_lines(out, line)) == 1, out[-4000:]


def test_the_operators_timeout_cancels_the_job_and_stops_every_rank(run_dag: Any) -> None:
    dag_run, out = run_dag("torchx_test_ddp_cancel", deferrable=False)
    assert dag_run.state == "failed"
    assert "cancelled it" in out, out[-3000:]
    for line in ALL_REDUCE:  # every rank was up (holding) when the job was cancelled
        assert len(rank_lines(out, line)) == 1, out[-4000:]
    handle, job_dir = job_of(out)
    status = get_runner().wait(handle, wait_interval=0.2, timeout=30, cancel_on_signal=False)
    assert status is not None and status.state == AppState.CANCELLED
    assert not processes_of(job_dir)
