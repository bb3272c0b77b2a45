"""The ``airflow-torchx`` command: parsing, exit codes, and job lifecycle on the real local
scheduler (in-process for most, as a real subprocess for signals)."""

from __future__ import annotations

import json
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from airflow_provider_torchx.core.cli import main
from airflow_provider_torchx.core.jobviews import printable, printable_tree
from airflow_provider_torchx.core.runner import get_runner
from airflow_provider_torchx.core.specs import (
    AppState,
    AppStatus,
    ReplicaStatus,
    RetryPolicy,
    Role,
    RoleStatus,
    parse_app_handle,
)
from tests.fixtures import aborted_node

CLI = str(Path(sys.executable).parent / "airflow-torchx")
STANDIN = str(Path(__file__).resolve().parents[1] / "fixtures" / "standin_torchrun.py")


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private local job store; afterwards no job of this test may still run."""
    path = tmp_path / "state"
    monkeypatch.setenv("AIRFLOW_TORCHX_STATE_DIR", str(path))
    yield path
    with get_runner() as runner:
        live = [a.app_handle for a in runner.list("local_cwd") if not a.state.is_terminal()]
        for handle in live:
            runner.cancel(handle)
        for handle in live:
            runner.wait(handle, wait_interval=1, timeout=30, cancel_on_signal=False)
    assert not live, f"jobs left running: {live}"


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def only_handle(out: str) -> str:
    handle = out.splitlines()[0]
    parse_app_handle(handle)
    return handle


def jobs() -> list[str]:
    with get_runner() as runner:
        return [a.app_handle for a in runner.list("local_cwd")]


# --------------------------------------------------------------------------- no job involved


def test_builtins_lists_components_with_descriptions(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "builtins")
    assert code == 0
    assert out.startswith("Found 5 components:")
    for name in ("utils.echo", "utils.sh", "utils.python", "utils.touch", "dist.spmd"):
        assert f"  {name} " in out
    assert "Prints a message to stdout" in out
    code, out, _ = run_cli(capsys, "builtins", "dist.spmd")
    assert code == 0 and out.startswith("usage: dist.spmd") and "NODESxPROCS" in out


def test_component_help_submits_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "run", "-s", "local_cwd", "utils.echo", "--help")
    assert code == 0
    assert out.startswith("usage: utils.echo [--msg MSG]")
    assert jobs() == []


def test_dryrun_prints_app_and_request(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["dryrun"], ["run", "--dryrun"]):
        code, out, _ = run_cli(capsys, *argv, "-s", "local_cwd", "--label", "team=ml", "utils.python", "-c", "print(1)")
        assert code == 0
        app_part, _, request_part = out.partition("=== SCHEDULER REQUEST ===")
        assert app_part.startswith("=== APPLICATION ===")
        assert "  command: python -c 'print(1)'\n" in app_part
        assert "  env: TORCHX_JOB_ID=local_cwd://torchx/${app_id}" in app_part
        assert '"print(1)"' in request_part
    assert jobs() == []


def test_run_options_stop_at_the_component(capsys: pytest.CaptureFixture[str]) -> None:
    # everything after the component is the component's, even the CLI's own option names
    code, out, _ = run_cli(
        capsys, "dryrun", "-s", "local_cwd", "utils.sh", "--num_replicas", "2", "echo", "--wait", "-s"
    )
    assert code == 0
    assert "  command: sh -c 'echo --wait -s'\n" in out and "Role sh: 2 replicas\n" in out
    # --help among the command's words is the command's, not a request for the usage
    code, out, _ = run_cli(capsys, "dryrun", "-s", "local_cwd", "utils.sh", "grep", "--help")
    assert code == 0 and "  command: sh -c 'grep --help'\n" in out


def test_runopts(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "runopts", "local_cwd")
    assert code == 0
    assert out.startswith("local_cwd:\n    usage:")
    assert "log_dir=LOG_DIR (str, None)" in out and "prepend_cwd=PREPEND_CWD (bool, False)" in out
    code, out, _ = run_cli(capsys, "runopts")
    assert code == 0
    assert all(f"\n{name}:\n" in f"\n{out}" for name in ("aws_batch", "local_cwd", "local_dir"))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (["status"], "the following arguments are required: app_handle"),
        (["run", "--label", "novalue", "utils.echo"], "'novalue' is not key=value"),
        (["run", "-s", "nope", "utils.echo"], "unknown scheduler 'nope'; known: "),
        (["run", "-s", "local_cdw", "utils.echo"], "local_dir, slurm. Did you mean 'local_cwd' or 'local_dir'?"),
        (["run", "-cfg", "log_dri=/tmp", "utils.echo"], "Did you mean 'log_dir'?"),
        (["run", "-cfg", "log_dir=/tmp/x,nope=1", "utils.echo"], "cfg: unknown option 'nope'"),
        (["run", "-cfg", "prepend_cwd=maybe", "utils.echo"], "cfg: prepend_cwd='maybe' is not a valid bool"),
        (["run", "utils.ehco"], "unknown component 'utils.ehco'. Did you mean utils.echo"),
        (["run", "utils.echo", "--num_replicas", "x"], "--num_replicas: 'x' is not a valid int"),
        (["run", "utils.python"], "-m/-c/--script: give exactly one of them"),
        (["run", "dist.spmd", "--scirpt", "train.py"], "unrecognized arguments: --scirpt. Did you mean '--script'"),
        (["dryrun", "utils.echo", "--num_replicas", "0"], "--num_replicas: 0 is not allowed: it must be an int >= 1"),
        (["status", "not-a-handle"], "app_handle: 'not-a-handle' is not of the form scheduler://session/app_id"),
        (["log", "local_cwd:/x"], "is not of the form scheduler://session/app_id"),
        (["list", "-s", "local_cwd", "-cfg", "x=1"], "cfg: unknown option 'x'"),
        (["log", "-n", "0", "local_cwd://torchx/x"], "argument -n/--lines: '0' is not a whole number >= 1"),
        (["log", "-n", "3", "--tail", "local_cwd://torchx/x"], "argument -t/--tail: not allowed with argument -n"),
        *(
            (
                ["run", "--poll_interval", value, "utils.echo"],
                f"argument --poll_interval: {value!r} is not allowed: give a number of seconds > 0",
            )
            for value in ("0", "-1", "-0.5", "nan", "inf", "soon")
        ),
    ],
)
def test_usage_errors_exit_2_without_traceback(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    assert message in err
    assert "Traceback" not in err and out == ""
    assert jobs() == []


@pytest.mark.parametrize("command", ["status", "describe", "cancel", "delete", "log"])
def test_no_such_job_exits_1(capsys: pytest.CaptureFixture[str], command: str) -> None:
    code, _, err = run_cli(capsys, command, "local_cwd://torchx/missing-123")
    assert code == 1
    assert "no such job: local_cwd://torchx/missing-123" in err


# --------------------------------------------------------------------------- job lifecycle


def test_run_wait_success_and_inspect(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(
        capsys, "run", "--wait", "-s", "local_cwd", "--label", "team=ml", "utils.sh", "--num_replicas", "2",
        "echo out ${replica_id}; echo err ${replica_id} >&2",
    )  # fmt: skip
    assert code == 0, err
    handle = only_handle(out)
    assert f"{handle}: SUCCEEDED" in err

    code, out, _ = run_cli(capsys, "status", handle)
    assert code == 0 and "State: SUCCEEDED" in out and "sh[1]@localhost:SUCCEEDED (exit 0)" in out
    code, out, _ = run_cli(capsys, "describe", handle)
    assert code == 0 and "Role sh: 2 replicas\n" in out
    assert (
        "Usage:" in out and "Replica runs: 2 (role[replica] #attempt" in out and "sh[1] #1:" in out and "exit 0" in out
    )

    code, out, _ = run_cli(capsys, "log", handle)
    assert code == 0
    assert out.splitlines() == ["[sh/0] out 0", "[sh/0] err 0", "[sh/1] out 1", "[sh/1] err 1"]
    assert run_cli(capsys, "log", f"{handle}/sh/1")[1] == "out 1\nerr 1\n"
    assert run_cli(capsys, "log", "--streams", "stderr", f"{handle}/sh")[1] == "[sh/0] err 0\n[sh/1] err 1\n"
    assert run_cli(capsys, "log", "-n", "1", handle)[1] == "[sh/0] err 0\n[sh/1] err 1\n"  # the last line of each
    assert run_cli(capsys, "log", "--lines", "1", "--regex", "out", f"{handle}/sh/1")[1] == "out 1\n"
    # --tail follows the replicas side by side: per-replica order only
    tailed = run_cli(capsys, "log", "--regex", "out", "--tail", handle)[1]
    assert sorted(tailed.splitlines()) == ["[sh/0] out 0", "[sh/1] out 1"]
    code, _, err = run_cli(capsys, "log", f"{handle}/nope")
    assert code == 2 and "has no role 'nope'; its roles: sh" in err

    code, out, _ = run_cli(capsys, "list", "-s", "local_cwd", "--label", "team=ml")
    assert code == 0 and handle in out and "SUCCEEDED" in out
    code, out, err = run_cli(capsys, "list", "-s", "local_cwd", "--label", "team=other")
    assert code == 0 and handle not in out and "no jobs" in err

    code, out, _ = run_cli(capsys, "cancel", handle)
    assert code == 0 and "already SUCCEEDED; nothing to cancel" in out
    assert run_cli(capsys, "delete", handle)[0] == 0
    assert run_cli(capsys, "status", handle)[0] == 1


def test_log_tail_follows_a_running_job_to_its_end(capsys: pytest.CaptureFixture[str]) -> None:
    """``log --tail`` of a running job (two replicas, 2,500 lines each, more than one read's
    worth, half of them after a pause) prints every line once, in order per replica, and
    returns once the job ended; naming a replica prints its lines as they are."""
    code, out, err = run_cli(
        capsys, "run", "-s", "local_cwd", "utils.sh", "--num_replicas", "2",
        "seq 1 1250; sleep 1.5; seq 1251 2500",
    )  # fmt: skip
    assert code == 0, err
    handle = only_handle(out)
    code, out, _ = run_cli(capsys, "log", "--tail", handle)
    assert code == 0
    with get_runner() as runner:
        status = runner.status(handle)
    assert status is not None and status.state == AppState.SUCCEEDED  # it returned at the end
    lines = out.splitlines()
    for k in (0, 1):
        assert [line.split(" ", 1)[1] for line in lines if line.startswith(f"[sh/{k}] ")] == [
            str(i) for i in range(1, 2501)
        ]
    assert len(lines) == 5000
    assert run_cli(capsys, "log", "--tail", "--regex", "^250.$", f"{handle}/sh/1")[1] == "2500\n"


def test_run_checkpoint_dir_reaches_every_replica_and_describe(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    location = str(tmp_path / "ckpt" / "mine")
    code, out, err = run_cli(
        capsys, "run", "--wait", "-s", "local_cwd", "--checkpoint_dir", location, "utils.sh", "--num_replicas", "2",
        'echo "$TORCHX_CHECKPOINT_DIR $TORCHX_ATTEMPT"',
    )  # fmt: skip
    assert code == 0, err
    handle = only_handle(out)
    assert Path(location).parent.is_dir() and not Path(location).exists(), "the job creates it when it saves"
    assert run_cli(capsys, "log", handle)[1].splitlines() == [f"[sh/0] {location} 0", f"[sh/1] {location} 0"]
    assert f"Checkpoints: {location}" in run_cli(capsys, "describe", handle)[1]
    status = json.loads(run_cli(capsys, "status", "--json", handle)[1])
    assert status["checkpoint_dir"] == status["usage"]["checkpoint_dir"] == location
    code, _, err = run_cli(capsys, "run", "-s", "local_cwd", "--checkpoint_dir", "rel/dir", "utils.sh", "true")
    assert code == 2 and "--checkpoint_dir: 'rel/dir' is neither an absolute path nor a URI" in err


def test_run_wait_failure_exits_1_with_reason(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "run", "--wait", "-s", "local_cwd", "utils.sh", "echo about to fail; exit 3")
    assert code == 1
    assert f"{only_handle(out)}: FAILED" in err
    assert "role 'sh' replica 0 exited with code 3" in err
    assert "last 1 lines of sh/0:\nabout to fail" in err


def test_run_log_streams_every_replica_once(capsys: pytest.CaptureFixture[str]) -> None:
    script = "for i in 1 2 3; do echo line $i of ${replica_id}; sleep 0.3; done"
    code, out, err = run_cli(
        capsys, "run", "--log", "--poll_interval", "0.2", "-s", "local_cwd", "utils.sh", "--num_replicas", "2", script
    )
    assert code == 0, err
    lines = out.splitlines()[1:]
    for k in (0, 1):
        assert [x for x in lines if x.startswith(f"[sh/{k}]")] == [f"[sh/{k}] line {i} of {k}" for i in (1, 2, 3)]
    assert len(lines) == 6


def test_status_and_describe_of_a_failed_ddp_job_show_its_root_cause(capsys: pytest.CaptureFixture[str]) -> None:
    """Rank 1 of two workers under the torchrun stand-in raises: ``run --wait``, ``status`` and
    ``describe`` show the failing rank's exception, as the task's failure message does, in
    plain text and in JSON; a job that did not fail has none."""
    code, out, err = run_cli(capsys, "run", "--wait", "utils.sh", f"{sys.executable} {STANDIN} 2 1")
    assert code == 1, err
    handle = only_handle(out)
    cause = "Root cause (rank 1, replica sh/0, exit code 1): RuntimeError: boom on rank 1\n"
    frame = '    raise RuntimeError(f"boom on rank {rank}")'
    assert cause in err and frame in err, err
    for command in ("status", "describe"):
        code, out, _ = run_cli(capsys, command, handle)
        assert code == 0 and cause in out and frame in out, out
        assert "Failure kind: app (RuntimeError on sh/0)" in out, out
        code, out, _ = run_cli(capsys, command, "--json", handle)
        shown = json.loads(out)
        assert (shown if command == "status" else shown["status"])["failure_kind"] == "app"
        root = (shown if command == "status" else shown["status"])["root_cause"]
        assert (root["error"], root["rank"], root["replica"], root["exit_code"]) == (
            "RuntimeError: boom on rank 1", 1, "sh/0", 1,
        )  # fmt: skip
        assert root["frames"][-1] == frame[2:]  # the plain form indents each frame line by two more
    code, out, _ = run_cli(capsys, "run", "--wait", "utils.echo")
    code, out, _ = run_cli(capsys, "status", "--json", only_handle(out))
    assert code == 0 and json.loads(out)["root_cause"] is None and json.loads(out)["failure_kind"] is None


def test_status_and_describe_quote_the_failing_ranks_own_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    """A node of 2 ranks whose rank 1 aborted, rank 0's collateral error reported first by
    torchrun (``tests/fixtures/aborted_node.py``): ``status`` and ``describe`` quote rank 1's
    own stderr lines, never rank 0's."""
    node = f"{sys.executable} {aborted_node.__file__} peer-first"
    code, out, err = run_cli(capsys, "run", "--wait", "utils.sh", node)
    assert code == 1, err
    handle = only_handle(out)
    cause = (
        "Root cause (rank 1, replica sh/0, exit code -6): Signal 6 (SIGABRT) received by PID 1596\n"
        "  Last lines of its stderr:\n  rank 1: corrupt shard, aborting\n  Fatal Python error: Aborted\n"
    )
    for command in ("status", "describe"):
        code, out, _ = run_cli(capsys, command, handle)
        assert code == 0 and cause in out and "Connection closed by peer" not in out, out
        assert "Failure kind: app (SIGABRT on sh/0)" in out, out  # a signal the rank raised itself
        code, out, _ = run_cli(capsys, command, "--json", handle)
        shown = json.loads(out)
        root = (shown if command == "status" else shown["status"])["root_cause"]
        assert (root["rank"], root["own_stderr"], root["stderr"][0]) == (1, True, "rank 1: corrupt shard, aborting")


def test_cancel_a_running_job(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "run", "-s", "local_cwd", "utils.sh", "sleep 60")
    handle = only_handle(out)
    code, out, _ = run_cli(capsys, "cancel", handle)
    assert code == 0 and f"{handle}: cancel requested" in out
    with get_runner() as runner:
        final = runner.wait(handle, wait_interval=1, timeout=30, cancel_on_signal=False)
    assert final is not None and final.state == AppState.CANCELLED
    code, out, _ = run_cli(capsys, "status", "--json", handle)
    assert code == 0 and json.loads(out)["failure_kind"] == "cancelled"
    code, out, _ = run_cli(capsys, "status", handle)
    assert "Failure kind: cancelled (cancelled by user)" in out, out


def _read_lines(stream: subprocess.Popen[str]) -> queue.Queue[str]:
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert stream.stdout is not None
        for line in stream.stdout:
            lines.put(line.rstrip("\n"))

    threading.Thread(target=pump, daemon=True).start()
    return lines


@pytest.mark.parametrize(("sig", "exit_code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_during_attached_run_cancels_the_job(tmp_path: Path, sig: signal.Signals, exit_code: int) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    # $$$$ reaches the shell as $$ (its pid); exec makes the replica the sleep itself
    script = f"echo $$$$ > {pids}/${{replica_id}}; echo started; exec sleep 60"
    proc = subprocess.Popen(
        [CLI, "run", "--log", "--poll_interval", "0.2", "-s", "local_cwd", "utils.sh", "--num_replicas", "2", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = _read_lines(proc)
        handle = lines.get(timeout=30)
        parse_app_handle(handle)
        seen = {lines.get(timeout=30), lines.get(timeout=30)}
        assert seen == {"[sh/0] started", "[sh/1] started"}
        replica_pids = [int((pids / str(k)).read_text()) for k in (0, 1)]
        assert all(psutil.pid_exists(p) for p in replica_pids)
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == exit_code
        err = proc.stderr.read() if proc.stderr else ""
        assert f"{handle}: {sig.name} received, cancelling the job" in err
        assert "Traceback" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with get_runner() as runner:
        status = runner.status(handle)
    assert status is not None and status.state == AppState.CANCELLED
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in replica_pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in replica_pids if _alive(p)]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_closed_pipe_ends_the_command_quietly_with_0(capsys: pytest.CaptureFixture[str]) -> None:
    """As ``airflow-torchx ... | head -1``: the reader is gone before the command writes (its
    end of the pipe is closed at once), as a real subprocess."""
    code, out, _ = run_cli(capsys, "run", "--wait", "-s", "local_cwd", "utils.sh", "echo one; echo two")
    assert code == 0
    handle = only_handle(out)
    for argv in (["runopts"], ["builtins"], ["status", handle], ["describe", handle], ["log", handle]):
        proc = subprocess.Popen([CLI, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None
        proc.stdout.close()
        _, err = proc.communicate(timeout=60)
        assert (proc.returncode, err.decode()) == (0, ""), argv


def test_list_shows_submit_time_and_airflow_task_and_status_the_timing(capsys: pytest.CaptureFixture[str]) -> None:
    labels = ["--label", "airflow.dag_id=sweep", "--label", "airflow.task_id=train", "--label", "airflow.map_index=2"]
    before = time.time()
    code, out, err = run_cli(capsys, "run", "--wait", "-s", "local_cwd", *labels, "utils.sh", "sleep 1.2")
    assert code == 0, err
    handle = only_handle(out)
    code, out, _ = run_cli(capsys, "list", "-s", "local_cwd")
    header, row = out.splitlines()
    assert header.split() == ["APP", "HANDLE", "STATE", "SUBMITTED", "AIRFLOW", "TASK", "NAME"]
    submitted = time.mktime(time.strptime(" ".join(row.split()[2:4]), "%Y-%m-%d %H:%M:%S"))
    assert row.split()[:2] == [handle, "SUCCEEDED"] and row.split()[4:] == ["sweep.train[2]", "sh"]
    assert before - 1 <= submitted <= time.time()
    code, out, _ = run_cli(capsys, "status", handle)
    started = re.search(r"\n  Started: (\S+ \S+); duration: (\d+)s\n", out)
    assert code == 0 and started, out
    assert 1 <= int(started.group(2)) <= 30


GPU_COMPONENT = """
from airflow_provider_torchx.core.specs import AppDef, Resource, RetryPolicy, Role

def gpus() -> AppDef:
    script = 'echo "${replica_id} sees $CUDA_VISIBLE_DEVICES"; sleep 60'
    role = Role("g", image="local", entrypoint="sh", args=["-c", script], num_replicas=2,
                resource=Resource(1, 2, 64), max_retries=1, retry_policy=RetryPolicy.REPLICA,
                env={"API_TOKEN": "s3cret-value-123"})
    return AppDef("gpus", roles=[role])
"""


def test_describe_status_and_list_readable_and_json_with_each_replicas_gpus(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_TORCHX_LOCAL_GPUS", "0,1,2,3")  # a 4-GPU host, as far as the ledger knows
    (tmp_path / "gpus.py").write_text(GPU_COMPONENT)
    cfg = ["-s", "local_cwd", "-cfg", "auto_set_cuda_visible_devices=True"]
    code, out, err = run_cli(capsys, "run", *cfg, "--label", "team=ml", f"{tmp_path}/gpus.py:gpus")
    assert code == 0, err
    handle = only_handle(out)
    deadline = time.monotonic() + 60
    while (status := get_runner().status(handle)) is None or status.state != AppState.RUNNING:
        assert time.monotonic() < deadline, status
        time.sleep(0.1)
    code, out, _ = run_cli(capsys, "describe", handle)
    assert code == 0 and "<" not in out and "RetryPolicy" not in out and "s3cret" not in out, out
    assert "  resource: 1 CPU, 2 GPUs, 64 MiB\n  retries: 1 (policy REPLICA)\n" in out, out
    assert f"  command: sh -c '{GPU_COMPONENT.split(chr(39))[1]}'\n" in out, out
    assert "  g[0]@localhost RUNNING GPUs 0,1\n  g[1]@localhost RUNNING GPUs 2,3" in out, out
    code, out, _ = run_cli(capsys, "status", handle)
    assert "g[0]@localhost:RUNNING (GPUs 0,1) g[1]@localhost:RUNNING (GPUs 2,3)" in out, out
    code, out, _ = run_cli(capsys, "status", "--json", handle)
    status_json = json.loads(out)
    assert set(status_json) == set(STATUS_KEYS) and status_json["state"] == "RUNNING"
    replicas = status_json["roles"][0]["replicas"]
    assert [(r["id"], r["state"], r["devices"]) for r in replicas] == [(0, "RUNNING", "0,1"), (1, "RUNNING", "2,3")]
    assert set(replicas[0]) == {"id", "state", "hostname", "exit_code", "msg", "devices"}
    code, out, _ = run_cli(capsys, "describe", "--json", handle)
    described = json.loads(out)
    assert set(described) == {"handle", "app", "status"}
    so_far = status_json.pop("usage_so_far"), described["status"].pop("usage_so_far")  # read at two moments
    assert described["status"] == status_json
    assert all(used["gpu_hours"] > 0 and used["cost_usd"] is None for used in so_far), so_far  # 2 GPUs, unpriced
    (role,) = described["app"]["roles"]
    assert (role["retry_policy"], role["resource"]["gpu"], role["env"]["API_TOKEN"]) == ("REPLICA", 2, "***")
    code, out, _ = run_cli(capsys, "list", "--json", "-s", "local_cwd")
    (job,) = json.loads(out)["jobs"]
    assert job == {
        "handle": handle,
        "state": "RUNNING",
        "name": "gpus",
        "submitted": job["submitted"],
        "airflow_task": None,
        "labels": {"team": "ml"},
    }
    assert code == 0 and isinstance(job["submitted"], float)
    assert run_cli(capsys, "cancel", handle)[0] == 0
    ended = get_runner().wait(handle, wait_interval=0.2, timeout=30, cancel_on_signal=False)
    assert ended is not None and ended.state == AppState.CANCELLED
    code, out, _ = run_cli(capsys, "status", "--json", handle)
    assert code == 0 and json.loads(out)["cancelled_by"] == "user"  # a person, as data


#: The keys of ``status --json`` (docs/cli.md, "JSON output").
STATUS_KEYS = (
    "handle", "state", "terminal", "num_restarts", "msg", "structured_error_msg", "ui_url", "started", "ended",
    "cancel_requested", "cancel_reason", "cancelled_by", "labels", "roles", "usage", "root_cause", "checkpoint_dir",
    "failure_kind", "usage_so_far",
)  # fmt: skip


ONE_GPU_COMPONENT = """
from airflow_provider_torchx.core.specs import AppDef, Resource, Role

def gpu(replicas: int = 1) -> AppDef:
    role = Role("g", image="local", entrypoint="sleep", args=["60"], num_replicas=replicas, resource=Resource(1, 1, 64))
    return AppDef("gpu", roles=[role])
"""


def test_warnings_are_one_line_counts_singular_and_a_pending_job_shows_no_start(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_TORCHX_LOCAL_GPUS", "0")  # a 1-GPU host, as far as the ledger knows
    (tmp_path / "gpu.py").write_text(ONE_GPU_COMPONENT)
    cfg = ["-s", "local_cwd", "-cfg", "auto_set_cuda_visible_devices=True"]
    code, _, err = run_cli(capsys, "dryrun", *cfg, f"{tmp_path}/gpu.py:gpu", "--replicas", "2")
    assert code == 0
    assert err == (
        "warning: auto_set_cuda_visible_devices: app 'gpu' requests 2 GPUs but this host has 1; "
        "CUDA_VISIBLE_DEVICES is not set\n"
    ), err
    holder = only_handle(run_cli(capsys, "run", *cfg, f"{tmp_path}/gpu.py:gpu")[1])
    waiting = only_handle(run_cli(capsys, "run", *cfg, f"{tmp_path}/gpu.py:gpu")[1])
    deadline = time.monotonic() + 60
    while "waiting for 1 GPU, 0 free, held by" not in (out := run_cli(capsys, "status", waiting)[1]):
        assert time.monotonic() < deadline, out
        time.sleep(0.2)
    assert "State: PENDING" in out and "Started:" not in out, out
    for handle in (waiting, holder):
        assert run_cli(capsys, "cancel", handle)[0] == 0
        ended = get_runner().wait(handle, wait_interval=0.2, timeout=30, cancel_on_signal=False)
        assert ended is not None and ended.state == AppState.CANCELLED
    assert "Started:" not in run_cli(capsys, "status", waiting)[1]  # cancelled while PENDING: it never ran


# --------------------------------------------------------------------------- control characters


def test_printable_escapes_what_could_forge_a_line_and_keeps_tab() -> None:
    assert printable("a\nb\rc\x1b[2Jd\x00\x7f\x85\u2028\te") == "a\\nb\\rc\\x1b[2Jd\\x00\\x7f\\x85\\u2028\te"
    assert printable("plain text, üñí, \\n as typed") == "plain text, üñí, \\n as typed"
    status = AppStatus(
        AppState.FAILED,
        msg="boom\nState: SUCCEEDED",
        roles=[RoleStatus("r\rx", [ReplicaStatus(0, AppState.FAILED, "r\rx", "host\x1b[1A")])],
    )
    shown = printable_tree(status)
    assert shown.msg == "boom\\nState: SUCCEEDED" and shown.roles[0].replicas[0].hostname == "host\\x1b[1A"
    assert status.msg == "boom\nState: SUCCEEDED"  # a copy: the status itself is untouched
    assert shown.state is AppState.FAILED
    assert [line.strip() for line in shown.format().splitlines()].count("State: SUCCEEDED") == 0
    role = Role("r", image="i", entrypoint="e", retry_policy=RetryPolicy.REPLICA, metadata={"k\n": "v\r"})
    shown_role = printable_tree(role)
    assert shown_role.retry_policy is RetryPolicy.REPLICA and shown_role.metadata == {"k\\n": "v\\r"}


def test_describe_and_log_escape_control_characters_of_the_job(capsys: pytest.CaptureFixture[str]) -> None:
    """A label with a newline cannot forge a line of ``describe``, nor a log line with a
    carriage return and an escape sequence another replica's prefix; ``log HANDLE/ROLE/K``
    prints the job's own lines as they are."""
    code, out, err = run_cli(
        capsys, "run", "--log", "-s", "local_cwd", "--label", "note=x\nState: FAILED", "utils.sh",
        r"printf 'ok\r[sh/1] forged\033[2J\tcol\n'",
    )  # fmt: skip
    assert code == 0, err
    handle = only_handle(out)
    assert out.splitlines()[1:] == ["[sh/0] ok\\r[sh/1] forged\\x1b[2J\tcol"]
    code, out, _ = run_cli(capsys, "describe", handle)
    assert code == 0 and "Labels: note=x\\nState: FAILED" in out, out
    assert "State: FAILED" not in out.splitlines() and "\r" not in out
    code, out, _ = run_cli(capsys, "log", handle)
    assert code == 0 and out == "[sh/0] ok\\r[sh/1] forged\\x1b[2J\tcol\n"
    assert run_cli(capsys, "log", "--tail", handle)[1] == out
    assert run_cli(capsys, "log", f"{handle}/sh/0")[1] == "ok\r[sh/1] forged\x1b[2J\tcol\n"
    code, out, _ = run_cli(capsys, "describe", "--json", handle)
    assert json.loads(out)["status"]["labels"] == {"note": "x\nState: FAILED"}
