"""The local scheduler under faults: a full or read-only job store, corrupt job files,
daemons that escape their replica, a killed supervisor, file modes under any umask.

The store faults use a real 1 MiB tmpfs and a real read-only bind mount (the tests run as
root); where the machine refuses to mount, they skip saying so.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from airflow_provider_torchx.core import cli
from airflow_provider_torchx.core.schedulers.api import CancelledBy
from airflow_provider_torchx.core.schedulers.local import (
    LocalScheduler,
    create_cwd_scheduler,
    create_scheduler,
    procfs,
    store,
)
from airflow_provider_torchx.core.specs import AppState, make_app_handle
from tests.core.local.conftest import marked_processes, wait_gone
from tests.core.local.helpers import sh_app, wait_done, wait_for_line, wait_running
from tests.fixtures.clock import FakeClock
from tests.fixtures.files import swap_dir_for_symlink, swap_file_for_symlink


def _mount(*args: str) -> None:
    """Run ``mount ARGS``; skip the test when the machine refuses (not root, no CAP_SYS_ADMIN)."""
    done = subprocess.run(["mount", *args], capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"this machine refuses `mount {' '.join(args)}`: {done.stderr.strip()}")


def _umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


@pytest.fixture
def tiny(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs for the job store."""
    path = tmp_path / "tiny"
    path.mkdir()
    _mount("-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(path))
    yield path
    _umount(path)


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """``(rw, ro)``: a directory and a read-only bind mount of it."""
    rw, ro = tmp_path / "rw", tmp_path / "ro"
    rw.mkdir()
    ro.mkdir()
    _mount("--bind", str(rw), str(ro))
    try:
        _mount("-o", "remount,bind,ro", str(ro))
        yield rw, ro
    finally:
        _umount(ro)


def fill(directory: Path) -> Path:
    """Fill the filesystem of ``directory`` to the last block; return the filler file (grown
    again, not replaced, when called again)."""
    filler = directory / "filler"
    with open(filler, "ab", buffering=0) as f:
        for size in (1 << 16, 1 << 12, 1 << 9, 1):
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError:
                continue
    return filler


def temp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.endswith(".tmp")]


def kill_supervisor(sched: LocalScheduler, app_id: str) -> None:
    sup = json.loads((sched.job_dir(app_id) / store.SUPERVISOR).read_text())
    assert procfs.signal_if_same(sup["pid"], sup["start"], signal.SIGKILL)
    deadline = time.monotonic() + 5
    while procfs.is_alive(sup["pid"], sup["start"]):
        assert time.monotonic() < deadline
        time.sleep(0.01)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ------------------------------------------------------------------ a full store


def test_a_job_that_fills_the_disk_ends_failed_saying_so(tiny: Path, mark: str) -> None:
    sched = create_cwd_scheduler("test", state_dir=tiny)
    app_id = sched.submit(sh_app("yes 0123456789abcdef | head -c 3000000; sleep 30"))
    desc = wait_done(sched, app_id)
    assert desc.state == AppState.FAILED
    assert "No space left on device" in desc.msg, desc.msg
    on_disk = json.loads((sched.job_dir(app_id) / store.STATE).read_text())
    assert on_disk["state"] == "FAILED" and "No space left" in on_disk["msg"]  # recorded, not only reported
    assert temp_files(tiny) == []
    assert [a.app_id for a in sched.list()] == [app_id]


def test_reads_work_on_a_full_store_and_report_a_dead_supervisor(
    tiny: Path, mark: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_TORCHX_STATE_DIR", str(tiny))
    sched = create_cwd_scheduler("test")
    app_id = sched.submit(sh_app("echo hello; sleep 30"))
    wait_for_line(sched, app_id, "r0", "hello")
    filler = fill(tiny)
    kill_supervisor(sched, app_id)

    desc = sched.describe(app_id)  # reported (describe writes nothing)...
    assert desc is not None and desc.state == AppState.FAILED and "died" in desc.msg
    desc = sched.finalize(app_id)  # ...and the finaliser, which stops the job, cannot record it
    assert desc is not None and desc.state == AppState.FAILED and "died" in desc.msg
    assert "not recorded" in desc.msg and "No space left on device" in desc.msg, desc.msg
    state = json.loads((sched.job_dir(app_id) / store.STATE).read_text())
    assert state["state"] == "RUNNING"  # ...not recorded: nothing could be written
    assert [(a.app_id, a.state) for a in sched.list()] == [(app_id, AppState.FAILED)]
    assert sched.read_log(app_id, "r0").lines == ["hello\n"]
    handle = f"local_cwd://test/{app_id}"
    for command in ("status", "describe"):
        code, out, err = run_cli(capsys, command, handle)
        assert code == 0 and "Traceback" not in err, (command, err)
    code, out, err = run_cli(capsys, "list")
    assert code == 0 and app_id in out

    with pytest.raises(store.StoreError, match=f"job store {tiny}/local: .*No space left on device"):
        sched.submit(sh_app("true"))
    assert _supervisors_in(tiny, timeout=10) == []  # the one started for it was told to exit
    code, out, err = run_cli(capsys, "run", "utils.sh", "true")
    assert code == cli.EXIT_SYSTEM and f"job store {tiny}/local" in err and "No space left on device" in err
    assert "Traceback" not in err
    assert [p.name for p in (tiny / "local").iterdir()] == [app_id]  # nothing half-written
    assert temp_files(tiny) == []

    filler.unlink()
    desc = create_cwd_scheduler("test").finalize(app_id)  # the next finaliser records it
    assert desc is not None and desc.state == AppState.FAILED and "not recorded" not in desc.msg
    assert json.loads((sched.job_dir(app_id) / store.STATE).read_text())["state"] == "FAILED"


def _supervisors_in(state_dir: Path, timeout: float) -> list[psutil.Process]:
    """The supervisors of jobs below ``state_dir`` still running after ``timeout`` (a
    supervisor's last argument is its job directory)."""
    deadline = time.monotonic() + timeout
    while True:
        left = []
        for p in psutil.process_iter(["cmdline"]):
            cmdline = p.info["cmdline"] or []
            if cmdline and cmdline[-1].startswith(f"{state_dir}/") and "supervisor" in " ".join(cmdline):
                left.append(p)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


# ------------------------------------------------------------------ a read-only store


def test_a_read_only_store_gives_clear_errors_and_reads_still_work(
    read_only: tuple[Path, Path], mark: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    rw_dir, ro_dir = read_only
    writer = create_cwd_scheduler("test", state_dir=rw_dir, cancel_grace_period=1.0)
    app_id = writer.submit(sh_app("sleep 30"))
    wait_running(writer, app_id)
    reader = create_cwd_scheduler("test", state_dir=ro_dir)
    ro_root = f"{ro_dir}/local"

    with pytest.raises(store.StoreError, match=f"job store {ro_root}: .*Read-only"):
        reader.submit(sh_app("true"))
    monkeypatch.setenv("AIRFLOW_TORCHX_STATE_DIR", str(ro_dir))
    handle = f"local_cwd://test/{app_id}"
    for argv in (("run", "utils.sh", "true"),):
        code, out, err = run_cli(capsys, *argv)
        assert code == cli.EXIT_SYSTEM, (argv, out, err)
        assert ro_root in err and "Read-only file system" in err and "Traceback" not in err, (argv, err)
    desc = reader.describe(app_id)
    assert desc is not None and desc.state == AppState.RUNNING and not desc.cancel_requested  # untouched

    kill_supervisor(writer, app_id)
    desc = reader.describe(app_id)
    assert desc is not None and desc.state == AppState.FAILED and "not recorded" not in desc.msg
    desc = reader.finalize(app_id)
    assert desc is not None and desc.state == AppState.FAILED and "not recorded" in desc.msg
    assert [(a.app_id, a.state) for a in reader.list()] == [(app_id, AppState.FAILED)]
    frozen = FakeClock(now=time.time()).clock  # the end it would record is at the prune's cutoff
    assert create_cwd_scheduler("test", state_dir=ro_dir, clock=frozen).prune(older_than=0) == []  # not recorded
    code, out, err = run_cli(capsys, "status", handle)
    assert code == 0 and "FAILED" in out, err
    assert temp_files(rw_dir) == []
    desc = writer.finalize(app_id)  # a finaliser that can write records it
    assert desc is not None and desc.state == AppState.FAILED
    assert json.loads((writer.job_dir(app_id) / store.STATE).read_text())["state"] == "FAILED"


def test_a_cancel_on_a_read_only_store_still_stops_the_job(
    read_only: tuple[Path, Path], mark: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    rw_dir, ro_dir = read_only
    writer = create_cwd_scheduler("test", state_dir=rw_dir, cancel_grace_period=1.0)
    app_id = writer.submit(sh_app("sleep 300"))
    wait_running(writer, app_id)
    replicas = _replica_processes(writer, app_id)
    monkeypatch.setenv("AIRFLOW_TORCHX_STATE_DIR", str(ro_dir))
    code, out, err = run_cli(capsys, "cancel", f"local_cwd://test/{app_id}")
    assert code == 0, (out, err)
    assert f"job store {ro_dir}/local: cannot record the cancel of {app_id!r}: Read-only file system" in out
    assert "its supervisor was signalled: the job stops and is recorded CANCELLED" in out, out
    desc = wait_done(writer, app_id)
    assert desc.state == AppState.CANCELLED and desc.msg.startswith("cancelled by request"), desc.msg
    assert not [p for p in replicas if procfs.is_alive(*p)]


def test_a_cancel_on_a_full_store_stops_the_job_and_is_recorded_once_writable(tiny: Path, mark: str) -> None:
    sched = create_cwd_scheduler("test", state_dir=tiny, cancel_grace_period=1.0)
    app_id = sched.submit(sh_app("sleep 300"))
    wait_running(sched, app_id)
    replicas = _replica_processes(sched, app_id)
    (sched.job_dir(app_id) / ".reserve").unlink()  # no room kept for the last state either
    filler = fill(tiny)
    # A state write the supervisor made just before the disk filled frees the old file's page
    # when it is renamed over it: wait for such a rename, then take that page too.
    time.sleep(0.5)
    fill(tiny)
    with pytest.raises(store.CancelNotRecordedError, match=r"No space left on device.*supervisor was signalled"):
        sched.cancel(app_id)
    deadline = time.monotonic() + 30
    while [p for p in replicas if procfs.is_alive(*p)]:
        assert time.monotonic() < deadline, "the cancel did not stop the job"
        time.sleep(0.05)
    assert json.loads((sched.job_dir(app_id) / store.STATE).read_text())["state"] == "RUNNING", "no room to record"
    filler.unlink()
    desc = wait_done(sched, app_id)
    assert desc.state == AppState.CANCELLED and desc.msg.startswith("cancelled by request"), desc.msg
    assert json.loads((sched.job_dir(app_id) / store.STATE).read_text())["state"] == "CANCELLED"


def _replica_processes(sched: LocalScheduler, app_id: str) -> list[tuple[int, int]]:
    state = json.loads((sched.job_dir(app_id) / store.STATE).read_text())
    return [(r["pid"], r["start"]) for reps in state["replicas"].values() for r in reps]


# ------------------------------------------------------------------ corrupt entries


def _truncated(text: bytes) -> bytes:
    return text[: len(text) // 2]


BAD_ATTEMPTS = b'{"state": "FAILED", "replicas": {"r0": [{"state": "FAILED", "attempts": [1]}]}}'
CORRUPT = [
    pytest.param("state.json", lambda _: b"garbage{", id="state-garbage"),
    pytest.param("state.json", lambda _: b'{"state": "BOGUS"}', id="state-bad-state"),
    pytest.param("state.json", lambda _: BAD_ATTEMPTS, id="state-bad-attempts"),
    pytest.param("request.json", lambda b: b.replace(b'"roles":[{', b'"roles":[7,{'), id="request-bad-roles"),
    pytest.param("request.json", _truncated, id="request-truncated"),
    pytest.param("request.json", lambda _: b"{}", id="request-empty-object"),
    pytest.param("request.json", lambda _: b"[1,2]", id="request-list"),
    pytest.param("request.json", lambda _: b'{"backend": "local_cwd"}', id="request-missing-keys"),
    pytest.param(None, None, id="foreign-file-in-the-store"),
]


@pytest.mark.parametrize(("name", "corrupt"), CORRUPT)
def test_a_corrupt_entry_is_skipped_by_list_and_named_by_describe(
    name: str | None,
    corrupt: object,
    sched: LocalScheduler,
    state_dir: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    good = sched.submit(sh_app("true"))
    wait_done(sched, good)
    bad = "bad-0123456789ab"
    bad_path = state_dir / "local" / bad
    if name is None:
        bad_path.write_text("not a job")
        named = bad_path
    else:
        shutil.copytree(sched.job_dir(good), bad_path)
        named = bad_path / name
        named.write_bytes(corrupt(named.read_bytes()))  # type: ignore[operator]
    fresh = create_cwd_scheduler("test")  # nothing cached

    with caplog.at_level(logging.WARNING):
        assert [a.app_id for a in fresh.list()] == [good]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and bad in warnings[0] and str(named) in warnings[0], warnings
    with pytest.raises(store.CorruptEntryError, match=f"job '{bad}': {named} is corrupt"):
        fresh.describe(bad)

    caplog.clear()
    code, out, err = run_cli(capsys, "list")
    assert code == 0 and good in out and bad not in out
    assert [str(named) in r.getMessage() for r in caplog.records] == [True]
    code, out, err = run_cli(capsys, "status", f"local_cwd://test/{bad}")
    assert code == cli.EXIT_USAGE and str(named) in err and "Traceback" not in err
    code, out, err = run_cli(capsys, "delete", f"local_cwd://test/{bad}")
    assert code == 0 and not bad_path.exists(), err
    assert [a.app_id for a in fresh.list()] == [good]


def test_a_swapped_job_file_is_refused_never_read(
    sched: LocalScheduler, state_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job whose ``request.json`` or ``state.json`` was replaced by a symbolic link, or whose
    directory was, is a corrupt entry naming the file: ``describe`` raises, ``list`` skips it,
    the CLI exits 2; the link's target (valid job files carrying a secret) is never read."""
    good = sched.submit(sh_app("true"))
    wait_done(sched, good)
    outside = tmp_path / "outside"
    shutil.copytree(sched.job_dir(good), outside)
    rec = json.loads((outside / store.REQUEST).read_text())
    (outside / store.REQUEST).write_text(json.dumps(rec | {"labels": {"token": "SECRET-TARGET"}}))
    st = json.loads((outside / store.STATE).read_text())
    (outside / store.STATE).write_text(json.dumps(st | {"msg": "SECRET-TARGET"}))
    swapped: dict[str, tuple[Path, str]] = {}
    for name in (store.REQUEST, store.STATE):
        app_id = f"swap-{name.split('.')[0]}-0123456789ab"
        shutil.copytree(sched.job_dir(good), state_dir / "local" / app_id)
        link = state_dir / "local" / app_id / name
        swap_file_for_symlink(link, outside / name)
        swapped[app_id] = (link, "refused: it is a symbolic link")
    (state_dir / "local" / "swap-dir-0123456789ab").symlink_to(outside)
    swapped["swap-dir-0123456789ab"] = (
        state_dir / "local" / "swap-dir-0123456789ab" / store.REQUEST,
        "refused: a directory on its way below .* is a symbolic link",
    )
    fresh = create_cwd_scheduler("test")  # nothing cached

    assert [a.app_id for a in fresh.list()] == [good]
    for app_id, (path, why) in swapped.items():
        with pytest.raises(store.CorruptEntryError, match=f"job '{app_id}': {path} is corrupt \\({why}") as err:
            fresh.describe(app_id)
        assert "SECRET" not in str(err.value)
        code, out, err_text = run_cli(capsys, "status", f"local_cwd://test/{app_id}")
        assert code == cli.EXIT_USAGE and str(path) in err_text and "SECRET" not in out + err_text, err_text
    code, out, _ = run_cli(capsys, "list")
    assert code == 0 and good in out and "swap" not in out


def test_a_swapped_job_directory_is_no_sidecar_dir(sched: LocalScheduler, state_dir: Path, tmp_path: Path) -> None:
    """Watchers keep their cursor files beside a job (``sidecar_dir``) only in its real
    directory: a job directory that is a symbolic link gives none."""
    good = sched.submit(sh_app("true"))
    wait_done(sched, good)
    outside = tmp_path / "outside"
    shutil.copytree(sched.job_dir(good), outside)
    (state_dir / "local" / "swap-dir-0123456789ab").symlink_to(outside)
    assert sched.sidecar_dir(good) == sched.job_dir(good)
    assert sched.sidecar_dir("swap-dir-0123456789ab") is None


def test_a_swapped_cancel_request_still_cancels_and_is_never_read(sched: LocalScheduler, tmp_path: Path) -> None:
    """A ``cancel.json`` that is a symbolic link when the supervisor is signalled: the job
    ends CANCELLED all the same (its supervisor records it), the link's target is not read as
    the request, and ``describe`` names the swapped file."""
    app_id = sched.submit(sh_app("sleep 300"))
    wait_running(sched, app_id)
    forged = tmp_path / "forged-cancel.json"
    forged.write_text(json.dumps({"reason": "SECRET-REASON", "grace": 1}))
    (sched.job_dir(app_id) / store.CANCEL).symlink_to(forged)
    supervisor = json.loads((sched.job_dir(app_id) / store.SUPERVISOR).read_text())
    os.kill(supervisor["pid"], signal.SIGTERM)
    state_file = sched.job_dir(app_id) / store.STATE
    deadline = time.monotonic() + 30
    while (st := json.loads(state_file.read_text()))["state"] != "CANCELLED":
        assert time.monotonic() < deadline, f"the job did not end CANCELLED: {st}"
        time.sleep(0.05)
    assert "SECRET" not in st["msg"], st["msg"]
    with pytest.raises(store.CorruptEntryError, match=r"cancel\.json is corrupt \(refused: it is a symbolic link"):
        sched.describe(app_id)


def refused_pair(sched: LocalScheduler, tmp_path: Path, labels: dict[str, str] | None = None) -> tuple[str, str]:
    """Two running jobs (with ``labels``): the first's ``state.json`` then swapped for a
    symbolic link to a copy of it, the second's directory for one to where it was moved."""
    by_state, by_dir = (sched.submit(sh_app("sleep 600"), labels=labels or {}) for _ in range(2))
    for app_id in (by_state, by_dir):
        wait_running(sched, app_id)
    state_file = sched.job_dir(by_state) / store.STATE
    (tmp_path / "state.json").write_text(state_file.read_text())
    swap_file_for_symlink(state_file, tmp_path / "state.json")
    swap_dir_for_symlink(sched.job_dir(by_dir), tmp_path / "moved")
    return by_state, by_dir


def test_a_job_whose_state_file_or_directory_was_swapped_is_cancelled_all_the_same(
    sched: LocalScheduler, mark: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A running job whose ``state.json`` or whole directory became a symbolic link cannot be
    described, yet a cancel (the scheduler's, the CLI's) reaches its supervisor (known from
    ``/proc``, not from the refused file) and the job's processes end; the message names the
    refused file. A job with no supervisor left is still refused (``delete`` removes it)."""
    by_state, by_dir = refused_pair(sched, tmp_path)
    state_file = sched.job_dir(by_state) / store.STATE
    fresh = create_cwd_scheduler("test")  # nothing cached

    with pytest.raises(store.CancelDeliveredError) as err:
        fresh.cancel(by_state)
    assert f"{state_file} is corrupt (refused: it is a symbolic link" in str(err.value)
    assert "its supervisor (pid " in str(err.value)
    code, out, err_text = run_cli(capsys, "cancel", make_app_handle("local_cwd", "test", by_dir))
    assert code == 0, err_text
    refused = sched.job_dir(by_dir) / store.REQUEST
    assert f"cancel requested (job '{by_dir}': {refused} is corrupt (refused: a directory on its way" in out, out
    assert wait_gone(mark, 30) == [], "the jobs' processes outlived the cancel"
    with pytest.raises(store.CorruptEntryError, match="is corrupt") as err:  # no supervisor to reach any more
        fresh.cancel(by_dir)
    assert not isinstance(err.value, store.CancelDeliveredError)
    for app_id in (by_state, by_dir):
        fresh.delete(app_id)


def test_the_cli_warns_on_stderr_naming_the_corrupt_file(sched: LocalScheduler, state_dir: Path) -> None:
    good = sched.submit(sh_app("true"))
    wait_done(sched, good)
    (sched.job_dir(good) / store.STATE).write_text("{}")
    done = subprocess.run(
        [sys.executable, "-m", "airflow_provider_torchx.core.cli", "list"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "no jobs on local_cwd" in done.stderr
    assert f"job '{good}': {sched.job_dir(good) / store.STATE} is corrupt" in done.stderr, done.stderr


def test_a_failed_write_leaves_no_temp_file(tiny: Path) -> None:
    filler = fill(tiny)
    target = tiny / "state.json"
    with pytest.raises(OSError, match="No space left"):
        store.write_json_atomic(target, {"big": "x" * 100_000})
    assert list(tiny.iterdir()) == [filler]


# ------------------------------------------------------------------ no process outlives its job


def _token_processes(token: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if any(token in part for part in p.info["cmdline"] or ()):
            found.append(p)
    return found


@pytest.fixture
def token() -> Iterator[str]:
    """A word for the command lines of processes a test starts without the job's env (so the
    ``mark`` sweep cannot see them); any left at the end is killed."""
    value = f"{int(uuid.uuid4().int % 10**6)}.{os.getpid()}"
    yield value
    for p in _token_processes(value):
        p.kill()


def test_a_double_forked_daemon_never_outlives_its_job_50_times(sched: LocalScheduler, token: str) -> None:
    # The replica exits at once; a middle process forks daemons (one keeps the job's env and
    # leaves the session, one also clears its env) after a varying delay, then exits.
    daemons = f"setsid sleep 1{token} & setsid env -i sleep 2{token} &"
    apps = [sh_app(f"(sleep 0.00{i % 10}; {daemons}) & exit 0", name=f"daemon{i}") for i in range(50)]
    for batch in range(0, 50, 10):
        ids = [sched.submit(app) for app in apps[batch : batch + 10]]
        for app_id in ids:
            assert wait_done(sched, app_id).state == AppState.SUCCEEDED
        left = _token_processes(token)
        assert not left, f"after jobs {batch}..{batch + 9}: {[p.info['cmdline'] for p in left]}"


def test_orphans_of_a_killed_supervisor_are_gone_within_one_sweep(sched: LocalScheduler, mark: str, token: str) -> None:
    app_id = sched.submit(sh_app(f"setsid sleep 3{token} & setsid env -i sleep 4{token} & sleep 30"))
    wait_running(sched, app_id)
    state_file = sched.job_dir(app_id) / store.STATE
    deadline = time.monotonic() + 5
    while len(json.loads(state_file.read_text()).get("tracked", [])) < 2:  # recorded every second
        assert time.monotonic() < deadline, state_file.read_text()
        time.sleep(0.05)
    kill_supervisor(sched, app_id)
    before = state_file.read_text()
    desc = sched.describe(app_id)  # reported at once, side-effect free: nothing stopped or written
    assert desc is not None and desc.state == AppState.FAILED and "died" in desc.msg
    assert _token_processes(token) and state_file.read_text() == before
    t0 = time.monotonic()
    desc = sched.finalize(app_id)  # what a waiter (Runner.wait) does with that end: one sweep
    swept = time.monotonic() - t0
    assert desc is not None and desc.state == AppState.FAILED
    assert not _token_processes(token)
    assert swept < 1.0
    named = re.search(r"stopped (\d+) process\(es\) left outside the replicas: (.*)", desc.msg)
    assert named and int(named[1]) >= 2 and named[2].count("(sleep)") >= 2, desc.msg


def test_reads_of_a_job_whose_supervisor_died_change_nothing_and_cancel_settles_it(
    sched: LocalScheduler, mark: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every read (``describe``, ``list``, log reads, the CLI's ``status``, ``describe`` and
    ``log``) reports the job ended and leaves it as it is; ``cancel`` (one of those that act
    on a job's end) stops its replicas and records the end."""
    app_id = sched.submit(sh_app("echo up; sleep 300"))
    wait_for_line(sched, app_id, "r0", "up")
    kill_supervisor(sched, app_id)
    state_file = sched.job_dir(app_id) / store.STATE
    before = state_file.read_text()
    handle = make_app_handle("local_cwd", "test", app_id)
    desc = sched.describe(app_id)
    assert desc is not None and desc.state == AppState.FAILED and "died" in desc.msg
    assert [a.state for a in sched.list() if a.app_id == app_id] == [AppState.FAILED]
    assert list(sched.log_iter(app_id, "r0", 0, should_tail=True)) == ["up\n"]
    assert sched.read_log(app_id, "r0", 0).lines == ["up\n"]
    for argv in (["status", handle], ["describe", handle], ["log", handle], ["log", "--tail", handle]):
        code, out, _ = run_cli(capsys, *argv)
        assert code == 0 and ("FAILED" in out or "up" in out), (argv, out)
    assert state_file.read_text() == before, "a read wrote the job's end"
    assert marked_processes(mark), "a read stopped the job's replicas"
    code, out, _ = run_cli(capsys, "cancel", handle)
    assert code == 0 and "already FAILED" in out, out
    assert "its replicas were stopped" in json.loads(state_file.read_text())["msg"], state_file.read_text()
    assert wait_gone(mark, 10.0) == []


def test_processes_left_at_the_end_are_named_in_the_status(sched: LocalScheduler, mark: str) -> None:
    app_id = sched.submit(sh_app("setsid sleep 300 & sleep 0.1"))
    desc = wait_done(sched, app_id)
    assert desc.state == AppState.SUCCEEDED
    assert "stopped 1 process(es) left behind by the replicas" in desc.msg and "(sleep)" in desc.msg, desc.msg


def test_a_daemon_of_a_replica_that_ended_is_named_when_the_job_fails(sched: LocalScheduler, mark: str) -> None:
    app_id = sched.submit(sh_app("setsid sleep 300 & exit 0", "sleep 0.5; exit 3"))
    desc = wait_done(sched, app_id)
    assert desc.state == AppState.FAILED
    assert "stopped 1 process(es) left behind by the replicas" in desc.msg and "(sleep)" in desc.msg, desc.msg


def test_a_stop_waits_for_the_stopped_trees_and_names_none_of_them(
    sched: LocalScheduler, mark: str, tmp_path: Path
) -> None:
    """Replica 0's shell dies of the stop's SIGTERM at once while its child (as torchrun under
    ``sh -c``) still shuts down: the job waits for that child, which is no leftover."""
    ready, cleaned = tmp_path / "ready", tmp_path / "cleaned"
    inner = f"trap 'sleep 0.5; touch {cleaned}; exit 0' TERM; touch {ready}; sleep 30 & wait"
    app_id = sched.submit(
        sh_app(f'sh -c "{inner}"; echo never', f"while [ ! -e {ready} ]; do sleep 0.05; done; exit 3")
    )
    desc = wait_done(sched, app_id)
    assert desc.state == AppState.FAILED
    assert desc.msg == "role 'r1' replica 0 exited with code 3", desc.msg
    assert cleaned.exists(), "the stopped child was killed before it had shut down"


# ------------------------------------------------------------------ modes and states


def test_everything_a_job_creates_is_owner_only_under_umask_000(
    sched: LocalScheduler, state_dir: Path, tmp_path: Path
) -> None:
    log_dir = tmp_path / "logs" / "deep"
    old = os.umask(0)
    try:
        app_id = sched.submit(sh_app("umask", "true", num_replicas=2), cfg={"log_dir": str(log_dir)})
        desc = wait_done(sched, app_id)
    finally:
        os.umask(old)
    assert desc.state == AppState.SUCCEEDED
    assert "".join(sched.log_iter(app_id, "r0")) == "0000\n"  # the replicas keep the launcher's umask
    created = [state_dir, *state_dir.rglob("*"), tmp_path / "logs", *(tmp_path / "logs").rglob("*")]
    assert len(created) > 15
    loose = [f"{p} {stat.filemode(p.stat().st_mode)}" for p in created if p.stat().st_mode & 0o077]
    assert loose == []


def test_replicas_of_a_job_cancelled_before_they_started_say_so(sched: LocalScheduler) -> None:
    app_id = sched.submit(sh_app("sleep 30", "sleep 30"))
    sched.cancel(app_id)
    desc = wait_done(sched, app_id)
    assert desc.state == AppState.CANCELLED
    for rep in (r for role in desc.roles_statuses for r in role.replicas):
        assert rep.state == AppState.CANCELLED  # never PENDING
        if rep.exit_code is None:
            assert rep.msg == "never started: the job ended CANCELLED before this replica ran"
    # A job the supervisor never ran (it was gone before it could start any replica).
    job_dir = sched.job_dir(app_id)
    state = json.loads((job_dir / store.STATE).read_text())
    state.update(state="RUNNING", replicas={})
    (job_dir / store.STATE).write_text(json.dumps(state))
    desc = create_cwd_scheduler("test").describe(app_id)
    assert desc is not None and desc.state == AppState.CANCELLED
    reps = [r for role in desc.roles_statuses for r in role.replicas]
    assert [r.state for r in reps] == [AppState.CANCELLED] * 2
    assert all(r.msg.startswith("never started") for r in reps)


def test_a_running_job_whose_record_is_refused_is_listed_until_it_stops(
    sched: LocalScheduler, mark: str, tmp_path: Path
) -> None:
    """A job whose ``state.json`` (or whole directory) was swapped for a symbolic link is
    still a job: while its supervisor runs, ``list`` and ``list_live`` carry it as ``UNKNOWN``
    with the refusal, with the labels its request record still gives (none through a swapped
    directory: it then shows under every local backend); once a cancel stopped it, nothing
    of it is listed as live. The state file's own supervisor records the end over the link."""
    labels = {"airflow.dag_id": "d", "airflow.task_id": "t", "airflow.run_id": "r", "airflow.map_index": "-1"}
    by_state, by_dir = refused_pair(sched, tmp_path, labels)
    state_file = sched.job_dir(by_state) / store.STATE
    fresh = create_cwd_scheduler("test")  # nothing cached

    listed = {a.app_id: a for a in fresh.list()}
    assert set(listed) == {by_state, by_dir}, listed
    assert listed[by_state].state == AppState.UNKNOWN and listed[by_state].labels == labels
    assert f"{state_file} is corrupt (refused: it is a symbolic link" in str(listed[by_state].refused)
    assert listed[by_dir].state == AppState.UNKNOWN and listed[by_dir].labels == {}
    assert "a directory on its way below" in str(listed[by_dir].refused)
    assert [a.app_id for a in fresh.list(labels=labels)] == [by_state]
    assert {a.app_id for a in fresh.list_live()} == {by_state, by_dir}
    dir_scheduler = create_scheduler("test", backend="local_dir")
    assert [a.app_id for a in dir_scheduler.list_live()] == [by_dir]

    for app_id in (by_state, by_dir):
        with pytest.raises(store.CancelDeliveredError):
            fresh.cancel(app_id)
    assert wait_gone(mark, 30) == [], "the jobs' processes outlived the cancel"
    assert fresh.list_live() == []
    ended = fresh.describe(by_state)  # its supervisor wrote the end over the link
    assert ended is not None and ended.state == AppState.CANCELLED, ended
    for app_id in (by_state, by_dir):
        fresh.delete(app_id)


def test_a_cancel_that_reaches_a_refused_job_is_recorded_with_the_refusal_never_through_a_link(
    sched: LocalScheduler, mark: str, tmp_path: Path
) -> None:
    """The cancel delivered to a job whose ``state.json`` is refused is recorded with who asked
    and the refusal: once its supervisor wrote the end over the link, the description says it
    was stopped while refused (``stopped_while_refused``). For a job whose directory is a link,
    nothing is written where the link points."""
    by_state, by_dir = refused_pair(sched, tmp_path)
    for app_id in (by_state, by_dir):
        with pytest.raises(store.CancelDeliveredError):
            sched.cancel(app_id, reason="the task", by=CancelledBy.TASK)
    assert wait_gone(mark, 30) == [], "the jobs' processes outlived the cancel"
    ended = create_cwd_scheduler("test").describe(by_state)  # nothing cached
    assert ended is not None and ended.state == AppState.CANCELLED, ended
    assert ended.cancelled_by == CancelledBy.TASK and ended.cancel_reason == "the task", ended
    assert f"{sched.job_dir(by_state) / store.STATE} is corrupt (refused" in str(ended.stopped_while_refused)
    assert not (tmp_path / "moved" / store.CANCEL).exists(), "a cancel record was written through the link"
    for app_id in (by_state, by_dir):
        sched.delete(app_id)


def test_stop_refused_returns_once_nothing_of_the_job_runs(mark: str, tmp_path: Path) -> None:
    """``Runner.stop_refused`` on a running job whose directory was swapped for a link: it
    returns True only once the job's supervisor and replicas are gone (its own supervisor's
    stop, after the grace period for a replica that ignores SIGTERM), and at once, True, for
    one with nothing left running."""
    from airflow_provider_torchx.core.runner import get_runner

    with get_runner(cancel_grace_period=2.0) as runner:
        handle = runner.run(sh_app("trap '' TERM; while :; do sleep 0.1; done"), "local_cwd")
        sched: Any = runner._scheduler("local_cwd")
        app_id = handle.rsplit("/", 1)[1]
        wait_running(sched, app_id)
        swap_dir_for_symlink(sched.job_dir(app_id), tmp_path / "moved")
        assert runner.stop_refused(handle, reason="test") is True
        assert marked_processes(mark) == [], "stop_refused returned while the job ran"
        assert runner.stop_refused(handle, reason="test") is True
        runner.delete(handle)
