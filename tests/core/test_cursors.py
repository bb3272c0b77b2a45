"""Cursor files (``core/cursors.py``): where they live, atomic owner-only saves, sequence rules
and what a reader ignores."""

from __future__ import annotations

import json
import os
import stat
import threading
import time
from pathlib import Path

import pytest

from airflow_provider_torchx.core.cursors import CURSOR_DIR, CursorFile, LogPosition, identity_key, newest
from airflow_provider_torchx.core.identity import TaskIdentity

HANDLE = "local_cwd://torchx/job-0123456789ab"
IDENTITY = TaskIdentity("d", "t", "r")


def test_identity_key_is_stable_short_and_distinct() -> None:
    """The key is the hash of the task instance's identity labels, so a file saved by any
    watcher of the same task instance is found again (the value is what files on disk carry)."""
    assert identity_key(IDENTITY) == identity_key(TaskIdentity("d", "t", "r", -1)) == "f8f9b21d90811cdff375"
    assert identity_key(IDENTITY) != identity_key(IDENTITY._replace(map_index=0))


def test_located_beside_the_job_or_under_the_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = identity_key(IDENTITY)
    beside = CursorFile.locate(HANDLE, IDENTITY, tmp_path / "job")
    assert beside.path == tmp_path / "job" / f"airflow-cursor.{key}.json"
    explicit = CursorFile.locate("aws_batch://torchx/q:abc-1", IDENTITY, None, tmp_path)
    assert explicit.path == tmp_path / CURSOR_DIR / "aws_batch" / f"q:abc-1.{key}.json"
    monkeypatch.setenv("AIRFLOW_TORCHX_STATE_DIR", str(tmp_path / "state"))
    assert CursorFile.locate(HANDLE, IDENTITY, None).path.parent == tmp_path / "state" / CURSOR_DIR / "local_cwd"
    other_job = CursorFile.locate("local_cwd://torchx/job-2", IDENTITY, None)
    other_ti = CursorFile.locate(HANDLE, IDENTITY._replace(task_id="u"), None)
    assert len({CursorFile.locate(HANDLE, IDENTITY, None).path, other_job.path, other_ti.path}) == 3


def test_the_state_dirs_files_name_the_jobs_of_a_task_instance_and_backend(tmp_path: Path) -> None:
    """``handles_in_state_dir``: the jobs of one backend whose files under the state dir are
    this task instance's; another task instance's, another backend's, a file whose name and
    job disagree and an unreadable file are skipped."""
    for handle, identity in [
        (HANDLE, IDENTITY),
        ("local_cwd://torchx/job-2", IDENTITY),
        ("local_cwd://torchx/job-3", IDENTITY._replace(task_id="u")),
        ("aws_batch://torchx/q:abc-1", IDENTITY),
    ]:
        assert CursorFile.locate(handle, identity, None, tmp_path).save(LogPosition())
    base = tmp_path / CURSOR_DIR / "local_cwd"
    key = identity_key(IDENTITY)
    (base / f"job-4.{key}.json").write_text((base / f"job-2.{key}.json").read_text())  # names job-2
    (base / f"job-5.{key}.json").write_text("garbage{")
    found = CursorFile.handles_in_state_dir(IDENTITY, "local_cwd", tmp_path)
    assert found == [HANDLE, "local_cwd://torchx/job-2"]
    assert CursorFile.handles_in_state_dir(IDENTITY, "slurm", tmp_path) == []


def test_save_and_load_round_trip_owner_only_without_temp_files(tmp_path: Path) -> None:
    cursor_file = CursorFile.locate(HANDLE, IDENTITY, None, tmp_path)
    assert cursor_file.load() is None
    position = LogPosition(seq=2, cursors={"w/0": '{"offset": 12}', "w/1": '{"offset": 0}'})
    cursor_file.save(position)
    assert cursor_file.load() == position
    assert stat.S_IMODE(cursor_file.path.stat().st_mode) == 0o600
    for directory in (cursor_file.path.parent, cursor_file.path.parent.parent):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert [p.name for p in cursor_file.path.parent.iterdir()] == [cursor_file.path.name]
    record = json.loads(cursor_file.path.read_text())
    assert record["identity"] == IDENTITY.labels() and record["app_handle"] == HANDLE and record["seq"] == 2


def test_advancing_numbers_each_save_and_keeps_the_report_mark() -> None:
    position = LogPosition(seq=4, cursors={"w/0": "a"}, reported=True).advanced({"w/0": "b"})
    assert position == LogPosition(seq=5, cursors={"w/0": "b"}, reported=True)


def test_newest_takes_the_highest_sequence_number() -> None:
    a, b, c = LogPosition(seq=1), LogPosition(seq=3, cursors={"x": "1"}), LogPosition(seq=3, cursors={"y": "2"})
    assert newest(a, b) is b and newest(b, a) is b
    assert newest(b, c) is b and newest(c, b) is c  # the first of equals
    assert newest(None, a) is a and newest() == LogPosition() and newest(None) == LogPosition()


def test_mark_reported_goes_on_from_the_newest_position(tmp_path: Path) -> None:
    cursor_file = CursorFile.locate(HANDLE, IDENTITY, None, tmp_path)
    cursor_file.save(LogPosition(seq=2, cursors={"w/0": "old"}))
    saved = cursor_file.mark_reported(LogPosition(seq=5, cursors={"w/0": "new"}))
    assert saved == LogPosition(seq=6, cursors={"w/0": "new"}, reported=True) == cursor_file.load()
    assert cursor_file.mark_reported(LogPosition(seq=1)) == LogPosition(seq=7, cursors={"w/0": "new"}, reported=True)


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b"[]",
        b'{"app_handle": "local_cwd://torchx/job-0123456789ab", "seq": "x", "cursors": {}}',
        b'{"app_handle": "local_cwd://torchx/job-0123456789ab", "seq": 1, "cursors": []}',
        b'{"app_handle": "local_cwd://torchx/other", "seq": 9, "cursors": {}}',
    ],
)
def test_a_reader_ignores_unreadable_or_foreign_files(
    tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    cursor_file = CursorFile.locate(HANDLE, IDENTITY, tmp_path)
    cursor_file.path.write_bytes(content)
    assert cursor_file.load() is None
    assert "ignoring" in caplog.text and str(cursor_file.path) in caplog.text


def test_a_swapped_cursor_file_is_never_read(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A cursor file replaced by a symbolic link (to a valid position of another file) or by a
    FIFO: ``load`` ignores it at once, naming it; the link's target is not read, and no reader
    waits on the FIFO."""
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps({"app_handle": HANDLE, "seq": 7, "cursors": {"r/0": "SECRET"}}))
    cursor_file = CursorFile.locate(HANDLE, IDENTITY, tmp_path)
    cursor_file.path.symlink_to(outside)
    assert cursor_file.load() is None
    cursor_file.path.unlink()
    os.mkfifo(cursor_file.path)
    start = time.monotonic()
    assert cursor_file.load() is None
    assert time.monotonic() - start < 5
    assert caplog.text.count(f"ignoring unreadable cursor file {cursor_file.path}") == 2
    assert "SECRET" not in caplog.text


def test_concurrent_saves_leave_one_whole_position(tmp_path: Path) -> None:
    cursor_file = CursorFile.locate(HANDLE, IDENTITY, None, tmp_path)
    errors: list[BaseException] = []

    def save_many(start: int) -> None:
        try:
            for seq in range(start, start + 50):
                cursor_file.save(LogPosition(seq=seq, cursors={"w/0": str(seq)}))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=save_many, args=(i * 100,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    last = cursor_file.load()
    assert last is not None and last.cursors == {"w/0": str(last.seq)}
    assert [p.name for p in cursor_file.path.parent.iterdir()] == [cursor_file.path.name]


def test_a_sidecar_dir_is_never_created_and_a_failed_save_only_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cursor_file = CursorFile.locate(HANDLE, IDENTITY, tmp_path / "deleted-job")
    assert cursor_file.save(LogPosition(seq=1)) is False
    assert not (tmp_path / "deleted-job").exists()
    assert "could not save log position #1" in caplog.text
    assert cursor_file.mark_reported() == LogPosition(seq=1, reported=True)
