"""Workspace images built by the real Docker engine (``core/workspace.py``); pushing and running
them on Batch is in ``test_integration.py``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_torchx.core.errors import InvalidSpecError, SchedulerSetupError
from airflow_provider_torchx.core.workspace import (
    WorkspaceBuildError,
    build_image,
    push_target,
    workspace_dir,
)
from airflow_provider_torchx.core.workspace import (
    docker_client as engine_client,
)


@pytest.fixture
def docker_client(docker_engine: str) -> Iterator[Any]:
    import docker

    client = docker.DockerClient(base_url=docker_engine)
    yield client
    client.close()


def run(client: Any, image: str, *cmd: str) -> str:
    out = client.containers.run(image, list(cmd), network_mode="none", remove=True)
    return out.decode() if isinstance(out, bytes) else str(out)


def test_no_docker_engine_is_a_setup_error_saying_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    with pytest.raises(
        SchedulerSetupError,
        match=r"^Docker: no engine to build the workspace image \(.*\): start Docker or set DOCKER_HOST$",
    ):
        engine_client()


def test_workspace_must_be_a_directory(tmp_path: Path) -> None:
    with pytest.raises(InvalidSpecError, match=r"workspace: '/no/such/dir' is not an existing directory"):
        workspace_dir("/no/such/dir")
    assert workspace_dir(f"file://{tmp_path}") == tmp_path
    assert push_target("sha256:abc", "reg/repo") == ("reg/repo", "abc")


@pytest.mark.docker
def test_default_and_custom_dockerfiles(docker_client: Any, tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "data.txt").write_text("plain workspace\n")
    custom = tmp_path / "custom"
    custom.mkdir()
    (custom / "data.txt").write_text("custom workspace\n")
    (custom / "Dockerfile.torchx").write_text("ARG IMAGE\nFROM $IMAGE\nCOPY data.txt /opt/moved.txt\n")
    built = []
    try:
        built.append(build_image(docker_client, "busybox:local", str(plain), quiet=True))
        assert run(docker_client, built[-1], "cat", "/data.txt") == "plain workspace\n"
        built.append(build_image(docker_client, "busybox:local", f"file://{custom}"))
        assert run(docker_client, built[-1], "cat", "/opt/moved.txt") == "custom workspace\n"
        assert built[0] != built[1]
    finally:
        for image in built:
            docker_client.images.remove(image, force=True)


@pytest.mark.docker
def test_build_errors_carry_dockers_reason(docker_client: Any, tmp_path: Path) -> None:
    (tmp_path / "Dockerfile.torchx").write_text("ARG IMAGE\nFROM $IMAGE\nCOPY missing.txt /x\n")
    with pytest.raises(WorkspaceBuildError, match=r"workspace: building .* on busybox:local failed: .*missing.txt"):
        build_image(docker_client, "busybox:local", str(tmp_path), quiet=True)
