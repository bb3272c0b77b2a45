"""Building a role's workspace into a container image (Docker) and pushing it to a repository.

A workspace is a local directory (``/path`` or ``file:///path``). Its files are copied on top
of the role's image: by the workspace's own ``Dockerfile.torchx`` (which receives the base image
as build argument ``IMAGE``) or else by ``FROM $IMAGE`` + ``COPY . .``. The result is a local
image id (``sha256:...``); remote schedulers push it to their ``image_repo`` tagged with its
digest, so equal builds share one tag.

``docker`` is imported lazily: importing this module costs nothing.
"""

from __future__ import annotations

import io
import logging
import tarfile
from pathlib import Path
from typing import Any

from airflow_provider_torchx.core.errors import InvalidSpecError, SchedulerSetupError

log = logging.getLogger(__name__)

DOCKERFILE = "Dockerfile.torchx"
_DEFAULT_DOCKERFILE = "ARG IMAGE\nFROM $IMAGE\nCOPY . .\n"
LOCAL_IMAGE_PREFIX = "sha256:"


class WorkspaceBuildError(RuntimeError):
    """Docker could not build or push a workspace image (the message has Docker's reason)."""


def docker_client() -> Any:
    """A Docker client from the environment (``DOCKER_HOST`` ...); no engine there raises
    ``SchedulerSetupError`` saying so, not Docker's connection error."""
    import docker.errors

    try:
        return docker.from_env()
    except docker.errors.DockerException as err:
        raise SchedulerSetupError(
            f"Docker: no engine to build the workspace image ({err}): start Docker or set DOCKER_HOST"
        ) from err


def workspace_dir(workspace: str) -> Path:
    """The directory of ``workspace`` (``/path`` or ``file:///path``); it must exist."""
    path = Path(workspace.removeprefix("file://"))
    if not path.is_dir():
        raise InvalidSpecError(f"workspace: {workspace!r} is not an existing directory (use /path or file:///path)")
    return path


def _context(path: Path) -> io.BytesIO:
    """The build context: the workspace's files plus the default Dockerfile if it has none."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(str(path), arcname=".")
        if not (path / DOCKERFILE).exists():
            data = _DEFAULT_DOCKERFILE.encode()
            info = tarfile.TarInfo(DOCKERFILE)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return buf


def build_image(client: Any, base_image: str, workspace: str, quiet: bool = False) -> str:
    """Build ``workspace`` on top of ``base_image``; return the new local image id."""
    path = workspace_dir(workspace)
    image_id = ""
    log.info("building workspace %s on %s", path, base_image)
    for chunk in client.api.build(
        fileobj=_context(path),
        custom_context=True,
        dockerfile=DOCKERFILE,
        buildargs={"IMAGE": base_image},
        pull=False,
        rm=True,
        forcerm=True,
        decode=True,
    ):
        if "error" in chunk:
            raise WorkspaceBuildError(f"workspace: building {path} on {base_image} failed: {chunk['error'].strip()}")
        if chunk.get("stream") and not quiet:
            log.info("docker build: %s", chunk["stream"].rstrip())
        image_id = chunk.get("aux", {}).get("ID", image_id)
    if not image_id.startswith(LOCAL_IMAGE_PREFIX):
        raise WorkspaceBuildError(f"workspace: building {path} gave no image id")
    return image_id


def is_local_image(image: str) -> bool:
    """Whether ``image`` is a local build (an image id) that must be pushed to be run remotely."""
    return image.startswith(LOCAL_IMAGE_PREFIX)


def push_target(image_id: str, image_repo: str) -> tuple[str, str]:
    """``(repository, tag)`` a local image is pushed as: tagged with its digest."""
    return image_repo, image_id.removeprefix(LOCAL_IMAGE_PREFIX)


def push_image(client: Any, image_id: str, repo: str, tag: str, quiet: bool = False) -> str:
    """Tag ``image_id`` as ``repo:tag`` and push it; return ``repo:tag``."""
    client.images.get(image_id).tag(repo, tag)
    for chunk in client.api.push(repo, tag=tag, stream=True, decode=True):
        if "error" in chunk:
            raise WorkspaceBuildError(f"image_repo: pushing {repo}:{tag} failed: {chunk['error'].strip()}")
        if chunk.get("status") and not quiet:
            log.debug("docker push: %s %s", chunk.get("id", ""), chunk["status"])
    log.info("pushed %s as %s:%s", image_id, repo, tag)
    return f"{repo}:{tag}"
