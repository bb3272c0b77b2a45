"""Replica logs: streams, whole lines, regex, tailing, and the resumable cursor."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from airflow_provider_torchx.core.errors import UnknownAppError
from airflow_provider_torchx.core.safefiles import UnsafeFileError
from airflow_provider_torchx.core.schedulers.api import Stream
from airflow_provider_torchx.core.schedulers.local import LocalScheduler, LogIterator
from airflow_provider_torchx.core.schedulers.local.logs import (
    TAIL_BYTES,
    finished_lines,
    rank_log,
    read_lines,
    tail_lines,
)
from airflow_provider_torchx.core.specs import AppState
from tests.core.local.helpers import sh_app, wait_done, wait_for_line

SCRIPT = "echo out1; echo err1 >&2; echo out2; printf 'no newline'"


def test_streams_and_the_unterminated_last_line(sched: LocalScheduler) -> None:
    app_id = sched.submit(sh_app(SCRIPT))
    wait_done(sched, app_id)
    assert list(sched.log_iter(app_id, "r0", streams=Stream.STDOUT)) == ["out1\n", "out2\n", "no newline\n"]
    assert list(sched.log_iter(app_id, "r0", streams=Stream.STDERR)) == ["err1\n"]
    combined = list(sched.log_iter(app_id, "r0"))  # default: combined
    assert sorted(combined) == sorted(["out1\n", "err1\n", "out2\n", "no newline\n"])
    assert combined.index("out1\n") < combined.index("out2\n")
    assert list(sched.log_iter(app_id, "r0", regex=r"^out")) == ["out1\n", "out2\n"]


def test_since_until_are_ignored_with_a_warning(sched: LocalScheduler) -> None:
    from datetime import datetime

    app_id = sched.submit(sh_app("echo a"))
    wait_done(sched, app_id)
    with pytest.warns(UserWarning, match="since/until"):
        assert list(sched.log_iter(app_id, "r0", since=datetime.now())) == ["a\n"]


def test_tail_follows_until_the_end_with_whole_lines_only(sched: LocalScheduler) -> None:
    script = "printf 'par'; sleep 0.3; printf 'tial\\n'; for i in 1 2 3; do echo l$i; sleep 0.1; done"
    app_id = sched.submit(sh_app(script))
    lines = list(sched.log_iter(app_id, "r0", should_tail=True))
    assert lines == ["partial\n", "l1\n", "l2\n", "l3\n"]
    assert sched.describe(app_id).state == AppState.SUCCEEDED  # type: ignore[union-attr]


def test_not_tailing_returns_what_is_there_now(sched: LocalScheduler) -> None:
    app_id = sched.submit(sh_app("echo first; sleep 300"))
    wait_for_line(sched, app_id, "r0", "first")
    assert list(sched.log_iter(app_id, "r0")) == ["first\n"]
    chunk = sched.read_log(app_id, "r0")
    assert chunk.lines == ["first\n"] and not chunk.eof
    sched.cancel(app_id)
    wait_done(sched, app_id)


def test_cursor_resumes_without_loss_or_repeat(sched: LocalScheduler) -> None:
    script = "i=0; while [ $i -lt 200 ]; do echo line-$i; i=$((i+1)); [ $((i % 50)) = 0 ] && sleep 0.05; done"
    app_id = sched.submit(sh_app(script))
    seen: list[str] = []
    cursor = None
    while True:
        chunk = sched.read_log(app_id, "r0", cursor=cursor, max_lines=7)
        assert len(chunk.lines) <= 7
        seen += chunk.lines
        json.loads(chunk.cursor)  # JSON-serialisable
        # a "restarted reader": a fresh scheduler instance from the saved cursor
        cursor = chunk.cursor
        if chunk.eof:
            break
        if not chunk.lines:
            time.sleep(0.01)
    assert seen == [f"line-{i}\n" for i in range(200)]
    again = sched.read_log(app_id, "r0", cursor=cursor)
    assert again.lines == [] and again.eof


def test_tailers_from_another_thread_see_every_line(sched: LocalScheduler) -> None:
    app_id = sched.submit(sh_app("for i in $(seq 1 30); do echo $i; sleep 0.01; done"))
    got: list[str] = []
    t = threading.Thread(target=lambda: got.extend(sched.log_iter(app_id, "r0", should_tail=True)))
    t.start()
    t.join(30)
    assert got == [f"{i}\n" for i in range(1, 31)]


def test_unknown_app_role_replica_stream_and_cursor(sched: LocalScheduler) -> None:
    app_id = sched.submit(sh_app("echo x", num_replicas=2))
    wait_done(sched, app_id)
    with pytest.raises(UnknownAppError, match="nope-1"):
        sched.read_log("nope-1", "r0")
    with pytest.raises(UnknownAppError):
        list(sched.log_iter("../../etc", "r0"))
    with pytest.raises(ValueError, match="'trainer'"):
        sched.log_iter(app_id, "trainer")
    with pytest.raises(ValueError, match=r"0\.\.1; got 2"):
        sched.read_log(app_id, "r0", k=2)
    with pytest.raises(ValueError, match="streams"):
        sched.read_log(app_id, "r0", streams="both")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cursor"):
        sched.read_log(app_id, "r0", cursor="garbage")
    stdout_cursor = sched.read_log(app_id, "r0", streams=Stream.STDOUT).cursor
    with pytest.raises(ValueError, match="cursor"):
        sched.read_log(app_id, "r0", cursor=stdout_cursor, streams=Stream.STDERR)


def test_read_lines_edge_cases(tmp_path: Path) -> None:
    f = tmp_path / "log"
    f.write_bytes(b"a\nb\xff\nc")
    assert read_lines(str(f), 0, final=False, root=str(tmp_path)) == (["a\n", "b\ufffd\n"], 5, False)
    assert read_lines(str(f), 5, final=True, root=str(tmp_path)) == (["c\n"], 6, False)
    assert read_lines(str(f), 0, final=True, max_lines=1, root=str(tmp_path)) == (["a\n"], 2, True)
    assert read_lines(str(f), 0, final=False, max_bytes=3, root=str(tmp_path)) == (["a\n"], 2, True)
    assert read_lines(str(tmp_path / "missing"), 0, final=True, root=str(tmp_path)) == ([], 0, False)
    f.write_bytes(b"abcdef\nx")  # a line longer than a read is not cut
    assert read_lines(str(f), 0, final=False, max_bytes=2, root=str(tmp_path)) == (["abcdef\n"], 7, False)
    f.write_bytes("progress\r50%\r100%\nsep\u2028x\n".encode())  # only "\n" ends a line
    assert read_lines(str(f), 0, final=False, root=str(tmp_path))[0] == ["progress\r50%\r100%\n", "sep\u2028x\n"]


def test_a_finished_log_reads_the_same_through_the_text_layer(tmp_path: Path) -> None:
    f = tmp_path / "log"
    f.write_bytes(b"progress\r50%\r\n" + "sep\u2028x\x85y\n".encode() + b"bad \xff\n\n")  # \xff: not UTF-8
    lines = finished_lines(str(f), root=str(tmp_path))
    assert lines is not None
    assert (
        list(lines)
        == read_lines(str(f), 0, final=True, root=str(tmp_path))[0]
        == [
            "progress\r50%\r\n",
            "sep\u2028x\x85y\n",
            "bad \ufffd\n",
            "\n",
        ]
    )
    f.write_bytes(b"a\nno newline")  # the chunked reader adds the last newline
    assert finished_lines(str(f), root=str(tmp_path)) is None
    assert finished_lines(str(tmp_path / "missing"), root=str(tmp_path)) is None


def test_log_iterator_on_a_file(sched: LocalScheduler) -> None:
    app_id = sched.submit(sh_app("echo one; echo two"))
    wait_done(sched, app_id)
    request = sched.describe_native(app_id).request  # type: ignore[union-attr]
    path = request.role_params["r0"][0].stdout
    assert path is not None
    assert list(LogIterator(app_id, path, sched, should_tail=True, root=request.log_dir)) == ["one\n", "two\n"]


def test_a_swapped_log_is_refused_never_read(sched: LocalScheduler, tmp_path: Path) -> None:
    """A replica that replaces its log with a symbolic link (or its directory with one, or the
    log with a FIFO) gets a clear error from every reader; the target is never read."""
    import os

    from airflow_provider_torchx.core.safefiles import UnsafeFileError

    secret = tmp_path / "shadow"
    secret.write_text("root:SECRET-HASH:19000\n")
    outside = tmp_path / "elsewhere"
    (outside / "0").mkdir(parents=True)
    (outside / "0" / "combined.log").write_text("root:SECRET-HASH:19000\n")
    script = "echo hello; sleep 300"
    app_id = sched.submit(sh_app(script, num_replicas=3))
    deadline = time.monotonic() + 30
    while not all(sched.read_log(app_id, "r0", k).lines for k in range(3)):
        assert time.monotonic() < deadline, "the replicas never printed"
        time.sleep(0.05)
    request = sched.describe_native(app_id).request  # type: ignore[union-attr]
    logs = [request.role_params["r0"][k].combined for k in range(3)]
    assert all(p is not None for p in logs)
    os.unlink(logs[0])
    os.symlink(secret, logs[0])  # the log itself
    replica_dir = os.path.dirname(logs[1])  # the replica's directory
    os.rename(replica_dir, replica_dir + ".old")
    os.symlink(outside / "0", replica_dir)
    os.unlink(logs[2])
    os.mkfifo(logs[2])  # would block a plain open()
    expected = ["symbolic link", "a directory on its way below .* is a symbolic link", "not a regular file"]
    for k, why in enumerate(expected):
        with pytest.raises(UnsafeFileError, match=why) as err:
            sched.read_log(app_id, "r0", k)
        assert "SECRET" not in str(err.value) and logs[k] in str(err.value)
        with pytest.raises(UnsafeFileError, match=why):
            list(sched.log_iter(app_id, "r0", k))
    sched.cancel(app_id)
    wait_done(sched, app_id)
    with pytest.raises(UnsafeFileError, match="symbolic link"):  # a finished log: the fast path
        list(sched.log_iter(app_id, "r0", 0))


@pytest.mark.parametrize(
    "cursor",
    [
        *('{"stream": "combined", "offset": ' + n + "}" for n in ("1e400", "1.5", "true", str(1 << 70), "-1")),
        "[" * 3000 + "]" * 3000,  # deeper than the JSON parser goes
        '{"stream": "combined", "offset": ' + "[" * 3000 + "]" * 3000 + "}",
    ],
)
def test_a_malformed_cursor_is_a_value_error(sched: LocalScheduler, cursor: str) -> None:
    app_id = sched.submit(sh_app("echo a"))
    wait_done(sched, app_id)
    with pytest.raises(ValueError, match=r"cursor: .* is not a cursor read_log returned") as err:
        sched.read_log(app_id, "r0", cursor=cursor)
    assert len(str(err.value)) < 300, "a long cursor is shortened"


def test_a_rewritten_record_cannot_point_a_log_elsewhere(sched: LocalScheduler, tmp_path: Path) -> None:
    """A job rewrites its ``request.json`` (a regular file, replaced in place) to name another
    file as its log and another log directory: readers still read the replica's own log, found
    from the store's layout; a role name that would leave the log directory is refused."""
    import json

    from airflow_provider_torchx.core.schedulers.local import create_cwd_scheduler, store

    secret = tmp_path / "secret"
    secret.write_text("SECRET-LINE\n")
    secret.chmod(0o600)
    app_id = sched.submit(sh_app("echo own line"))
    wait_done(sched, app_id)
    record_file = sched.job_dir(app_id) / store.REQUEST
    rec = json.loads(record_file.read_text())
    for param in rec["role_params"]["r0"]:
        param.update(stdout=str(secret), stderr=str(secret), combined=str(secret))
    rec["log_dir"] = str(tmp_path)
    rec["role_params"]["../.."] = rec["role_params"]["r0"]
    record_file.write_text(json.dumps(rec))
    fresh = create_cwd_scheduler("test")  # nothing cached
    assert fresh.read_log(app_id, "r0").lines == ["own line\n"]
    assert list(fresh.log_iter(app_id, "r0")) == ["own line\n"]
    with pytest.raises(ValueError, match=r"role_name: '\.\./\.\.' cannot name a log directory"):
        fresh.read_log(app_id, "../..")


def _rank_file(base: Path, run: str, attempt: str, rank: int, text: str, mtime: float) -> Path:
    path = base / run / attempt / str(rank) / "stderr.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, (mtime, mtime))
    return path


def test_rank_log_is_the_newest_file_of_the_rank_in_torchruns_layout(tmp_path: Path) -> None:
    base = tmp_path / "ranks"
    assert rank_log(str(base), 1) is None  # torchrun wrote nothing there
    _rank_file(base, "job_a1", "attempt_0", 1, "first run\n", 100)
    newest = _rank_file(base, "job_b2", "attempt_1", 1, "restarted\n", 300)
    _rank_file(base, "job_b2", "attempt_0", 1, "before the restart\n", 200)
    _rank_file(base, "job_b2", "attempt_1", 0, "rank 0\n", 400)  # another local rank
    _rank_file(base, "job_b2", "not_an_attempt", 1, "stray\n", 500)
    assert rank_log(str(base), 1) == str(newest)
    # A directory the job swapped for a symbolic link is not walked.
    elsewhere = tmp_path / "elsewhere"
    _rank_file(elsewhere, "run", "attempt_0", 1, "outside\n", 600)
    (base / "job_c3").symlink_to(elsewhere / "run")
    assert rank_log(str(base), 1) == str(newest)


def test_tail_lines_reads_the_end_inside_the_root(tmp_path: Path) -> None:
    path = tmp_path / "stderr.log"
    path.write_text("".join(f"line {i}\n" for i in range(5)) + "unterminated")
    assert tail_lines(str(path), 2, root=str(tmp_path)) == ["line 4", "unterminated"]
    assert tail_lines(str(tmp_path / "missing.log"), 2, root=str(tmp_path)) == []
    big = tmp_path / "big.log"
    big.write_text("x" * (TAIL_BYTES + 10) + "\nlast\n")
    assert tail_lines(str(big), 5, root=str(tmp_path)) == ["last"]  # the line cut at the window is dropped
    (tmp_path / "link.log").symlink_to(path)
    with pytest.raises(UnsafeFileError, match="symbolic link"):
        tail_lines(str(tmp_path / "link.log"), 2, root=str(tmp_path))
