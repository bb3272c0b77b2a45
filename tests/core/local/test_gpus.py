"""The host's GPU ledger with real processes on a host with 8 faked GPUs
(``AIRFLOW_TORCHX_LOCAL_GPUS``): concurrent jobs get disjoint devices, a job that does not fit
waits PENDING in submission order and says why, and devices come back at the end, on cancel
and when the holder's supervisor is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from airflow_provider_torchx.core.cli import main as cli_main
from airflow_provider_torchx.core.errors import InvalidSpecError
from airflow_provider_torchx.core.schedulers.local import LocalScheduler, gpus, ledger, store
from airflow_provider_torchx.core.specs import AppDef, AppState, Resource, Role, macros
from tests.core.local.conftest import marked_processes
from tests.core.local.helpers import wait_done

ON = {"auto_set_cuda_visible_devices": True}
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def eight_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(gpus.GPUS_ENV, "0,1,2,3,4,5,6,7")


def gated(gate_dir: Path, replicas: int, gpu: int, name: str = "gated") -> AppDef:
    """Each replica prints its devices, then waits for ``<gate_dir>/gate-<app id>``."""
    script = f"echo cvd=$CUDA_VISIBLE_DEVICES; while [ ! -e {gate_dir}/gate-{macros.app_id} ]; do sleep 0.05; done"
    role = Role("w", entrypoint="sh", args=["-c", script], num_replicas=replicas, resource=Resource(1, gpu, 64))
    return AppDef(name, roles=[role])


def submit(sched: LocalScheduler, app: AppDef) -> str:
    return sched.schedule(sched.submit_dryrun(app, ON))  # type: ignore[arg-type]


def replica_devices(sched: LocalScheduler, app_id: str) -> list[str]:
    """Each replica's devices as ``describe`` shows them (``GPUs 0,1``)."""
    desc = sched.describe(app_id)
    assert desc is not None
    return [r.msg for role in desc.roles_statuses for r in role.replicas]


def devices_of(sched: LocalScheduler, app_id: str) -> set[int]:
    return {int(d) for msg in replica_devices(sched, app_id) for d in msg.removeprefix("GPUs ").split(",") if d}


def log_lines(sched: LocalScheduler, app_id: str, k: int) -> list[str]:
    return [line.rstrip("\n") for line in sched.log_iter(app_id, "w", k)]


def wait_for(condition, timeout: float = 30.0, what: str = "a condition"):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return value


def states(sched: LocalScheduler, app_ids: list[str]) -> dict[str, AppState]:
    return {a: sched.describe(a).state for a in app_ids}  # type: ignore[union-attr]


def open_gate(gate_dir: Path, app_id: str) -> None:
    (gate_dir / f"gate-{app_id}").touch()


def ledger_of(sched: LocalScheduler) -> dict[str, object]:
    return ledger.read(sched.store.root).get("gpus", {})  # type: ignore[return-value]


_SUBMITTER = """
import os, sys, time
from airflow_provider_torchx.core.schedulers.local import create_cwd_scheduler
from tests.core.local.test_gpus import ON, gated
from pathlib import Path
gate_dir, go = Path(sys.argv[1]), sys.argv[2]
sched = create_cwd_scheduler("gpu")
info = sched.submit_dryrun(gated(gate_dir, replicas=2, gpu=2), ON)
Path(gate_dir, f"ready-{os.getpid()}").touch()
while not os.path.exists(go):
    time.sleep(0.002)
print(sched.schedule(info), flush=True)
"""


def test_three_jobs_from_three_processes_share_eight_gpus(sched: LocalScheduler, tmp_path: Path) -> None:
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _SUBMITTER, str(tmp_path), str(go)], stdout=subprocess.PIPE, text=True, cwd=REPO
        )
        for _ in range(3)
    ]
    # They submit together once "go" exists, after each has imported and made its request.
    wait_for(lambda: len(list(tmp_path.glob("ready-*"))) == 3, what="the three submitters to be ready")
    go.touch()
    app_ids = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs) and len(set(app_ids)) == 3, app_ids

    def two_running() -> dict[str, AppState] | None:
        st = states(sched, app_ids)
        return st if sorted(s.name for s in st.values()) == ["PENDING", "RUNNING", "RUNNING"] else None

    st = wait_for(two_running, what="two jobs running and one waiting")
    running = [a for a in app_ids if st[a] == AppState.RUNNING]
    waiting = next(a for a in app_ids if st[a] == AppState.PENDING)
    first, second = running
    sets = [devices_of(sched, a) for a in running]
    assert sets[0].isdisjoint(sets[1]) and sets[0] | sets[1] == set(range(8)), sets
    for app_id in running:  # two replicas of two devices each; the replicas see what describe says
        shown = replica_devices(sched, app_id)
        assert len(shown) == 2 and all(len(m.split(",")) == 2 for m in shown), shown
        for k, msg in enumerate(shown):
            line = f"cvd={msg.removeprefix('GPUs ')}"
            wait_for(lambda a=app_id, k=k, line=line: line in log_lines(sched, a, k), what=line)
    msg = wait_for(
        lambda: (
            sched.describe(waiting).msg.startswith("waiting for 4 GPUs, 0 free, held by ")  # type: ignore[union-attr]
            and sched.describe(waiting).msg
        ),  # type: ignore[union-attr]
        what="the waiting message",
    )
    assert first in msg and second in msg, msg

    open_gate(tmp_path, first)
    assert wait_done(sched, first).state == AppState.SUCCEEDED
    wait_for(lambda: sched.describe(waiting).state == AppState.RUNNING, what="the third job to start")  # type: ignore[union-attr]
    assert devices_of(sched, waiting) == sets[0]
    for app_id in (second, waiting):
        open_gate(tmp_path, app_id)
        assert wait_done(sched, app_id).state == AppState.SUCCEEDED
    assert ledger_of(sched) == {"holders": {}, "queue": []}


def test_a_waiting_job_says_why_and_can_be_cancelled(
    sched: LocalScheduler, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    holder = submit(sched, gated(tmp_path, replicas=1, gpu=8, name="all"))
    wait_for(lambda: devices_of(sched, holder) == set(range(8)), what="the holder to get 8 GPUs")
    waiter = submit(sched, gated(tmp_path, replicas=2, gpu=2, name="waiter"))
    why = f"waiting for 4 GPUs, 0 free, held by {holder} (0,1,2,3,4,5,6,7)"
    wait_for(lambda: sched.describe(waiter).msg == why, what="the waiting message")  # type: ignore[union-attr]
    assert cli_main(["status", f"local_cwd://gpu/{waiter}"]) == 0
    out = capsys.readouterr().out
    assert "State: PENDING" in out and why in out, out

    sched.cancel(waiter)
    desc = wait_done(sched, waiter, timeout=10)
    assert desc.state == AppState.CANCELLED
    never = "never started: the job ended CANCELLED before this replica ran"  # and no GPUs
    assert all(r.state == AppState.CANCELLED and r.msg == never for r in desc.roles_statuses[0].replicas), desc
    assert ledger_of(sched)["queue"] == []
    open_gate(tmp_path, holder)
    assert wait_done(sched, holder).state == AppState.SUCCEEDED
    assert ledger_of(sched) == {"holders": {}, "queue": []}


def test_a_sigkilled_supervisors_devices_go_to_the_next_job(sched: LocalScheduler, tmp_path: Path, mark: str) -> None:
    holder = submit(sched, gated(tmp_path, replicas=2, gpu=4, name="holder"))
    wait_for(lambda: devices_of(sched, holder) == set(range(8)), what="the holder to get 8 GPUs")
    waiter = submit(sched, gated(tmp_path, replicas=1, gpu=8, name="next"))
    wait_for(lambda: "held by" in sched.describe(waiter).msg, what="the next job to wait")  # type: ignore[union-attr]
    holder_dir = sched.job_dir(holder)
    sup = ledger_of(sched)["holders"][holder]["supervisor"]  # type: ignore[index]

    os.kill(sup["pid"], signal.SIGKILL)
    wait_for(lambda: sched.describe(waiter).state == AppState.RUNNING, what="the next job to start")  # type: ignore[union-attr]
    assert devices_of(sched, waiter) == set(range(8))
    left = marked_processes(mark, **{store.JOB_ENV: str(holder_dir)})
    assert not left, f"the dead holder's processes still run: {left}"
    desc = sched.describe(holder)
    assert desc is not None and desc.state == AppState.FAILED and "supervisor" in desc.msg, desc
    open_gate(tmp_path, waiter)
    assert wait_done(sched, waiter).state == AppState.SUCCEEDED


def test_a_request_larger_than_the_host_takes_nothing_from_the_ledger(sched: LocalScheduler, tmp_path: Path) -> None:
    holder = submit(sched, gated(tmp_path, replicas=1, gpu=8, name="all"))
    wait_for(lambda: devices_of(sched, holder) == set(range(8)), what="the holder to get 8 GPUs")
    with pytest.warns(UserWarning, match="requests 12 GPUs but this host has 8"):
        info = sched.submit_dryrun(gated(tmp_path, replicas=3, gpu=4, name="huge"), ON)  # type: ignore[arg-type]
    assert info.request.gpus == {}
    huge = sched.schedule(info)
    wait_for(lambda: sched.describe(huge).state == AppState.RUNNING, what="the large job to run at once")  # type: ignore[union-attr]
    wait_for(lambda: "cvd=" in log_lines(sched, huge, 0), what="an empty CUDA_VISIBLE_DEVICES")
    assert replica_devices(sched, huge) == ["", "", ""]
    for app_id in (holder, huge):
        open_gate(tmp_path, app_id)
        assert wait_done(sched, app_id).state == AppState.SUCCEEDED


@pytest.mark.parametrize(("value", "devices"), [("", []), ("3", [3]), (" 0, 2,5 ", [0, 2, 5])])
def test_host_devices_from_the_environment(monkeypatch: pytest.MonkeyPatch, value: str, devices: list[int]) -> None:
    monkeypatch.setenv(gpus.GPUS_ENV, value)
    assert gpus.host_devices() == devices


@pytest.mark.parametrize("value", ["a,b", "0,0", "-1", "1;2"])
def test_bad_host_devices_name_the_variable(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(gpus.GPUS_ENV, value)
    with pytest.raises(ValueError, match=f"{gpus.GPUS_ENV}: {value!r} is not a comma-separated list"):
        gpus.host_devices()


@pytest.mark.parametrize("content", ["garbage{", "[1, 2]", ""])
def test_a_corrupt_job_record_does_not_trip_the_ledger(tmp_path: Path, content: str) -> None:
    """A holder whose ``state.json`` and ``supervisor.json`` are corrupt counts as over (its
    devices cannot be vouched for), instead of raising inside every later job's allocation."""
    root = tmp_path / "local"
    job = root / "corrupt-job"
    job.mkdir(parents=True)
    (job / "state.json").write_text(content)
    (job / "supervisor.json").write_text(content)
    assert ledger.job_over(str(root), "corrupt-job") is True
    (job / "supervisor.json").unlink()
    assert ledger.job_over(str(root), "corrupt-job") is False  # just created: its supervisor may yet start


def test_a_gpu_job_on_a_host_without_gpus_is_refused_at_submission_unless_allowed(
    sched: LocalScheduler, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a host without GPUs a job asking for some is refused by its dry run, naming the role
    and the GPUs asked, with or without ``auto_set_cuda_visible_devices``, and nothing is
    submitted; ``allow_no_gpus=True`` runs it, without the warning about sharing the host's
    GPUs (there are none)."""
    monkeypatch.setenv(gpus.GPUS_ENV, "")
    app = AppDef("nogpu", roles=[Role("trainer", entrypoint="true", num_replicas=2, resource=Resource(1, 2, 64))])
    for cfg in ({}, ON):
        with pytest.raises(InvalidSpecError) as raised:
            sched.submit_dryrun(app, cfg)  # type: ignore[arg-type]
        assert str(raised.value).startswith(
            "resource.gpu: role 'trainer' asks for 2 GPUs per replica (2 replicas), but this host has no GPU"
        )
        assert "set the run option allow_no_gpus=True" in str(raised.value)
    assert cli_main(["run", "utils.sh", "--gpu", "1", "true"]) == 2
    err = capsys.readouterr().err
    assert "role 'sh' asks for 1 GPU per replica (1 replicas), but this host has no GPU" in err, err
    assert sched.list() == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "see every GPU of the host" on a host with none
        app_id = sched.schedule(sched.submit_dryrun(app, {"allow_no_gpus": True}))  # type: ignore[arg-type]
    assert wait_done(sched, app_id).state == AppState.SUCCEEDED
