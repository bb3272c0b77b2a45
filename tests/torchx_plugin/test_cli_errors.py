"""What the ``torchx`` CLI prints when the plugin refuses: one line in TorchX's terms (TorchX's
"Invalid scheduler configuration" line, naming the option, the value and what it takes), no
traceback, no Airflow wording, nothing submitted. Each case runs the CLI in TorchX's venv (no
AWS endpoint is reached: every refusal comes before any call)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_status_without_a_region_ends_in_that_line_without_a_chained_traceback(tmp_path: Path) -> None:
    out = subprocess.run(
        [str(BIN / "torchx"), "status", "aws_batch://torchx/q:job-1"],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | {"AWS_CONFIG_FILE": "/nonexistent"},
    ).stderr
    last = out.strip().splitlines()[-1]
    assert last.endswith(
        "AWS: no region is configured: set AWS_DEFAULT_REGION, a profile with a region (AWS_PROFILE) or -cfg region="
    ), last
    assert "direct cause" not in out and "botocore" not in out and "Airflow" not in out
