"""Ended jobs from accounting (``sacct``, where the cluster runs ``slurmdbd``): one ``sacct``
call per round for every watched job the controller forgot, and per ``list`` for the recorded
ones whose record shows no end; none on a cluster without accounting (the job's record decides
there). Slurm's commands are stood in for by their captured output (``data/``);
``test_cluster.py`` runs the real ones."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from airflow_provider_torchx.core.clock import Clock
from airflow_provider_torchx.core.schedulers.slurm import commands, record, status
from airflow_provider_torchx.core.schedulers.slurm.poller import SqueuePoller
from airflow_provider_torchx.core.schedulers.slurm.record import JobIndex
from airflow_provider_torchx.core.schedulers.slurm.scheduler import SNAPSHOT_AGE, SlurmScheduler
from airflow_provider_torchx.core.specs import AppState
from tests.core.slurm.conftest import DATA

SQUEUE = (DATA / "squeue-22.05.json").read_text()  # jobs 11-17
SACCT = (DATA / "sacct-22.05.json").read_text()  # jobs 3, 4 (+5), 6


class Clients:
    """Slurm's clients as captured, in place of ``subprocess`` in ``commands.py``: ``squeue``
    knows jobs 11-17; ``sacct`` keeps 3, 4 and 6, or says the cluster keeps no accounting."""

    TimeoutExpired = subprocess.TimeoutExpired

    def __init__(self, accounting: bool) -> None:
        self.accounting = accounting
        self.argvs: list[list[str]] = []

    def run(self, argv: Sequence[str], **kw: object) -> subprocess.CompletedProcess[str]:
        self.argvs.append(list(argv))
        if argv[0] == "squeue":
            return subprocess.CompletedProcess(argv, 0, SQUEUE, "")
        if argv[0] == "sacct" and self.accounting:
            return subprocess.CompletedProcess(argv, 0, SACCT, "")
        return subprocess.CompletedProcess(argv, 1, "", "Slurm accounting storage is disabled\n")


@pytest.fixture
def clients(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Clients:
    fake = Clients(accounting=getattr(request, "param", True))
    monkeypatch.setattr(commands, "subprocess", fake)
    monkeypatch.delenv("SLURM_CONF", raising=False)
    return fake


def _sched(tmp_path: Path) -> SlurmScheduler:
    return SlurmScheduler("t", index=JobIndex(tmp_path / "index"))


def test_one_sacct_call_per_round_for_the_watched_jobs_slurm_forgot(clients: Clients, tmp_path: Path) -> None:
    sched = _sched(tmp_path)
    sched.poller = SqueuePoller(sched._entries, lambda e: status.app_state(None, e)[0].is_terminal(), thread=False)
    ids = ["3", "4", "6", "14", "99"]  # 14: squeue knows it; 99: nobody does
    futures = [sched.describe_future_as(i, lambda d: d.state if d else None) for i in ids]
    assert sched.poller.run_round() == len(ids)
    states = [f.result(timeout=0) for f in futures if f is not None]
    assert states == [AppState.SUCCEEDED, AppState.FAILED, AppState.CANCELLED, AppState.PENDING, None]
    assert [a[0] for a in clients.argvs] == ["squeue", "sacct"]
    assert clients.argvs[1] == ["sacct", "--json", "--jobs", "3,4,6,99"]


@pytest.mark.parametrize("clients", [False], indirect=True)
def test_without_accounting_sacct_is_asked_once_and_the_record_decides(clients: Clients, tmp_path: Path) -> None:
    sched = _sched(tmp_path)
    try:
        assert sched.describe("3") is None  # no record here, and Slurm keeps nothing of it
        assert sched.describe("6") is None
    finally:
        sched.close()
    assert [a[0] for a in clients.argvs] == ["squeue", "sacct", "squeue"]
    assert sched.commands.accounting is False


def test_a_job_squeue_still_knows_costs_no_sacct_call(clients: Clients, tmp_path: Path) -> None:
    sched = _sched(tmp_path)
    try:
        desc = sched.describe("11")
    finally:
        sched.close()
    assert desc is not None and desc.state == AppState.SUCCEEDED
    assert [a[0] for a in clients.argvs] == ["squeue"]


def test_describing_a_job_the_last_round_showed_ended_costs_no_call(clients: Clients, tmp_path: Path) -> None:
    t = [100.0]
    sched = SlurmScheduler("t", index=JobIndex(tmp_path / "index"), clock=Clock(monotonic=lambda: t[0]))
    sched.poller = SqueuePoller(sched._entries, lambda e: status.app_state(None, e)[0].is_terminal(), thread=False)
    futures = [sched.describe_future_as(i, lambda d: d.state if d else None) for i in ("11", "14")]  # ended; pending
    assert sched.poller.run_round() == 2
    assert [f.result(timeout=0) for f in futures if f is not None] == [AppState.SUCCEEDED, AppState.PENDING]
    t[0] += SNAPSHOT_AGE
    ended = [sched.describe("11") for _ in range(3)]
    assert [d.state if d else None for d in ended] == [AppState.SUCCEEDED] * 3
    assert [a[0] for a in clients.argvs] == ["squeue"]  # the round's call alone
    pending = sched.describe("14")
    assert pending is not None and pending.state == AppState.PENDING
    assert [a[0] for a in clients.argvs] == ["squeue", "squeue"]  # a job not ended: asked afresh
    t[0] += SNAPSHOT_AGE + 0.1
    later = sched.describe("11")
    assert later is not None and later.state == AppState.SUCCEEDED
    assert [a[0] for a in clients.argvs] == ["squeue"] * 3  # an older snapshot: asked afresh


def test_list_asks_accounting_once_for_the_recorded_jobs_the_controller_forgot(
    clients: Clients, tmp_path: Path
) -> None:
    sched = _sched(tmp_path)
    for app_id in ("3", "4", "6"):  # recorded here; their jobs never wrote a record (a node lost, say)
        sched.index.add(app_id, str(tmp_path / "jobs" / app_id))
    settled = tmp_path / "jobs" / "8"  # its record says it was cancelled: no need to ask
    settled.mkdir(parents=True)
    (settled / record.JOB_FILE).write_text(json.dumps({"name": "t", "roles": [], "labels": {}, "submitted": 1.0}))
    (settled / record.CANCEL_FILE).write_text(json.dumps({"reason": "r", "by": "user", "at": 2.0}))
    sched.index.add("8", str(settled))
    try:
        listed = {app.app_id: app.state for app in sched.list()}
    finally:
        sched.close()
    assert listed == {
        "3": AppState.SUCCEEDED,
        "4": AppState.FAILED,
        "6": AppState.CANCELLED,
        "8": AppState.CANCELLED,
        "11": AppState.SUCCEEDED,
        "14": AppState.PENDING,
    }
    assert [a[0] for a in clients.argvs] == ["squeue", "sacct"]
    assert clients.argvs[1] == ["sacct", "--json", "--jobs", "3,4,6"]


@pytest.mark.parametrize("clients", [False], indirect=True)
def test_list_without_accounting_leaves_forgotten_jobs_to_their_record(clients: Clients, tmp_path: Path) -> None:
    sched = _sched(tmp_path)
    sched.index.add("3", str(tmp_path / "jobs" / "3"))  # no record, and Slurm keeps nothing of it
    try:
        listed = {app.app_id: app.state for app in sched.list()}
    finally:
        sched.close()
    assert listed == {"11": AppState.SUCCEEDED, "14": AppState.PENDING}
    assert [a[0] for a in clients.argvs] == ["squeue", "sacct"]
