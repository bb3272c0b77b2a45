"""Image providers: where a role's "image" is on this host, its working directory and its
entrypoint (TorchX's semantics: ``local_cwd`` ignores the image and runs in the current
directory; ``local_dir`` takes the image as an absolute directory)."""

from __future__ import annotations

import abc
import os

from airflow_provider_torchx.core.errors import InvalidSpecError
from airflow_provider_torchx.core.runopts import Cfg
from airflow_provider_torchx.core.schedulers.local.request import ReplicaParam
from airflow_provider_torchx.core.specs import Role


class ImageProvider(abc.ABC):
    """Sets up a role's image on localhost (only the local scheduler needs this)."""

    @abc.abstractmethod
    def fetch(self, image: str) -> str:
        """Make ``image`` available; return its root directory on this host ("" if none)."""

    def fetch_role(self, role: Role) -> str:
        """``fetch(role.image)``; a provider may also adjust ``role`` (e.g. its env)."""
        return self.fetch(role.image)

    def get_cwd(self, image: str) -> str | None:
        """The working directory of the role's processes (None: the scheduler's own)."""
        return None

    def get_entrypoint(self, img_root: str, role: Role) -> str:
        """The program to run for ``role``."""
        return role.entrypoint

    def get_replica_param(
        self,
        img_root: str,
        role: Role,
        stdout: str | None = None,
        stderr: str | None = None,
        combined: str | None = None,
    ) -> ReplicaParam:
        """The ``Popen`` parameters of one replica of ``role`` (whose macros are already
        substituted); ``img_root`` is what ``fetch`` returned."""
        return ReplicaParam(
            args=[self.get_entrypoint(img_root, role), *role.args],
            env=dict(role.env),
            stdout=stdout,
            stderr=stderr,
            combined=combined,
            cwd=self.get_cwd(role.image),
        )


class CWDImageProvider(ImageProvider):
    """Ignores the image name and uses the current working directory as the image root.

    ``fetch("/tmp/foobar")`` and ``fetch("foobar:latest")`` both return ``os.getcwd()``.
    """

    def __init__(self, cfg: Cfg) -> None:
        self.cfg = cfg

    def fetch(self, image: str) -> str:
        return os.getcwd()

    def get_cwd(self, image: str) -> str | None:
        return os.getcwd()


class LocalDirectoryImageProvider(ImageProvider):
    """Takes the image name as an existing, absolute directory on this host; nothing is
    downloaded. The processes run in that directory and a relative entrypoint is resolved
    against it."""

    def __init__(self, cfg: Cfg) -> None:
        self.cfg = cfg

    def fetch(self, image: str) -> str:
        """Raises ``InvalidSpecError`` (a ``ValueError``) unless ``image`` is an absolute path
        to an existing directory."""
        if not isinstance(image, str) or not os.path.isabs(image):
            raise InvalidSpecError(
                f"role.image: {image!r} is not an absolute path; local_dir needs the absolute path of a directory"
            )
        if not os.path.isdir(image):
            raise InvalidSpecError(f"role.image: {image!r} does not exist or is not a directory (local_dir)")
        return image

    def get_cwd(self, image: str) -> str | None:
        return image

    def get_entrypoint(self, img_root: str, role: Role) -> str:
        return os.path.join(img_root, role.entrypoint)
