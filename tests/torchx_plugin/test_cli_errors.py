"""What the ``torchx`` CLI prints when the plugin refuses: one line in TorchX's terms (``run``:
TorchX's "Invalid scheduler configuration" line, naming the option, the value and what it
takes; ``status``, ``list``, ``log``, ``cancel``...: the error's own line), no traceback, no
Airflow wording, nothing submitted. Each case runs the CLI in TorchX's venv (no AWS endpoint
answers: every refusal comes before any call, or the endpoint is closed)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.aws import MotoServer, create_job_queue, moto_settings

BIN = Path(sys.executable).parent


def torchx_fails(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """``torchx ARGS`` in an empty directory with no AWS settings: it must exit 1; its output."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    clean |= {"AWS_CONFIG_FILE": str(tmp_path / "none"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}
    proc = subprocess.run(
        [str(BIN / "torchx"), *args], capture_output=True, text=True, timeout=90, cwd=tmp_path, env=clean | (env or {})
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def error_line(out: str) -> str:
    """The one ERROR line TorchX's CLI printed (and no traceback)."""
    assert "Traceback" not in out, out
    (line,) = [line for line in out.splitlines() if " ERROR " in line]
    return line.split(" ERROR ", 1)[1].strip()


RUN = ("run", "--dryrun", "-s", "aws_batch")


@pytest.mark.parametrize(
    ("cfg", "says"),
    [
        (
            "queue=q,region=us-east-1,share_id=s,priority=high",
            "cfg: priority='high' is not a valid int; priority: Scheduling priority within share_id",
        ),
        ("queue=q,region=us-east-1,privileged=maybe", "cfg: privileged='maybe' is not a valid bool (use true/false)"),
        ("queue=q,regio=us-east-1", "cfg: unknown option 'regio'; valid options: "),
        ("queue=q,region=us-east-1,priority=5", "cfg: priority=5 needs share_id"),
        ("queue=q,region=us-east-1,attempt_timeout=30", "cfg: attempt_timeout=30 is below its minimum"),
    ],
)
def test_a_bad_run_option_is_one_line_naming_it(tmp_path: Path, cfg: str, says: str) -> None:
    line = error_line(torchx_fails(tmp_path, *RUN, "-cfg", cfg, "utils.echo"))
    assert line.startswith(f"Invalid scheduler configuration: {says}"), line
    assert "invalid literal" not in line


def test_no_region_is_one_line_in_torchx_terms(tmp_path: Path) -> None:
    out = torchx_fails(tmp_path, "run", "-s", "aws_batch", "-cfg", "queue=q", "utils.echo")
    line = error_line(out)
    assert line.startswith("Invalid scheduler configuration: AWS: no region is configured: "), line
    assert "-cfg region=" in line and "Airflow" not in out


def test_image_repo_without_docker_says_so_naming_the_option(tmp_path: Path) -> None:
    cfg = "queue=q,region=us-east-1,image_repo=registry.example/ml"
    out = torchx_fails(tmp_path, *RUN, "-cfg", cfg, "utils.echo", env={"DOCKER_HOST": f"unix://{tmp_path}/no.sock"})
    line = error_line(out)
    assert line.startswith(
        "Invalid scheduler configuration: image_repo='registry.example/ml' builds role echo's workspace into an "
        "image: Docker: no engine to build the workspace image"
    ), line
    assert "without image_repo the role's image runs as it is" in line and "DockerException" not in out


def test_a_bad_app_is_torchx_component_error_naming_the_field(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    component = ["dist.ddp", "--gpu", "-1", "-j", "1x1", "--script", "train.py"]
    out = torchx_fails(tmp_path, *RUN, "-cfg", "queue=q,region=us-east-1", *component)
    assert "Traceback" not in out
    assert out.rstrip().endswith(
        "Failed to run component `dist.ddp` got errors: \n roles[0].resource.gpu: -1 must be an int >= 0"
    )


#: TorchX's subcommands that act on a job, each with a job of the plugin's.
ON_A_JOB = [
    ("status", "aws_batch://torchx/q:job-1"),
    ("describe", "aws_batch://torchx/q:job-1"),
    ("cancel", "aws_batch://torchx/q:job-1"),
    ("log", "aws_batch://torchx/q:job-1/echo/0"),
    ("delete", "aws_batch://torchx/q:job-1"),
]


@pytest.mark.parametrize("args", ON_A_JOB, ids=[cmd for cmd, _ in ON_A_JOB])
def test_no_region_is_one_line_naming_the_environment(tmp_path: Path, args: tuple[str, str]) -> None:
    """These subcommands take no run options: the line names the environment, not ``-cfg``."""
    out = torchx_fails(tmp_path, *args)
    assert (
        error_line(out)
        == "AWS: no region is configured: set AWS_DEFAULT_REGION or a profile with a region (AWS_PROFILE)"
    )
    assert "Airflow" not in out and "-cfg" not in out


def test_list_without_a_region_is_one_line_naming_its_run_option(tmp_path: Path) -> None:
    out = torchx_fails(tmp_path, "list", "-s", "aws_batch")
    assert error_line(out) == (
        "AWS: no region is configured: set AWS_DEFAULT_REGION, a profile with a region (AWS_PROFILE) or -cfg region="
    )


def test_no_credentials_is_one_line(tmp_path: Path) -> None:
    out = torchx_fails(tmp_path, "status", "aws_batch://torchx/q:job-1", env={"AWS_DEFAULT_REGION": "us-east-1"})
    assert error_line(out) == (
        "AWS: no usable credentials (Unable to locate credentials): set AWS_PROFILE, or AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY"
    )


@pytest.mark.parametrize(
    "args", [*ON_A_JOB, ("list", "-s", "aws_batch"), ("log", "aws_batch://torchx/q:job-1/echo/0,1")], ids=str
)
def test_an_unreachable_endpoint_is_one_line_per_call(tmp_path: Path, args: tuple[str, ...]) -> None:
    """Nothing listens on the endpoint; ``torchx log`` of two replicas reads each in a thread
    of its own: no thread's traceback, one line for each (TorchX reports every thread's
    error)."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        endpoint = f"http://127.0.0.1:{closed.getsockname()[1]}"
        env = {"AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}
        out = torchx_fails(tmp_path, *args, env=env | {"AWS_ENDPOINT_URL": endpoint})
    assert "Traceback" not in out and "Exception in thread" not in out, out
    lines = [line.split(" ERROR ", 1)[1].strip() for line in out.splitlines() if " ERROR " in line]
    assert len(lines) == (2 if args[-1].endswith("0,1") else 1), out
    for line in lines:
        assert line.startswith(f"AWS: cannot reach {endpoint}/"), line
        assert line.endswith("(retried): check the network, AWS_ENDPOINT_URL and the region"), line


@pytest.mark.parametrize("cmd", ["status", "cancel", "describe"])
def test_a_malformed_handle_is_one_line(tmp_path: Path, cmd: str) -> None:
    line = error_line(torchx_fails(tmp_path, cmd, "q:job-1"))
    assert line == "q:job-1 is not of the form: <scheduler_backend>://<session_name>/<app_id>", line


def test_another_schedulers_error_is_left_as_torchx_shows_it(tmp_path: Path) -> None:
    """Only the plugin's errors (and malformed handles) are cut to one line."""
    out = torchx_fails(tmp_path, "list", "-s", "local_cwd")
    assert "Traceback" in out and out.rstrip().endswith(
        "App handles cannot be listed for local scheduler as they are not persisted by torchx"
    )


def test_the_python_api_still_raises_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside TorchX's CLI the errors are exceptions a program catches, never an exit."""
    from torchx.runner import get_runner

    from airflow_provider_torchx.core.errors import SchedulerSetupError

    for key in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    with get_runner() as runner, pytest.raises(SchedulerSetupError, match="no region is configured"):
        runner.status("aws_batch://torchx/q:job-1")


def test_an_unknown_job_is_torchx_s_one_line(tmp_path: Path, moto_without_docker: MotoServer) -> None:
    """A job its queue does not hold: ``status`` says so in TorchX's own line."""
    with moto_settings(moto_without_docker):
        queue = create_job_queue("torchx-cli-unknown-job")
        out = torchx_fails(tmp_path, "status", f"aws_batch://torchx/{queue}:job-1", env=dict(os.environ))
    assert error_line(out) == (
        f"AppDef `{queue}:job-1` does not exist or has been removed from `aws_batch`'s data plane"
    )
