"""The plugin end to end, as a TorchX user runs it: the ``torchx`` CLI and TorchX's ``Runner``
against the moto server over HTTP (every Batch node a real container on the test Docker
engine, output read back from CloudWatch Logs), single-node and 2-node jobs: submit, status,
log lines (read, and tailed by ``torchx run --log``), list and cancel. What moto models:
tests/core/aws_batch/test_integration.py."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from torchx import specs as tx
from torchx.runner import Runner, get_runner

pytestmark = [pytest.mark.docker, pytest.mark.timeout(120)]

BIN = Path(sys.executable).parent
IMAGE = "busybox:local"
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def torchx(*args: str) -> str:
    """``torchx ARGS``: its stdout (a failure shows its stderr)."""
    return torchx_outputs(*args)[0]


def torchx_outputs(*args: str) -> tuple[str, str]:
    """``torchx ARGS``: its stdout and stderr (a failure shows its stderr)."""
    proc = subprocess.run([str(BIN / "torchx"), *args], capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, proc.stderr


def cli_state(handle: str) -> str:
    return str(json.loads(torchx("status", "--json", handle))["state"])


def wait_until(probe: Callable[[], str], want: set[str], timeout: float = 60.0) -> str:
    """Poll ``probe`` until it returns one of ``want``; the last answer (an end not wanted fails
    at once)."""
    deadline = time.monotonic() + timeout
    while (got := probe()) not in want:
        assert got not in TERMINAL, f"ended {got}; wanted {want}"
        assert time.monotonic() < deadline, f"still {got} after {timeout}s; wanted {want}"
        time.sleep(0.3)
    return got


@pytest.fixture
def runner(batch_queue: str) -> Iterator[Runner]:
    with get_runner() as r:
        yield r


def state_of(runner: Runner, handle: str) -> Callable[[], str]:
    def probe() -> str:
        status = runner.status(handle)
        assert status is not None, handle
        return status.state.name

    return probe


def test_torchx_cli_runs_logs_lists_and_cancels(batch_queue: str, runner: Runner) -> None:
    """A 2-node job run to its end and a single-node one cancelled, through the CLI (each call
    starts TorchX anew, so the shapes share calls; the Runner test runs both shapes through
    both paths)."""
    cfg = ["-s", "aws_batch", "-cfg", f"queue={batch_queue}"]
    sleeper = torchx("run", *cfg, "utils.sh", "--image", IMAGE, "sleep", "600").strip().splitlines()[-1]
    component = ["utils.echo", "--msg", "hi from torchx", "--image", IMAGE, "--num_replicas", "2"]
    out, err = torchx_outputs("run", *cfg, "--log", *component)  # waits, tailing every replica's log
    handle = out.strip().splitlines()[0]
    streamed = [line for line in err.splitlines() if line.startswith("echo/")]
    assert sorted(streamed) == ["echo/0 hi from torchx"] * 2 + ["echo/1 hi from torchx"] * 2  # moto: one stream
    assert handle.startswith(f"aws_batch://torchx/{batch_queue}:echo-")
    assert cli_state(handle) == "SUCCEEDED"
    # `torchx log HANDLE`: every replica's lines, each prefixed with role/replica; moto writes
    # every node into one stream (and sets no node index), so each replica's log holds all
    # nodes' output
    logs = [line.split(" ", 1) for line in torchx("log", handle).splitlines()]
    for k in range(2):
        assert [text for where, text in logs if where == f"echo/{k}"] == ["hi from torchx"] * 2
    assert len(logs) == 4

    wait_until(state_of(runner, sleeper), {"RUNNING"})
    listed = torchx("list", "-s", "aws_batch", "-cfg", f"queue={batch_queue}")
    for app_handle, state in ((handle, "SUCCEEDED"), (sleeper, "RUNNING")):
        app_id = app_handle.rsplit("/", 1)[1]
        assert any(app_id in line and state in line for line in listed.splitlines()), listed
    torchx("cancel", sleeper)
    assert wait_until(lambda: cli_state(sleeper), TERMINAL, 30) == "CANCELLED"
    status = runner.status(sleeper)
    assert status is not None and "cancelled by TorchX" in status.msg and "airflow-torchx" not in status.msg


@pytest.mark.parametrize("replicas", [1, 2])
def test_torchx_runner_runs_logs_lists_and_cancels(batch_queue: str, runner: Runner, replicas: int) -> None:
    cfg = {"queue": batch_queue}
    role = tx.Role(
        "trainer",
        IMAGE,
        entrypoint="sh",
        args=["-c", f"echo {tx.macros.app_id} is $TORCHX_JOB_ID"],
        num_replicas=replicas,
        resource=tx.Resource(cpu=1, gpu=0, memMB=64),
    )
    sleeper_role = tx.Role(
        "main", IMAGE, entrypoint="sleep", args=["600"], num_replicas=replicas, resource=role.resource
    )
    sleeper = runner.run(tx.AppDef("sleeper", roles=[sleeper_role]), "aws_batch", cfg)
    handle = runner.run(tx.AppDef("hello", roles=[role]), "aws_batch", cfg)
    app_id = handle.rsplit("/", 1)[1]
    status = runner.wait(handle, wait_interval=0.3)
    assert status is not None and status.state == tx.AppState.SUCCEEDED, status
    assert [[(r.id, r.state) for r in rs.replicas] for rs in status.roles] == [
        [(k, tx.AppState.SUCCEEDED) for k in range(replicas)]
    ]
    for k in range(replicas):
        lines = list(runner.log_lines(handle, "trainer", k))  # moto: all nodes' output (one stream)
        assert lines == [f"{app_id} is {handle}\n"] * replicas
    app = runner.describe(handle)
    assert app is not None and [(r.name, r.num_replicas, r.image) for r in app.roles] == [("trainer", replicas, IMAGE)]

    wait_until(state_of(runner, sleeper), {"RUNNING"})
    listed = {app.app_handle: app.state for app in runner.list("aws_batch", cfg)}
    assert (listed[handle], listed[sleeper]) == (tx.AppState.SUCCEEDED, tx.AppState.RUNNING)
    runner.cancel(sleeper)
    assert wait_until(state_of(runner, sleeper), TERMINAL, 30) == "CANCELLED"
    runner.cancel(sleeper)  # a cancel of an ended app does nothing
