"""The local job store: its listing of app ids (``store.JobStore.app_ids``) and its reads of
job files while their writer replaces them (``store.read_json``)."""

from __future__ import annotations

import ast
import marshal
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_torchx.core.schedulers.local import store


def test_app_ids_are_the_valid_names_only(tmp_path: Path) -> None:
    jobs = store.JobStore(tmp_path)
    jobs.ensure()
    for name in ("job-1", "a_b.c", "a..b", ".hidden", "x y", "-dash", "ok\n"):
        (Path(jobs.root) / name).mkdir()
    (Path(jobs.root) / store.FINISHED_INDEX).write_text("{}")
    assert jobs.app_ids() == {"job-1", "a_b.c"}


def test_app_ids_see_a_new_job_whether_or_not_the_listing_is_reused(tmp_path: Path) -> None:
    jobs = store.JobStore(tmp_path)
    jobs.create("first")
    assert jobs.app_ids() == {"first"}  # the directory changed just now: not reused
    jobs.create("second")
    assert jobs.app_ids() == {"first", "second"}
    os.utime(jobs.root, ns=(10**18, 10**18))  # long unchanged: the listing is kept
    assert jobs.app_ids() == {"first", "second"}
    assert jobs.app_ids() is jobs.app_ids()
    jobs.create("third")  # the mtime moves on: listed again
    assert jobs.app_ids() == {"first", "second", "third"}


def test_a_file_replaced_right_after_its_open_is_read_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer's atomic replace lands between the reader's open and its identity check
    (the kernel then names the open file "<path> (deleted)"): the old version is read, not
    refused as a swapped file."""
    path = tmp_path / "state.json"
    store.write_json_atomic(path, {"version": 1})
    real_fstat = os.fstat

    def fstat_after_a_replace(fd: int) -> os.stat_result:
        monkeypatch.setattr(os, "fstat", real_fstat)
        store.write_json_atomic(path, {"version": 2})
        return real_fstat(fd)

    monkeypatch.setattr(os, "fstat", fstat_after_a_replace)
    assert store.read_json(path, tmp_path) == {"version": 1}
    assert store.read_json(path, tmp_path) == {"version": 2}


def test_reads_beside_a_writer_replacing_the_file_never_fail(tmp_path: Path) -> None:
    """A supervisor rewrites ``state.json`` while a CLI reads it: every read is one whole
    version, none is refused."""
    path = tmp_path / "state.json"
    store.write_json_atomic(path, {"n": 0})
    stop = threading.Event()

    def writer() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            store.write_json_atomic(path, {"n": n})

    thread = threading.Thread(target=writer)
    thread.start()
    seen: list[Any] = []
    try:
        for _ in range(3000):
            seen.append(store.read_json(path, tmp_path)["n"])
    finally:
        stop.set()
        thread.join()
    assert all(isinstance(n, int) for n in seen)


def test_the_index_is_parsed_once_per_change_for_every_store_of_a_directory(tmp_path: Path) -> None:
    """Two stores of one directory (a ``local_cwd`` and a ``local_dir`` scheduler) share the
    parsed index; what a store writes is not parsed again; a change by another writer is."""
    cwd_jobs, dir_jobs = store.JobStore(tmp_path), store.JobStore(tmp_path)
    cwd_jobs.create("a")
    entry = {"backend": "local_cwd", "name": "n", "labels": {}, "created": 1.0, "state": "SUCCEEDED", "ended": 2.0}
    cwd_jobs.record_finished({"a": entry}, {"a"})
    assert cwd_jobs.finished() == {"a": entry}
    assert cwd_jobs.finished()["a"] is entry  # the written dict itself: not parsed back
    assert dir_jobs.finished() is cwd_jobs.finished()
    index = Path(cwd_jobs.root) / store.FINISHED_INDEX
    store.write_json_atomic(index, {"a": entry, "b": entry})  # another process's write
    assert set(dir_jobs.finished()) == {"a", "b"}
    assert cwd_jobs.finished() is dir_jobs.finished()


def _read_request_in_a_process(job_dir: Path, stdin: bytes) -> Any:
    """``supervisor.read_request(job_dir)`` in a fresh interpreter whose stdin holds ``stdin``,
    as the supervisor reads it."""
    code = (
        "import sys; from airflow_provider_torchx.core.schedulers.local.supervisor import read_request; "
        "print(repr(read_request(sys.argv[1])))"
    )
    out = subprocess.run([sys.executable, "-c", code, str(job_dir)], input=stdin, capture_output=True, check=True)
    return ast.literal_eval(out.stdout.decode().strip())


def test_the_supervisor_reads_the_request_handed_on_its_stdin_else_the_job_file(tmp_path: Path) -> None:
    """The launcher hands the request on stdin (``marshal``); when it died before that (stdin
    empty or cut short) the supervisor reads ``request.json``; None handed: nothing to run."""
    job_dir = tmp_path / "app-1"
    job_dir.mkdir()
    store.write_json_atomic(job_dir / store.REQUEST, {"from": "file"})
    handed = marshal.dumps({"from": "stdin"})
    assert _read_request_in_a_process(job_dir, handed) == {"from": "stdin"}
    assert _read_request_in_a_process(job_dir, b"") == {"from": "file"}
    assert _read_request_in_a_process(job_dir, handed[:3]) == {"from": "file"}
    assert _read_request_in_a_process(job_dir, marshal.dumps(None)) is None
    (job_dir / store.REQUEST).unlink()
    assert _read_request_in_a_process(job_dir, b"") is None
