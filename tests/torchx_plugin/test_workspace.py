"""Workspaces through the plugin (TorchX's ``WorkspaceMixin``): built into an image only with
``image_repo`` (TorchX's CLI hands every run the current directory), one build per image and
workspace, several directories merged into one; and end to end: built, pushed to the loopback
registry and run on the moto server."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from torchx import specs as tx
from torchx.specs.finder import ComponentValidationException

from airflow_provider_torchx.core.specs import Role
from airflow_provider_torchx.torchx_plugin.scheduler import BatchPluginScheduler, create_scheduler

IMAGE = "busybox:local"


class Builds:
    """Stands in for the core's Docker build: records what it was asked to build."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, list[str]]] = []

    def __call__(self, role: Role, cfg: Any) -> str:
        assert role.workspace
        files = sorted(p.relative_to(role.workspace).as_posix() for p in Path(role.workspace).rglob("*"))
        self.calls.append((role.image, role.workspace, files))
        return f"sha256:{len(self.calls):064d}"


@pytest.fixture
def sched(monkeypatch: pytest.MonkeyPatch) -> tuple[BatchPluginScheduler, Builds]:
    s = create_scheduler("t")
    builds = Builds()
    monkeypatch.setattr(s.batch, "build_workspace_image", builds)
    return s, builds


def roles(workspace: tx.Workspace) -> list[tx.Role]:
    res = tx.Resource(cpu=1, gpu=0, memMB=64)
    return [tx.Role(name, IMAGE, entrypoint="x", workspace=workspace, resource=res) for name in ("a", "b")]


def test_without_image_repo_nothing_is_built_and_the_image_runs_as_is(
    sched: tuple[BatchPluginScheduler, Builds], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    s, builds = sched
    app_roles = roles(tx.Workspace.from_str(str(tmp_path)))
    with caplog.at_level(logging.INFO):
        s.build_workspaces(app_roles, s.run_opts().resolve({"queue": "q"}))
    assert builds.calls == [] and [r.image for r in app_roles] == [IMAGE, IMAGE]
    assert "built only with the run option image_repo" in caplog.text


def test_roles_sharing_an_image_and_a_workspace_share_one_build_pushed_to_image_repo(
    sched: tuple[BatchPluginScheduler, Builds], tmp_path: Path
) -> None:
    s, builds = sched
    (tmp_path / "train.py").write_text("print('hi')\n")
    cfg = s.run_opts().resolve({"queue": "q", "image_repo": "registry.example/ml"})
    app = tx.AppDef("ws", roles=roles(tx.Workspace.from_str(str(tmp_path))))
    s.build_workspaces(app.roles, cfg)
    assert builds.calls == [(IMAGE, str(tmp_path), ["train.py"])]
    built = "sha256:" + "0" * 63 + "1"
    assert [r.image for r in app.roles] == [built, built]
    job = s.submit_dryrun(app, cfg).request
    assert job.images_to_push == {built: ("registry.example/ml", built.removeprefix("sha256:"))}
    ranges = job.job_def["nodeProperties"]["nodeRangeProperties"]
    assert [r["container"]["image"] for r in ranges] == [f"registry.example/ml:{'0' * 63}1"] * 2


def test_a_workspace_of_several_directories_is_built_merged(
    sched: tuple[BatchPluginScheduler, Builds], tmp_path: Path
) -> None:
    s, builds = sched
    for name in ("lib", "app"):
        (tmp_path / name).mkdir()
        (tmp_path / name / f"{name}.py").write_text("")
    workspace = tx.Workspace(projects={str(tmp_path / "lib"): "lib", str(tmp_path / "app"): ""})
    s.build_workspaces(roles(workspace)[:1], s.run_opts().resolve({"queue": "q", "image_repo": "r"}))
    ((image, _, files),) = builds.calls
    assert (image, files) == (IMAGE, ["app.py", "lib", "lib/lib.py"])


def test_bad_input_fails_naming_the_field_before_any_build(
    sched: tuple[BatchPluginScheduler, Builds], tmp_path: Path
) -> None:
    from torchx.runner import Runner

    s, builds = sched
    role = roles(tx.Workspace.from_str(str(tmp_path)))[0]
    role.resource = tx.Resource(cpu=0, gpu=0, memMB=64)
    bad = r"roles\[0\]\.resource\.cpu: role 'a' asks for 0 vCPUs"
    refused = pytest.raises(ComponentValidationException, match=bad)  # TorchX's: its CLI prints it as one line
    with Runner("t", {"aws_batch": lambda session_name, **kw: s}) as runner, refused:
        runner.dryrun(tx.AppDef("bad", roles=[role]), "aws_batch", {"queue": "q", "image_repo": "r"})
    assert builds.calls == []


@pytest.mark.docker
@pytest.mark.timeout(120)
def test_torchx_run_builds_the_workspace_pushes_it_and_runs_it(
    batch_queue: str, image_registry: str, tmp_path: Path
) -> None:
    import docker

    (tmp_path / "hello.txt").write_text("hello from the workspace\n")
    repo = f"{image_registry}/torchx-plugin-ws"
    torchx = str(Path(sys.executable).parent / "torchx")
    cfg = f"queue={batch_queue},image_repo={repo},quiet=True"
    cmd = [torchx, "run", "-s", "aws_batch", "-cfg", cfg, "--workspace", str(tmp_path), "--wait"]
    proc = subprocess.run(
        [*cmd, "utils.sh", "--image", IMAGE, "cat", "/hello.txt"], capture_output=True, text=True, timeout=90
    )
    assert proc.returncode == 0, proc.stderr
    handle = proc.stdout.strip().splitlines()[0]
    logs = subprocess.run([torchx, "log", handle], capture_output=True, text=True, timeout=60, check=True).stdout
    client = docker.from_env()
    tags: list[str] = []
    try:
        tags = [t for image in client.images.list(name=repo) for t in image.tags]
        assert len(tags) == 1, tags  # built once, tagged for the push
        with urllib.request.urlopen(f"http://{image_registry}/v2/torchx-plugin-ws/tags/list", timeout=10) as resp:
            assert tags[0].rsplit(":", 1)[1] in json.load(resp)["tags"]  # and pushed
        assert logs.splitlines() == ["sh/0 hello from the workspace"]
    finally:
        for tag in tags:
            client.images.remove(tag, force=True)
        client.close()
