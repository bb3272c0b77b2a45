"""AWS setup errors: every CLI subcommand that talks to AWS says in one line what to set and
exits 3, without a traceback, for no region, no credentials and an unknown queue (a moto
server without Docker, over HTTP on loopback); the ``region``/``profile`` run options; the
botocore errors a host's setup causes, translated (``setup_errors.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

from airflow_provider_torchx.core.errors import SchedulerSetupError
from airflow_provider_torchx.core.schedulers.aws_batch.setup_errors import setup_error
from tests.fixtures.aws import FAKE_CREDS, REGION, MotoServer

CLI = str(Path(sys.executable).with_name("airflow-torchx"))
HANDLE = "aws_batch://torchx/nope:job1"
#: Every subcommand that talks to AWS (``dryrun`` and ``runopts`` do not).
SUBCOMMANDS = [
    ["run", "-s", "aws_batch", "-cfg", "queue=nope", "utils.echo", "--image", "busybox"],
    ["list", "-s", "aws_batch", "-cfg", "queue=nope"],
    ["status", HANDLE],
    ["describe", HANDLE],
    ["log", HANDLE],
    ["cancel", HANDLE],
    ["delete", HANDLE],
]


def _env(tmp_path: Path, **values: str | None) -> dict[str, str]:
    """This process's environment without any AWS setting, then ``values`` (None: unset)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_CONFIG_FILE=str(tmp_path / "no-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "no-credentials"),
        AWS_EC2_METADATA_DISABLED="true",  # no instance metadata service to wait for
        TORCHX_STATE_DIR=str(tmp_path / "state"),
    )
    env.update({k: v for k, v in values.items() if v is not None})
    return env


def _one_line_exit_3(args: list[str], env: dict[str, str], expected: str) -> None:
    proc = subprocess.run([CLI, *args], env=env, capture_output=True, text=True, timeout=120)
    where = f"{args}: exit {proc.returncode}\n{proc.stderr}"
    assert proc.returncode == 3, where
    assert "Traceback" not in proc.stderr + proc.stdout, where
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("airflow-torchx: error: ") and expected in lines[0], where


def test_no_region_no_credentials_and_an_unknown_queue_are_one_line_exit_3(
    tmp_path: Path, moto_without_docker: MotoServer
) -> None:
    cases = [
        (_env(tmp_path), "no region is configured: set AWS_DEFAULT_REGION"),
        (_env(tmp_path, AWS_DEFAULT_REGION=REGION), "no usable credentials"),
        (
            _env(tmp_path, AWS_DEFAULT_REGION=REGION, AWS_ENDPOINT_URL=moto_without_docker.url, **FAKE_CREDS),
            "queue='nope' does not exist in us-east-1",
        ),
    ]
    with ThreadPoolExecutor(4) as pool:  # 21 CLI processes: start-up dominates
        runs = [pool.submit(_one_line_exit_3, args, env, expected) for args in SUBCOMMANDS for env, expected in cases]
        for run in runs:
            run.result()


def test_the_region_and_profile_run_options(tmp_path: Path, moto_without_docker: MotoServer) -> None:
    # region= stands in for AWS_DEFAULT_REGION: the next missing piece is the credentials
    _one_line_exit_3(["list", "-s", "aws_batch", "-cfg", f"queue=q,region={REGION}"], _env(tmp_path), "credentials")
    _one_line_exit_3(
        ["list", "-s", "aws_batch", "-cfg", "queue=q,profile=nobody"], _env(tmp_path), "profile (nobody) could not"
    )
    (tmp_path / "no-config").write_text(f"[profile moto]\nregion = {REGION}\n")
    creds = "".join(f"{k.lower()} = {v}\n" for k, v in FAKE_CREDS.items() if k != "AWS_SESSION_TOKEN")
    (tmp_path / "no-credentials").write_text(f"[moto]\n{creds}")
    proc = subprocess.run(
        [CLI, "list", "-s", "aws_batch", "-cfg", "profile=moto"],
        env=_env(tmp_path, AWS_ENDPOINT_URL=moto_without_docker.url),
        capture_output=True,
        text=True,
        timeout=120,
    )
    # The listing itself worked (the session's moto server may hold other tests' jobs).
    assert proc.returncode == 0 and proc.stderr.strip() in ("", "no jobs on aws_batch"), proc.stderr


def _client_error(code: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "not for you"}}, "DescribeJobs")


@pytest.mark.parametrize(
    ("err", "expected", "transient"),
    [
        (NoCredentialsError(), "no usable credentials", False),
        (
            _client_error("ExpiredTokenException"),
            "the credentials expired (ExpiredTokenException on DescribeJobs)",
            True,
        ),
        (_client_error("UnrecognizedClientException"), "the credentials were rejected", False),
        (
            _client_error("AccessDeniedException"),
            "access denied (AccessDeniedException on DescribeJobs: not for",
            False,
        ),
        (EndpointConnectionError(endpoint_url="http://127.0.0.1:9"), "cannot reach http://127.0.0.1:9", True),
    ],
    ids=["no-credentials", "expired", "rejected", "denied", "unreachable"],
)
def test_setup_errors_say_what_to_set(err: Exception, expected: str, transient: bool) -> None:
    got = setup_error(err)
    assert isinstance(got, SchedulerSetupError) and expected in str(got) and "\n" not in str(got)
    assert got.transient is transient


def test_other_errors_are_not_setup_errors() -> None:
    assert setup_error(_client_error("ThrottlingException")) is None
    assert setup_error(ValueError("x")) is None
