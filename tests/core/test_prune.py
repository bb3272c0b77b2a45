"""The local job store at scale and its retention: listing reads only live jobs' files (ended
ones come from the store's index), and ``airflow-torchx prune`` removes ended jobs, never a
live one, reporting the space freed."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_torchx.core.cli import main
from airflow_provider_torchx.core.schedulers.local import store
from airflow_provider_torchx.core.schedulers.local.scheduler import LocalScheduler, create_cwd_scheduler
from tests.core.local.helpers import sh_app, wait_done
from tests.core.test_contract import Core as NoPrune
from tests.fixtures.clock import FakeClock


@pytest.fixture
def sched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalScheduler]:
    monkeypatch.setenv("AIRFLOW_TORCHX_STATE_DIR", str(tmp_path / "state"))
    s = create_cwd_scheduler("torchx")
    yield s
    for app in s.list():
        if not app.state.is_terminal():
            s.cancel(app.app_id)
            wait_done(s, app.app_id)


def _ended(sched: LocalScheduler, script: str = "echo done") -> str:
    app_id = sched.submit(sh_app(script))
    wait_done(sched, app_id)
    return app_id


def test_listing_reads_the_files_of_live_jobs_only(sched: LocalScheduler) -> None:
    done, failed = _ended(sched), _ended(sched, "exit 3")
    live = sched.submit(sh_app("sleep 300"))
    assert {a.app_id: a.state.name for a in sched.list()} == {
        done: "SUCCEEDED",
        failed: "FAILED",
        live: live_state(sched, live),
    }
    index = json.loads(Path(sched.store.root, store.FINISHED_INDEX).read_text())
    assert set(index) == {done, failed}, "only ended jobs are indexed"
    aside = Path(sched.store.root).parent
    for app_id in (done, failed):  # an ended job's files are not read again, by any process
        os.rename(Path(sched.store.job_dir(app_id), store.REQUEST), aside / app_id)
    fresh = create_cwd_scheduler("torchx")
    assert {a.app_id for a in fresh.list()} == {done, failed, live}
    for app_id in (done, failed):
        os.rename(aside / app_id, Path(sched.store.job_dir(app_id), store.REQUEST))
    fresh.delete(failed)  # a deleted job leaves the listing though its entry is still indexed
    assert {a.app_id for a in create_cwd_scheduler("torchx").list()} == {done, live}
    Path(sched.store.root, store.FINISHED_INDEX).write_text("{not json")  # a broken index: the files
    assert {a.app_id for a in create_cwd_scheduler("torchx").list()} == {done, live}


def live_state(sched: LocalScheduler, app_id: str) -> str:
    """The live job's state as ``describe`` reports it right now (PENDING or RUNNING)."""
    desc = sched.describe(app_id)
    assert desc is not None and not desc.state.is_terminal()
    return desc.state.name


def test_prune_removes_ended_jobs_only_and_reports_the_space(
    sched: LocalScheduler, capsys: pytest.CaptureFixture[str]
) -> None:
    done, failed = _ended(sched, "head -c 300000 /dev/zero"), _ended(sched, "exit 3")
    live = sched.submit(sh_app("sleep 300"))

    assert main(["prune", "--older-than", "1h"]) == 0, "nothing ended an hour ago"
    assert capsys.readouterr().out == (
        "removed 0 ended job(s) of local_cwd; freed 0.0 MB\nremoved 0 ended job(s) of local_dir; freed 0.0 MB\n"
        "removed 0 ended job(s) of slurm; freed 0.0 MB\n"
    ), "one total per scheduler with the prune capability, and no other"

    assert main(["prune", "--older-than", "0s", "--state", "failed", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{failed}  ") and "would remove 1 ended job(s) of local_cwd" in out, out
    assert {a.app_id for a in sched.list()} == {done, failed, live}, "a dry run removes nothing"

    time.sleep(0.01)
    assert main(["prune", "--older-than", "0s"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert {line.split()[0] for line in lines[:-3]} == {done, failed}, out
    freed = float(lines[-3].rsplit("freed ", 1)[1].split()[0])
    assert "removed 2 ended job(s) of local_cwd" in lines[-3] and 0.6 <= freed < 1, out  # 300 kB: stdout, combined
    assert [a.app_id for a in sched.list()] == [live], "the live job stays"
    assert not os.path.exists(sched.store.job_dir(done))


def test_each_local_scheduler_prunes_its_own_jobs_of_the_shared_store(sched: LocalScheduler, tmp_path: Path) -> None:
    """``local_cwd`` and ``local_dir`` share the job store; ``Scheduler.prune`` takes only the
    scheduler's own jobs, so that each answers for what it submitted."""
    from airflow_provider_torchx.core.schedulers.local.scheduler import create_dir_scheduler

    local_dir = create_dir_scheduler("torchx")
    image = tmp_path / "image"
    image.mkdir()
    (image / "sh").symlink_to(shutil.which("sh") or "/bin/sh")  # a local_dir role runs its image's programs
    cwd_job = _ended(sched)
    dir_job = local_dir.submit(sh_app("echo dir", image=str(image)))
    wait_done(local_dir, dir_job)
    time.sleep(0.01)
    assert [app_id for app_id, _ in sched.prune(0, dry_run=True)] == [cwd_job]
    assert [app_id for app_id, _ in local_dir.prune(0)] == [dir_job]
    assert [a.app_id for a in sched.list()] == [cwd_job] and local_dir.list() == []


def test_the_cli_prunes_every_registered_scheduler_with_the_capability(
    sched: LocalScheduler, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A plugin scheduler (``acme``, ``tests/plugin``) that declares ``prune`` is pruned by the
    CLI through its own ``Scheduler.prune``, beside the local ones; one without it is not asked."""
    from airflow_provider_torchx.core import runner as runner_module
    from airflow_provider_torchx.core.schedulers.local.scheduler import create_dir_scheduler
    from tests.plugin.acme_scheduler import create_scheduler

    monkeypatch.setenv("ACME_JOBS_DIR", str(tmp_path / "acme"))
    factories = {"acme": create_scheduler, "local_cwd": create_cwd_scheduler, "local_dir": create_dir_scheduler}
    unasked: list[str] = []

    def no_prune(session_name: str, **kwargs: object) -> Any:
        unasked.append(session_name)
        return NoPrune("no_prune", session_name)

    monkeypatch.setattr(runner_module, "_entry_point_factories", lambda: {**factories, "no_prune": no_prune})
    acme = create_scheduler("torchx")
    ended, live = (acme.schedule(acme.submit_dryrun(sh_app(script))) for script in ("echo acme", "sleep 300"))
    deadline = time.monotonic() + 30
    while (desc := acme.describe(ended)) is not None and not desc.state.is_terminal():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    local = _ended(sched)
    time.sleep(0.01)
    try:
        assert main(["prune", "--older-than", "0s"]) == 0
    finally:
        acme.cancel(live)
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out if not line.startswith("removed")] == [ended, local], out
    assert [line.rsplit(";", 1)[0] for line in out if line.startswith("removed")] == [
        "removed 1 ended job(s) of acme",
        "removed 1 ended job(s) of local_cwd",
        "removed 0 ended job(s) of local_dir",
    ]
    assert [a.app_id for a in acme.list()] == [live] and unasked == ["torchx"], "built for its capabilities only"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--older-than", "30 days"], "--older-than: '30 days' is not a duration"),
        (["--older-than", "30d", "--state", "running"], "invalid choice: 'RUNNING'"),
        ([], "the following arguments are required: --older-than"),
    ],
)
def test_prune_usage_errors_remove_nothing(
    sched: LocalScheduler, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    done = _ended(sched)
    assert main(["prune", *argv]) == 2
    assert message in capsys.readouterr().err
    assert [a.app_id for a in sched.list()] == [done]


def test_cli_list_shows_the_newest_unless_all(
    sched: LocalScheduler, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_provider_torchx.core import cli

    first, second, third = (_ended(sched) for _ in range(3))
    monkeypatch.setattr(cli, "LIST_DEFAULT_LIMIT", 2)
    assert main(["list"]) == 0
    out, err = capsys.readouterr()
    assert first not in out and second in out and third in out, out
    assert "1 older job(s) not shown: `airflow-torchx list --all` shows every job" in err
    assert main(["list", "--all"]) == 0
    out, err = capsys.readouterr()
    assert all(app_id in out for app_id in (first, second, third)) and err == ""
    monkeypatch.setattr(cli, "LIST_DEFAULT_LIMIT", 3)  # exactly the limit: nothing hidden
    assert main(["list"]) == 0
    out, err = capsys.readouterr()
    assert all(app_id in out for app_id in (first, second, third)) and err == ""
    monkeypatch.setattr(cli, "LIST_DEFAULT_LIMIT", 1)
    assert main(["list"]) == 0
    out, err = capsys.readouterr()
    assert third in out and second not in out and "2 older job(s) not shown" in err


def _job_with_checkpoint(
    sched: LocalScheduler, location: str, script: str = "echo done", labels: dict[str, str] | None = None
) -> str:
    """A job given ``location`` that saves a checkpoint there (as a training job would)."""
    from airflow_provider_torchx.core import checkpoints

    save = 'mkdir -p "$TORCHX_CHECKPOINT_DIR" && head -c 5000 /dev/zero > "$TORCHX_CHECKPOINT_DIR/step-1.pt"'
    app = sh_app(f"{save}; {script}")
    checkpoints.place(app, location, 0, host_paths=True)
    app_id = sched.submit(app, labels=labels)
    if script == "echo done":
        wait_done(sched, app_id)
    else:
        deadline = time.monotonic() + 30
        while not Path(location, "step-1.pt").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    return app_id


def test_prune_checkpoints_removes_only_what_no_live_job_uses_and_nobody_wrote_lately(
    sched: LocalScheduler, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Checkpoints belong to the task instance: ``prune`` keeps them unless asked
    (``--checkpoints``); then a location a live job names is kept, and so is one written
    within the limit, even once its jobs are gone."""
    alone, shared = str(tmp_path / "ck" / "alone"), str(tmp_path / "ck" / "shared")
    _job_with_checkpoint(sched, alone)
    _job_with_checkpoint(sched, shared)
    live = _job_with_checkpoint(sched, shared, "sleep 300")  # a later try of the same task instance
    assert main(["prune", "--older-than", "0s"]) == 0
    assert Path(alone).is_dir() and Path(shared).is_dir(), "kept unless asked"
    capsys.readouterr()
    _job_with_checkpoint(sched, alone)
    assert main(["prune", "--older-than", "1h", "--checkpoints"]) == 0
    out = capsys.readouterr().out
    assert f"kept {alone}: written " in out and "removed 0 checkpoint dir(s)" in out, out
    assert main(["prune", "--older-than", "0s", "--checkpoints", "--dry-run"]) == 0
    out = capsys.readouterr().out
    (line,) = [line for line in out.splitlines() if line.startswith(f"{alone}  ")]
    assert ": no Airflow task's; last written " in line, line
    assert f"kept {shared}: job {live}, which uses it, has not ended" in out
    assert "would remove 1 checkpoint dir(s)" in out and Path(alone).is_dir()
    assert main(["prune", "--older-than", "0s", "--checkpoints"]) == 0
    assert "removed 1 checkpoint dir(s)" in capsys.readouterr().out
    assert not Path(alone).exists() and Path(shared).is_dir()
    assert sched.describe(live) is not None


#: The CLI where Airflow cannot be imported (the core's own test does the same).
_NO_AIRFLOW = """
import importlib.abc, sys
class BlockAirflow(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "airflow" or name.startswith("airflow."):
            raise ImportError(name)
sys.meta_path.insert(0, BlockAirflow())
from airflow_provider_torchx.core.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_prune_checkpoints_without_airflow_judges_by_the_writes_and_jobs_only(
    sched: LocalScheduler, tmp_path: Path
) -> None:
    """Where Airflow cannot be imported, an Airflow task's location is judged conservatively:
    by its newest write and its jobs' ends against the limit, and says so."""
    import subprocess
    import sys

    from airflow_provider_torchx.core import checkpoints
    from airflow_provider_torchx.core.identity import TaskIdentity

    identity = TaskIdentity("train", "fit", "manual__1")
    location = checkpoints.checkpoint_dir(str(tmp_path / "ck"), identity)
    _job_with_checkpoint(sched, location, labels=identity.labels())

    def cli(*args: str) -> str:
        out = subprocess.run([sys.executable, "-c", _NO_AIRFLOW, *args], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stdout

    assert f"kept {location}: written " in cli("prune", "--older-than", "1h", "--checkpoints")
    out = cli("prune", "--older-than", "0s", "--checkpoints")
    assert f"{location}  " in out and "Airflow not at hand: judged by its writes and jobs only" in out, out
    assert not Path(location).exists() and not (tmp_path / "ck" / "train").exists()


def test_prune_judges_a_jobs_age_on_the_schedulers_clock(sched: LocalScheduler) -> None:
    """An ended job is as old as the scheduler's clock says: kept an hour before, taken once
    the clock is two hours on (``LocalScheduler(clock=...)``, the fixture clock of the tests)."""
    done = _ended(sched)
    clock = FakeClock(now=time.time())
    aged = create_cwd_scheduler("torchx", clock=clock.clock)
    assert aged.prune(older_than=3600, dry_run=True) == []
    clock.advance(2 * 3600)
    assert [app_id for app_id, _ in aged.prune(older_than=3600, dry_run=True)] == [done]


def test_prune_checkpoints_reports_links_as_skipped_never_removed(
    sched: LocalScheduler, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run-level directory swapped for a link to a directory outside: the location is
    skipped and the file there survives; a link inside a location that goes is left and
    named, and the space freed counts only what was removed."""
    from airflow_provider_torchx.core import checkpoint_prune, checkpoints
    from airflow_provider_torchx.core.identity import TaskIdentity

    monkeypatch.setattr(checkpoint_prune, "load_task_states", lambda: None)  # Airflow not at hand
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_bytes(b"p")
    identity = TaskIdentity("train", "fit", "manual__1")
    swapped = checkpoints.checkpoint_dir(str(tmp_path / "ck"), identity)
    _job_with_checkpoint(sched, swapped, labels=identity.labels())
    run_dir = Path(swapped).parent
    os.rename(run_dir, outside / "run")
    run_dir.symlink_to(outside / "run")
    linked = str(tmp_path / "mine")
    _job_with_checkpoint(sched, linked)
    Path(linked, "latest.pt").symlink_to(outside / "precious")

    assert main(["prune", "--older-than", "0s", "--checkpoints"]) == 0
    out = capsys.readouterr().out
    assert f"skipped {swapped}: {run_dir} is a symbolic link: not followed" in out, out
    assert f"; left 1 symbolic link(s), not followed: {linked}/latest.pt" in out, out
    assert "removed 0 checkpoint dir(s) (and 1 in part: what is left in them is named above); freed 0.0 MB" in out
    assert (outside / "run" / "fit" / "step-1.pt").exists() and (outside / "precious").read_bytes() == b"p"
    assert [p.name for p in Path(linked).iterdir()] == ["latest.pt"] and run_dir.is_symlink()


def test_set_aside_moves_a_location_no_live_job_uses_and_says_where(
    sched: LocalScheduler, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused while a job using it runs (nothing moved); then renamed beside it, found by the
    job's handle or the path; nothing there is said so."""
    location = str(tmp_path / "ck" / "task")
    live = _job_with_checkpoint(sched, location, "sleep 300")
    assert main(["set-aside", "--dir", location]) == 1
    assert f"job(s) {live} still use {location}: cancel them first" in capsys.readouterr().err
    assert Path(location, "step-1.pt").exists()
    sched.cancel(live)
    wait_done(sched, live)
    assert main(["set-aside", "--job", f"local_cwd://torchx/{live}"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"set aside {location} -> {location}+set-aside-") and "(kept;" in out, out
    moved = out.split(" -> ")[1].split(" (kept;")[0]
    assert Path(moved, "step-1.pt").exists() and not Path(location).exists()
    assert main(["set-aside", "--dir", location]) == 0
    assert f"nothing at {location}: the next job starts over anyway" in capsys.readouterr().out
