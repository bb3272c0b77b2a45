"""The CLI's ``dryrun``, ``describe``, ``log`` and ``run --log`` mask a job's secrets (env values
of sensitive names, sensitive flags' values in its command; ``--show-secrets`` shows them); the
job store keeps them owner-only."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from airflow_provider_torchx.core import cli
from airflow_provider_torchx.core.masking import command_secrets, is_sensitive_key, mask_tree, redact
from airflow_provider_torchx.core.schedulers.local import LocalScheduler
from tests.core.local.helpers import sh_app, wait_done

SECRET = "hunter2-0123456789"
SHORT = "abc"  # masked by key only (too short to hunt for everywhere, as in Airflow)
ENV = f"WANDB_API_KEY={SECRET},DB_PASSWORD={SHORT},PLAIN_SETTING=visible-value"


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out + err


@pytest.mark.parametrize(
    ("name", "sensitive"),
    [
        ("WANDB_API_KEY", True),
        ("db-password", True),
        ("GITHUB_TOKEN", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("aws_access_key_id", True),
        ("HTTPS_PROXY", True),
        ("PATH", False),
        ("NCCL_DEBUG", False),
        ("MASTER_ADDR", False),
    ],
)
def test_the_sensitive_key_rule(name: str, sensitive: bool) -> None:
    assert is_sensitive_key(name) is sensitive


def test_masking_by_key_and_by_value() -> None:
    app = sh_app(f"echo {SECRET}", env={"API_TOKEN": SECRET, "PIN_PASSWORD": SHORT, "X": SHORT})
    masked = mask_tree(app)
    assert masked.roles[0].env == {"API_TOKEN": "***", "PIN_PASSWORD": "***", "X": SHORT}
    assert app.roles[0].env["API_TOKEN"] == SECRET  # the original is untouched
    assert redact(f"echo {SECRET} {SHORT}", [SECRET, SHORT]) == f"echo *** {SHORT}"


def test_cli_dryrun_masks_secrets_unless_asked(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run_cli(capsys, "dryrun", "utils.sh", "--env", ENV, "echo", SECRET)
    assert code == 0, out
    assert SECRET not in out and f"DB_PASSWORD={SHORT}" not in out and f'"{SHORT}"' not in out
    assert out.count("***") >= 5 and "visible-value" in out  # app env, request env and args
    code, out = run_cli(capsys, "dryrun", "--show-secrets", "utils.sh", "--env", ENV, "echo", "hi")
    assert code == 0 and SECRET in out and f"DB_PASSWORD={SHORT}" in out and f'"{SHORT}"' in out


def test_cli_describe_masks_and_the_store_is_owner_only(
    sched: LocalScheduler, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    app_id = sched.submit(sh_app("true", env={"WANDB_API_KEY": SECRET}))
    wait_done(sched, app_id)
    handle = f"local_cwd://test/{app_id}"
    code, out = run_cli(capsys, "describe", handle)
    assert code == 0 and SECRET not in out and "WANDB_API_KEY=***" in out, out
    code, out = run_cli(capsys, "describe", "--show-secrets", handle)
    assert code == 0 and f"WANDB_API_KEY={SECRET}" in out
    request = sched.job_dir(app_id) / "request.json"
    assert SECRET in request.read_text()  # kept, for the supervisor...
    for path in (request, request.parent, request.parent.parent):
        assert not path.stat().st_mode & 0o077, stat.filemode(path.stat().st_mode)  # ...owner-only


@pytest.mark.parametrize(
    ("command", "secrets"),
    [
        (["train", "--password", "pw-1", "--db-password=pw-2", "--api_key", "--lr", "0.1"], {"pw-1", "pw-2"}),
        (["sh", "-c", "HF_TOKEN=pw-3 python t.py --token 'pw 4' --secret=\"pw5\" && echo"], {"pw-3", "pw 4", "pw5"}),
        (["python", "t.py", "--db", "postgresql://user:pw-6@db:5432/x"], {"pw-6"}),
        (["python", "t.py", "--tokenizer", "bert-base", "--max_tokens", "512", "--no-password"], set()),
        (["sh", "-c", "echo secret things; export TOKENIZERS_PARALLELISM=false"], set()),
    ],
)
def test_the_secrets_of_a_command(command: list[str], secrets: set[str]) -> None:
    assert command_secrets(command) == secrets


def test_cli_log_and_describe_mask_the_jobs_secrets_unless_asked(capsys: pytest.CaptureFixture[str]) -> None:
    """A secret env value and a password in the command (as a connection's password templated
    into the arguments) are ``***`` in every log form and in ``describe``."""
    password = "conn-pass-98765"
    script = f'echo "token $WANDB_API_KEY"; echo login --password={password}'
    code, out = run_cli(capsys, "run", "--log", "utils.sh", "--env", ENV, script)
    assert code == 0, out
    handle = out.splitlines()[0]
    assert "[sh/0] token ***\n[sh/0] login --password=***\n" in out and SECRET not in out and password not in out
    for argv in (["log", handle], ["log", "--tail", handle], ["log", f"{handle}/sh/0"], ["describe", handle]):
        code, out = run_cli(capsys, *argv)
        assert code == 0 and "***" in out and SECRET not in out and password not in out, (argv, out)
        code, out = run_cli(capsys, *argv[:1], "--show-secrets", *argv[1:])
        assert code == 0 and password in out, (argv, out)
    code, out = run_cli(capsys, "describe", "--json", handle)
    assert code == 0 and password not in out and SECRET not in out and "--password=***" in out
    assert run_cli(capsys, "log", "--show-secrets", handle)[1].count(SECRET) == 1
