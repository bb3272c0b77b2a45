"""Root causes from torchrun's error files and summaries (``core/errorfile.py``), parsed from
the formats TorchElastic writes and found for a real local job run by a torchrun stand-in;
and for a real torchrun whose rank exits 4, the report's one exit code is the rank's."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_torchx.core.components.dist import spmd
from airflow_provider_torchx.core.errorfile import (
    ERROR_FILE_ENV,
    RootCause,
    failed_replica_note,
    find_root_cause,
    last_frames,
    node_stderr,
    parse_error_file,
    parse_torchrun_summary,
    root_cause_of,
    with_node_stderr,
    with_rank_stderr,
)
from airflow_provider_torchx.core.runner import Runner, get_runner
from airflow_provider_torchx.core.specs import AppDef, AppState, ReplicaStatus, Role
from tests.fixtures import aborted_node
from tests.fixtures.torch import torch_job_env

STANDIN = str(Path(__file__).resolve().parents[1] / "fixtures" / "standin_torchrun.py")
CALLSTACK = (
    "Traceback (most recent call last):\n"
    '  File "/app/train.py", line 40, in <module>\n'
    "    main()\n"
    '  File "/venv/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 355, in wrapper\n'
    "    return f(*args, **kwargs)\n"
    "           ^^^^^^^^^^^^^^^^^^\n"
    '  File "/app/train.py", line 30, in main\n'
    "    step(model)\n"
    '  File "/app/train.py", line 12, in step\n'
    '    raise RuntimeError("boom on rank 3")\n'
    "RuntimeError: boom on rank 3\n"
)


def test_parse_error_file_of_a_recorded_exception() -> None:
    text = json.dumps(
        {
            "message": {
                "message": "RuntimeError: boom on rank 3",
                "extraInfo": {"py_callstack": CALLSTACK, "timestamp": "1700000000"},
                "errorCode": 1,
            }
        }
    )
    cause = parse_error_file(text, "trainer/1")
    assert cause is not None
    assert (cause.error, cause.replica, cause.exit_code, cause.timestamp) == (
        "RuntimeError: boom on rank 3",
        "trainer/1",
        1,
        1700000000,
    )
    assert cause.frames == (
        'File "/venv/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 355, in wrapper',
        "  return f(*args, **kwargs)",
        'File "/app/train.py", line 30, in main',
        "  step(model)",
        'File "/app/train.py", line 12, in step',
        '  raise RuntimeError("boom on rank 3")',
    )
    assert cause.format().startswith("Root cause (replica trainer/1, exit code 1): RuntimeError: boom on rank 3\n")


def test_parse_error_file_of_the_string_form_and_of_garbage() -> None:
    cause = parse_error_file(json.dumps({"message": "Signal 9 (SIGKILL) received", "timestamp": 5}), "w/0")
    assert cause is not None and (cause.error, cause.timestamp, cause.frames) == ("Signal 9 (SIGKILL) received", 5, ())
    for garbage in ("", "not json", "[1]", json.dumps({"message": {"extraInfo": {}}}), json.dumps({"x": 1})):
        assert parse_error_file(garbage, "w/0") is None


def test_last_frames_of_a_chained_traceback_are_the_innermost() -> None:
    chained = (
        CALLSTACK
        + "\nDuring handling of the above exception, another exception occurred:\n\n"
        + ('Traceback (most recent call last):\n  File "/app/x.py", line 1, in f\n    g()\nValueError: v\n')
    )
    assert last_frames(chained) == ('File "/app/x.py", line 1, in f', "  g()")


def _summary(traceback: str) -> list[str]:
    return [
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "============================================================",
        "train.py FAILED",
        "------------------------------------------------------------",
        "Failures:",
        "  <NO_OTHER_FAILURES>",
        "------------------------------------------------------------",
        "Root Cause (first observed failure):",
        "[0]:",
        "  time      : 2024-01-01_00:00:00",
        "  host      : node-1",
        "  rank      : 3 (local_rank: 1)",
        "  exitcode  : 1 (pid: 4242)",
        "  error_file: /tmp/torchelastic_x/attempt_0/1/error.json",
        f"  traceback : {traceback}",
        "============================================================",
    ]


def test_parse_torchrun_summary_with_a_traceback() -> None:
    lines = ["[default1]:step 1", *_summary(CALLSTACK.rstrip("\n").replace("\n", "\n  "))]
    lines = [piece for line in lines for piece in line.split("\n")]
    cause = parse_torchrun_summary(lines, "trainer/1")
    assert cause is not None
    assert (cause.error, cause.rank, cause.exit_code) == ("RuntimeError: boom on rank 3", 3, 1)
    assert cause.frames[-1] == '  raise RuntimeError("boom on rank 3")'
    assert cause.format().startswith("Root cause (rank 3, replica trainer/1, exit code 1): RuntimeError: boom")


def test_parse_torchrun_summary_without_a_recorded_traceback_says_how_to_get_one() -> None:
    lines = _summary("To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html")
    cause = parse_torchrun_summary(lines, "trainer/0")
    assert cause is not None and cause.rank == 3 and cause.frames == ()
    assert "errors.record" in cause.error
    assert parse_torchrun_summary(["just a failing script", "Traceback ..."], "trainer/0") is None


@pytest.fixture
def runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Runner]:
    monkeypatch.setenv("AIRFLOW_TORCHX_STATE_DIR", str(tmp_path / "state"))
    with get_runner() as r:
        yield r


def test_local_replicas_get_an_error_file_beside_their_logs(runner: Runner) -> None:
    app = AppDef(name="ef", roles=[Role(name="w", image="local", entrypoint="true", num_replicas=2)])
    info = runner.dryrun(app, "local_cwd")
    for k, param in enumerate(info.request.role_params["w"]):
        assert param.env[ERROR_FILE_ENV] == str(Path(info.request.role_log_dirs["w"][k]) / "error.json")
        # torchrun's log directory (its per-rank stderr files): beside them too.
        assert param.env["PET_LOG_DIR"] == str(Path(info.request.role_log_dirs["w"][k]) / "ranks")


def test_root_cause_of_a_real_local_job_whose_rank_1_raises(runner: Runner) -> None:
    """Two workers under the torchrun stand-in; rank 1 raises; the root cause is its exception,
    rank and last frames, from the replica's error file and torchrun's summary."""
    app = AppDef(
        name="ddp", roles=[Role(name="trainer", image="local", entrypoint=sys.executable, args=[STANDIN, "2", "1"])]
    )
    handle = runner.run(app, "local_cwd")
    status = runner.wait(handle, wait_interval=0.2, timeout=60, cancel_on_signal=False)
    assert status is not None and status.state == AppState.FAILED
    cause = find_root_cause(runner, handle, status)
    assert cause is not None, list(runner.log_lines(handle, "trainer", 0))
    assert (cause.error, cause.rank, cause.replica, cause.exit_code) == (
        "RuntimeError: boom on rank 1",
        1,
        "trainer/0",
        1,
    )
    assert cause.frames[-1] == '  raise RuntimeError(f"boom on rank {rank}")'
    assert cause.timestamp is not None  # from the error file, not only the summary


def test_summary_whose_indentation_was_stripped_by_the_log_pipeline() -> None:
    lines = [piece.strip() for line in _summary(CALLSTACK.rstrip("\n")) for piece in line.split("\n")]
    cause = parse_torchrun_summary(lines, "trainer/0")
    assert cause is not None and (cause.error, cause.rank) == ("RuntimeError: boom on rank 3", 3)
    assert cause.frames[-2:] == ('File "/app/train.py", line 12, in step', '  raise RuntimeError("boom on rank 3")')


#: A node's stderr (2 ranks) where local rank 1 aborted at exit, as torchrun 2.13 leaves it.
ABORTED = [
    "W1201 07:56:57.196000 11357 torch/distributed/run.py:874] ",
    "W1201 07:56:57.196000 11357 torch/distributed/run.py:874] *****************************************",
    "W1201 07:56:57.196000 11357 torch/distributed/run.py:874] Setting OMP_NUM_THREADS environment variable ...",
    "W1201 07:56:57.196000 11357 torch/distributed/run.py:874] *****************************************",
    "[W1201 07:57:01.100000 11440 ProcessGroupGloo.cpp:516] a warning of rank 1",
    "terminate called without an active exception",
    "Fatal Python error: Aborted",
    "",
    "Thread 0x00007f85f968bb80 (most recent call first):",
    "",
    "Extension modules: numpy._core._multiarray_umath, torch._C" + ", torch._C._nn" * 40 + " (total: 42)",
    "W1201 07:57:08.542000 11357 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 11437 "
    "closing signal SIGTERM",
    "E1201 07:57:08.659000 11357 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -6) "
    "local_rank: 1 (pid: 11440) of binary: /venv/bin/python",
    "Traceback (most recent call last):",
    '  File "/venv/bin/torchrun", line 8, in <module>',
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
]


def test_node_stderr_is_what_the_ranks_wrote_before_torchruns_report() -> None:
    lines = node_stderr([line + "\n" for line in ABORTED])
    assert lines[:3] == [
        "[W1201 07:57:01.100000 11440 ProcessGroupGloo.cpp:516] a warning of rank 1",
        "terminate called without an active exception",
        "Fatal Python error: Aborted",
    ]
    assert lines[-1].startswith("Extension modules:") and len(lines) == 5
    assert node_stderr(ABORTED[:11]) == []  # no report of torchrun: nothing is guessed


def test_a_signalled_rank_shows_its_nodes_last_stderr_lines() -> None:
    summary = _summary("Signal 6 (SIGABRT) received by PID 11440")
    cause = find_root_cause_of_lines(ABORTED + summary)
    assert cause is not None
    text = cause.format()
    assert text.startswith(
        "Root cause (rank 3, replica trainer/0, exit code 1): Signal 6 (SIGABRT) received by PID 11440\n"
        "  Last lines of its node's stderr:\n"
        "  [W1201 07:57:01.100000 11440 ProcessGroupGloo.cpp:516] a warning of rank 1\n"
        "  terminate called without an active exception\n"
    ), text
    assert "Extension modules" not in text  # faulthandler's list of modules: noise
    assert text.splitlines()[-1] == "  Thread 0x00007f85f968bb80 (most recent call first):", text
    long = find_root_cause_of_lines(["x" * 400, *ABORTED[11:], *summary])
    assert long is not None and long.stderr[0] == "x" * 300 + " ..."  # a long line is cut


def test_an_unrecorded_python_traceback_on_stderr_is_the_root_cause() -> None:
    stderr = [
        "rank 2 loading shard 17",
        *CALLSTACK.replace("RuntimeError: boom on rank 3", "ValueError: shard 17 is corrupt").splitlines(),
        "E1201 07:57:08.659000 900 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) "
        "local_rank: 0 (pid: 901) of binary: /venv/bin/python",
    ]
    cause = find_root_cause_of_lines(
        stderr + _summary("To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html")
    )
    assert cause is not None and cause.error == "ValueError: shard 17 is corrupt"
    assert cause.frames[-2:] == ('File "/app/train.py", line 12, in step', '  raise RuntimeError("boom on rank 3")')
    assert "Last frames of its traceback" in cause.format()


def find_root_cause_of_lines(lines: list[str]) -> RootCause | None:
    """The root cause of a replica whose (combined) log is ``lines``, as for AWS Batch."""
    cause = parse_torchrun_summary(lines, "trainer/0")
    return with_node_stderr(cause, node_stderr(lines)) if cause else None


#: Replica 1 is a node whose rank 3 aborted: torchrun printed its summary (no error file: a
#: signal records none) and lingers, as a node does while it tears down. Replica 0 is the
#: sibling that fails because of it, first to end: its agent records its own error (a lost
#: rendezvous store) in its error file. The supervisor then stops replica 1.
LINGERING = """
import json, os, sys, time
if sys.argv[1] == "1":
    print(sys.argv[3], flush=True)
    open(sys.argv[2], "w").close()
    time.sleep(120)
while not os.path.exists(sys.argv[2]):
    time.sleep(0.05)
message = {"message": "RendezvousConnectionError: The connection to the C10d store has failed.",
           "extraInfo": {"py_callstack": "Traceback ...", "timestamp": str(int(time.time()))}}
with open(os.environ["TORCHELASTIC_ERROR_FILE"], "w") as f:
    json.dump({"message": message}, f)
sys.exit(1)
"""


def test_a_rank_of_a_replica_stopped_after_the_first_failure_is_the_root_cause(runner: Runner, tmp_path: Path) -> None:
    """The replica that ended first failed because of its sibling, stopped while it tore down:
    the root cause is the sibling's failed rank, not the consequence its agent recorded."""
    summary = "\n".join(_summary("Signal 6 (SIGABRT) received by PID 4242"))
    args = ["-c", LINGERING, "${replica_id}", str(tmp_path / "reported"), summary]
    app = AppDef(name="linger", roles=[Role("trainer", "local", entrypoint=sys.executable, args=args, num_replicas=2)])
    handle = runner.run(app, "local_cwd")
    status = runner.wait(handle, wait_interval=0.2, timeout=60, cancel_on_signal=False)
    assert status is not None and status.state == AppState.FAILED
    states = [rep.state for rep in status.roles[0].replicas]
    assert states == [AppState.FAILED, AppState.CANCELLED], states
    cause = find_root_cause(runner, handle, status)
    assert cause is not None
    assert (cause.error, cause.rank, cause.replica) == ("Signal 6 (SIGABRT) received by PID 4242", 3, "trainer/1")


def test_a_failed_rank_wins_over_an_agents_own_error() -> None:
    """Of two failed replicas, the one whose failure names a rank is the root cause, even when
    the other's agent recorded its own error (a consequence) with an older timestamp."""
    agent = RootCause(error="RendezvousConnectionError: lost", replica="trainer/0", timestamp=1.0)
    rank = RootCause(error="Signal 6 (SIGABRT) received by PID 1", replica="trainer/1", rank=3)
    assert root_cause_of([agent, rank]) is rank
    assert root_cause_of([agent, dataclasses.replace(agent, replica="trainer/1", timestamp=0.5)]).replica == "trainer/1"


def test_the_failure_report_names_the_ranks_exit_code_and_calls_the_replicas_torchruns() -> None:
    cause = find_root_cause_of_lines(ABORTED + _summary("Signal 6 (SIGABRT) received by PID 11440"))
    assert cause is not None and (cause.rank, cause.exit_code) == (3, 1)
    cause = dataclasses.replace(cause, exit_code=-6)
    rep = ReplicaStatus(id=0, state=AppState.FAILED, role="trainer", exit_code=1)
    assert failed_replica_note(rep, cause) == "; failed replica trainer/0 (torchrun's exit code for its failed rank 3)"
    # No torchrun rank (a plain script), or another replica's cause: the replica's own code.
    for other in (None, dataclasses.replace(cause, rank=None), dataclasses.replace(cause, replica="trainer/1")):
        assert failed_replica_note(rep, other) == "; failed replica trainer/0, exit code 1"


#: A rank (plain Python under the real torchrun) that prints a traceback and exits 4, as a
#: training script catching its error and calling ``sys.exit`` does, without ``record``.
EXITS_4 = """
import os, sys, traceback
if os.environ["RANK"] == "1":
    try:
        raise ValueError("shard 17 is corrupt")
    except ValueError:
        traceback.print_exc()
        sys.exit(4)
"""


@pytest.mark.torch
@pytest.mark.usefixtures("torch_venv")
def test_a_real_torchrun_rank_exiting_4_is_the_one_exit_code_of_the_failure(runner: Runner, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(EXITS_4)
    handle = runner.run(spmd(script=str(script), j="1x2", env=torch_job_env()), "local_cwd")
    status = runner.wait(handle, wait_interval=0.2, timeout=120, cancel_on_signal=False)
    assert status is not None and status.state == AppState.FAILED
    rep = status.failed_replica()
    assert rep is not None and rep.exit_code == 1  # torchrun's own, whatever its rank did
    cause = find_root_cause(runner, handle, status)
    assert cause is not None, list(runner.log_lines(handle, rep.role, rep.id))
    assert (cause.error, cause.rank, cause.exit_code) == ("ValueError: shard 17 is corrupt", 1, 4)
    note = failed_replica_note(rep, cause)
    assert note == f"; failed replica {rep.role}/0 (torchrun's exit code for its failed rank 1)", note


def test_a_rank_that_lost_its_peer_is_not_the_root_cause() -> None:
    """gloo's error for a peer gone comes a moment after the failure it follows, often in the
    same second and sometimes recorded first: the rank's own failure wins."""
    peer = RootCause(
        error="RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:21386. This is typically caused "
        "by a remote worker crashing.",
        replica="trainer/0",
        rank=0,
        timestamp=100.2,
    )
    own = RootCause(error="RuntimeError: boom on rank 1", replica="trainer/1", rank=1, timestamp=100.7)
    assert root_cause_of([peer, own]) is own
    assert root_cause_of([peer, dataclasses.replace(peer, replica="trainer/1", timestamp=99.0)]).replica == "trainer/1"


ABORTED_NODE = aborted_node.__file__


def _replica_dir(runner: Runner, handle: str) -> Path:
    """Replica trainer/0's log directory, as the job was submitted."""
    info = runner.describe_native(handle)
    assert info is not None
    return Path(info.request.role_log_dirs["trainer"][0])


def _run_aborted_node(runner: Runner, mode: str = "rank-first") -> tuple[str, AppState, RootCause | None]:
    """Runs the node stand-in (``mode``: which failure torchrun names first)."""
    app = AppDef(name="abort", roles=[Role("trainer", "local", entrypoint=sys.executable, args=[ABORTED_NODE, mode])])
    handle = runner.run(app, "local_cwd")
    status = runner.wait(handle, wait_interval=0.2, timeout=60, cancel_on_signal=False)
    assert status is not None
    return handle, status.state, find_root_cause(runner, handle, status)


def test_an_aborted_rank_is_quoted_from_its_own_stderr_not_its_siblings(runner: Runner) -> None:
    _, state, cause = _run_aborted_node(runner)
    assert state == AppState.FAILED
    assert cause is not None and (cause.rank, cause.local_rank, cause.own_stderr) == (1, 1, True)
    text = cause.format()
    assert text.startswith(
        "Root cause (rank 1, replica trainer/0, exit code -6): Signal 6 (SIGABRT) received by PID 1596\n"
        "  Last lines of its stderr:\n"
        "  rank 1: corrupt shard, aborting\n"
        "  Fatal Python error: Aborted\n"
    ), text
    assert text.endswith("line 357 in wrapper"), text  # faulthandler's list of modules left out
    assert "Connection closed by peer" not in text and "earlier run" not in text, text


def test_without_the_ranks_own_file_the_nodes_lines_are_said_to_be_the_nodes(runner: Runner) -> None:
    """A role that set its own ``--log-dir`` (or a rank file the job swapped for a symbolic
    link): the node's lines, under the node's name, and the sibling's traceback is not taken
    for the rank's error."""
    handle, _, _ = _run_aborted_node(runner)
    own = _replica_dir(runner, handle) / "ranks" / "job_new" / "attempt_0" / "1"
    (own / "stderr.log").unlink()
    (own / "stderr.log").symlink_to(own.parent / "0" / "stderr.log")
    status = runner.status(handle)
    assert status is not None
    cause = find_root_cause(runner, handle, status)
    assert cause is not None and not cause.own_stderr
    assert cause.error == "Signal 6 (SIGABRT) received by PID 1596"
    assert "  Last lines of its node's stderr:\n" in cause.format()


def test_a_nodes_traceback_is_the_ranks_only_when_it_is_its_one_and_not_a_peer_gone() -> None:
    unrecorded = parse_torchrun_summary(
        _summary("To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"), "trainer/0"
    )
    assert unrecorded is not None
    own = CALLSTACK.replace("RuntimeError: boom on rank 3", "ValueError: shard 17 is corrupt").splitlines()
    peer = [*own[:-1], "RuntimeError: [pair.cc:534] Connection closed by peer [127.0.0.1]:6521"]
    assert with_node_stderr(unrecorded, own).error == "ValueError: shard 17 is corrupt"
    for node in (peer, own + peer, peer + own):
        cause = with_node_stderr(unrecorded, node)
        assert cause.error == unrecorded.error and cause.frames == () and cause.stderr, node
    # The rank's own lines are its own, whatever their error.
    assert with_rank_stderr(unrecorded, peer).error.endswith("Connection closed by peer [127.0.0.1]:6521")


def test_a_ranks_abort_wins_over_the_peer_gone_error_torchrun_saw_first(runner: Runner) -> None:
    """torchrun names rank 0's collateral error (and copies its error file) when it came in the
    same second: the root cause is rank 1's abort, from the summary's other failures."""
    _, _, cause = _run_aborted_node(runner, "peer-first")
    assert cause is not None
    assert (cause.rank, cause.local_rank, cause.exit_code, cause.error) == (
        1,
        1,
        -6,
        "Signal 6 (SIGABRT) received by PID 1596",
    )
    assert cause.own_stderr and cause.stderr[0] == "rank 1: corrupt shard, aborting", cause.stderr
    # A summary whose root cause is not a peer gone, or whose other failures are only peers gone
    # or the stop torchrun dealt, stays torchrun's.
    alone = aborted_node.PEER_FIRST.replace(
        "Signal 6 (SIGABRT) received by PID 1596", "Signal 15 (SIGTERM) received by PID 1596"
    )
    found = parse_torchrun_summary(alone.splitlines(), "trainer/0")
    assert found is not None and found.rank == 0 and "Connection closed by peer" in found.error
    found = parse_torchrun_summary(_summary("Signal 6 (SIGABRT) received by PID 1"), "trainer/0")
    assert found is not None and found.rank == 3


def test_an_error_file_the_job_points_elsewhere_is_never_read(runner: Runner, tmp_path: Path) -> None:
    """The job rewrites its record to point ``TORCHELASTIC_ERROR_FILE`` at another file, and
    swaps its own ``error.json`` for a symbolic link to it: neither is read, and the root cause
    comes from the job's own log."""
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"message": {"message": "SECRET outside the job"}}))
    handle, state, _ = _run_aborted_node(runner)
    assert state == AppState.FAILED
    replica = _replica_dir(runner, handle)
    request = replica.parent.parent / "request.json"
    record = json.loads(request.read_text())
    for params in record["role_params"].values():
        for param in params:
            param["env"][ERROR_FILE_ENV] = str(secret)
    request.write_text(json.dumps(record))
    (replica / "error.json").unlink(missing_ok=True)
    (replica / "error.json").symlink_to(secret)
    status = runner.status(handle)
    assert status is not None
    assert runner.read_error_file(handle, "trainer", 0) is None
    cause = find_root_cause(runner, handle, status)
    assert cause is not None and "SECRET" not in cause.format(), cause.format()
    assert cause.error == "Signal 6 (SIGABRT) received by PID 1596"
