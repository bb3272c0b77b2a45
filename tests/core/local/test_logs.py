"""Replica logs: streams, whole lines, regex, tailing, and the resumable cursor."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from airflow_provider_torchx.core.errors import UnknownAppError
from airflow_provider_torchx.core.schedulers.api import Stream
from airflow_provider_torchx.core.schedulers.local import LocalScheduler, LogIterator
from airflow_provider_torchx.core.schedulers.local.logs import finished_lines, read_lines
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
    assert read_lines(str(f), 0, final=False) == (["a\n", "b\ufffd\n"], 5, False)
    assert read_lines(str(f), 5, final=True) == (["c\n"], 6, False)
    assert read_lines(str(f), 0, final=True, max_lines=1) == (["a\n"], 2, True)
    assert read_lines(str(f), 0, final=False, max_bytes=3) == (["a\n"], 2, True)
    assert read_lines(str(tmp_path / "missing"), 0, final=True) == ([], 0, False)
    f.write_bytes(b"abcdef\nx")  # a line longer than a read is not cut
    assert read_lines(str(f), 0, final=False, max_bytes=2) == (["abcdef\n"], 7, False)
    f.write_bytes("progress\r50%\r100%\nsep\u2028x\n".encode())  # only "\n" ends a line
    assert read_lines(str(f), 0, final=False)[0] == ["progress\r50%\r100%\n", "sep\u2028x\n"]


def test_a_finished_log_reads_the_same_through_the_text_layer(tmp_path: Path) -> None:
    f = tmp_path / "log"
    f.write_bytes(b"progress\r50%\r\n" + "sep\u2028x\x85y\n".encode() + b"bad \xff\n\n")  # \xff: not UTF-8
    lines = finished_lines(str(f))
    assert lines is not None
    assert (
        list(lines)
        == read_lines(str(f), 0, final=True)[0]
        == [
            "progress\r50%\r\n",
            "sep\u2028x\x85y\n",
            "bad \ufffd\n",
            "\n",
        ]
    )
    f.write_bytes(b"a\nno newline")  # the chunked reader adds the last newline
    assert finished_lines(str(f)) is None
    assert finished_lines(str(tmp_path / "missing")) is None


def test_log_iterator_on_a_file(sched: LocalScheduler) -> None:
    app_id = sched.submit(sh_app("echo one; echo two"))
    wait_done(sched, app_id)
    path = sched.describe_native(app_id).request.role_params["r0"][0].stdout  # type: ignore[union-attr]
    assert path is not None
    assert list(LogIterator(app_id, path, sched, should_tail=True)) == ["one\n", "two\n"]
