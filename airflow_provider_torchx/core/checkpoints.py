"""Where a task instance's job checkpoints, and which attempt of its work a replica is.

Every replica of a job an Airflow task submits gets two variables (docs/checkpoints.md):

- ``TORCHX_CHECKPOINT_DIR``: the task instance's checkpoint location, ``checkpoint_dir(root,
  identity)``: ``<root>/<dag_id>/<run_id>/<task_id>`` (``/<map_index>`` added for a mapped
  task). It is built from the task instance's identity only (``core/identity.py``, never the
  try number), so every try of one task instance and every attempt its scheduler makes get the
  same one, and another DAG run, task or map index gets another. Each part is percent-encoded
  (``[A-Za-z0-9._~-]`` kept), so no part can climb out of the root or run into another; a part
  longer than a file name may be (``MAX_PART``) keeps a readable prefix and ends with ``+`` and
  a hash of the whole (``+`` never survives the encoding, so it cannot meet another part).
- ``TORCHX_ATTEMPT``: 0 for the first attempt of the task instance's work, +1 for each later
  one. The job is submitted with the number of attempts its task instance's earlier jobs made
  (``attempt_offset``); the local supervisor adds its own restarts of the replica; on AWS
  Batch the container adds ``AWS_BATCH_JOB_ATTEMPT - 1`` itself (``attempt_in_container``,
  spelled out in the docs for scripts that do not import this package).

The root comes from the first of: the operator's ``checkpoint_root``, the connection's extra
``checkpoint_root``, ``[torchx] checkpoint_root``; else the scheduler's default (local: a
``checkpoints/`` directory beside the job store; AWS Batch: none, so no variable is set).
Standard library only: the core never imports Airflow.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING
from urllib.parse import quote

from airflow_provider_torchx.core.errors import InvalidRunConfigError
from airflow_provider_torchx.core.identity import TaskIdentity

if TYPE_CHECKING:
    from airflow_provider_torchx.core.checkpoint_prune import Use as CheckpointUse
from airflow_provider_torchx.core.safefiles import makedirs_private
from airflow_provider_torchx.core.specs import AppDef

#: Every replica's checkpoint location (a local path, a mounted path or a URI such as s3://).
CHECKPOINT_DIR_ENV = "TORCHX_CHECKPOINT_DIR"
#: Every replica's attempt number (0: the first attempt of the task instance's work).
ATTEMPT_ENV = "TORCHX_ATTEMPT"
#: What AWS Batch sets in the container: 1 for a job's first attempt.
BATCH_ATTEMPT_ENV = "AWS_BATCH_JOB_ATTEMPT"
#: The XCom key the task pushes its checkpoint location under.
XCOM_KEY = "checkpoint_dir"
#: The local job store's default root, a directory beside the store.
LOCAL_ROOT_NAME = "checkpoints"
#: The longest part of a location kept whole: a file name's limit (bytes; an encoded part is ASCII).
MAX_PART = 255
#: What a longer part keeps of its encoded text, before ``+`` and ``_HASH_CHARS`` of its hash.
_PREFIX = 200
_HASH_CHARS = 24
#: What a location set aside is renamed to: ``<location>+set-aside-<UTC time>`` (``+`` never
#: survives the encoding, so the name is no task instance's location).
SET_ASIDE = "+set-aside-"

_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/]")


def is_uri(location: str) -> bool:
    """Whether ``location`` is a URI with a host part (``s3://bucket/...``)."""
    return bool(_URI.match(location))


def check_root(root: str, source: str) -> str:
    """``root`` if it is an absolute path or a URI (``s3://bucket/prefix``), without a trailing
    ``/``; else ``InvalidRunConfigError`` naming ``source`` (where the root was set) and the value."""
    if not isinstance(root, str) or not root.strip():
        raise InvalidRunConfigError(
            f"{source}: {root!r} is not allowed; give an absolute path (/mnt/ckpt) or a URI (s3://bucket/prefix)"
        )
    if not (is_uri(root) or posixpath.isabs(root)):
        raise InvalidRunConfigError(
            f"{source}: {root!r} is neither an absolute path nor a URI; give an absolute path (/mnt/ckpt) "
            "or a URI (s3://bucket/prefix)"
        )
    stripped = root.rstrip("/")
    return stripped or "/"


def resolve_root(candidates: Sequence[tuple[str, str | None]], default: str | None) -> str | None:
    """The checkpoint root: the first set ``(source, value)`` of ``candidates`` (in precedence
    order: operator, connection, config), checked with ``check_root``; else ``default`` (the
    scheduler's; None: no root, no variable)."""
    for source, value in candidates:
        if value is not None and value != "":
            return check_root(value, source)
    return default


def _part(text: str) -> str:
    """One path part: percent-encoded, ``.``/``..`` spelled out, never empty; over
    ``MAX_PART`` bytes, its first ``_PREFIX`` (never half an escape), ``+`` and a hash of
    ``text``."""
    encoded = quote(text, safe="-_.~") or "%00"
    encoded = encoded.replace(".", "%2E") if set(encoded) == {"."} else encoded
    if len(encoded) <= MAX_PART:
        return encoded
    head = encoded[:_PREFIX]
    escape = head.find("%", _PREFIX - 2)
    head = head[:escape] if escape >= 0 else head
    return f"{head}+{hashlib.sha256(text.encode()).hexdigest()[:_HASH_CHARS]}"


def location_parts(identity: TaskIdentity) -> list[str]:
    """The parts of the checkpoint location of ``identity`` below its root, as encoded."""
    parts = [identity.dag_id, identity.run_id, identity.task_id]
    if identity.map_index >= 0:
        parts.append(str(identity.map_index))
    return [_part(p) for p in parts]


def checkpoint_dir(root: str, identity: TaskIdentity) -> str:
    """The checkpoint location of the task instance ``identity`` under ``root`` (see the module
    docstring): the same for every try, different per DAG run, task and map index."""
    return posixpath.join(root, *location_parts(identity))


def attempt_offset(try_number: int, earlier_attempts: Iterable[int]) -> int:
    """``TORCHX_ATTEMPT`` of a new job's first attempt: the attempts the task instance's earlier
    jobs made (``earlier_attempts``: one count per job, each its restarts + 1), and never less
    than the earlier tries (``try_number - 1``: an earlier job may have been removed)."""
    return max(try_number - 1, sum(max(n, 1) for n in earlier_attempts), 0)


def attempt_in_container(env: Mapping[str, str]) -> int:
    """The attempt number as a replica computes it from its environment: ``TORCHX_ATTEMPT``
    plus the AWS Batch attempts before this one (``AWS_BATCH_JOB_ATTEMPT``, 1 for the first)."""
    base = int(env.get(ATTEMPT_ENV) or 0)
    batch = int(env.get(BATCH_ATTEMPT_ENV) or 1)
    return base + max(batch - 1, 0)


def set_env(app: AppDef, location: str | None, attempt: int) -> None:
    """Give every role of ``app`` the checkpoint location (if any) and the attempt number."""
    for role in app.roles:
        if location is not None:
            role.env[CHECKPOINT_DIR_ENV] = location
        role.env[ATTEMPT_ENV] = str(attempt)


def app_checkpoint_dir(roles: Iterable[object]) -> str | None:
    """The checkpoint location a job's roles carry in their env (None: none)."""
    for role in roles:
        env = getattr(role, "env", None) or {}
        if env.get(CHECKPOINT_DIR_ENV):
            return str(env[CHECKPOINT_DIR_ENV])
    return None


def check_mounted_location(location: str, app: AppDef) -> None:
    """A checkpoint location for jobs that do not see this host's paths (AWS Batch's
    containers) must be a URI (``s3://``) or a path under a mount of every role (an EFS or host
    volume): a local path of the submitting host is not there. ``InvalidRunConfigError``
    naming the value otherwise."""
    if is_uri(location):
        return
    for role in app.roles:
        mounted = [getattr(m, "dst_path", "") for m in role.mounts]
        if not any(d and (location == d.rstrip("/") or location.startswith(d.rstrip("/") + "/")) for d in mounted):
            raise InvalidRunConfigError(
                f"checkpoint_root: {location!r} is a local path that role {role.name!r} does not mount "
                f"(its mounts: {', '.join(d for d in mounted if d) or 'none'}); the scheduler runs jobs on other "
                "hosts: use a URI (s3://) or a path under a mount (an EFS or host volume) of every role"
            )


def place(app: AppDef, location: str | None, attempt: int, *, host_paths: bool, create: bool = True) -> None:
    """Give ``app``'s roles the checkpoint ``location`` and ``attempt`` (``set_env``), after
    checking the location suits the scheduler: where the jobs do not see this host's paths
    (``SchedulerCapabilities.host_paths`` false: AWS Batch) a path must be mounted
    (``check_mounted_location``); where they do (this host, a cluster's shared file systems),
    the directories above a path are created owner-only (``create``). The location itself is
    left to the job, which creates it when it first saves: a job that never checkpoints leaves
    no empty directory behind."""
    if location is not None:
        if not host_paths:
            check_mounted_location(location, app)
        elif create and not is_uri(location):
            makedirs_private(posixpath.dirname(location))
    set_env(app, location, attempt)


class CheckpointsInUseError(RuntimeError):
    """A location a job that has not ended still uses is not set aside (``set_aside_unused``)."""


def set_aside_unused(location: str, now: float, uses: Iterable[CheckpointUse]) -> str | None:
    """``set_aside`` unless one of the jobs that use ``location`` (``uses``:
    ``Runner.checkpoint_uses``) has not ended (``CheckpointsInUseError`` naming them; nothing
    is moved): what ``airflow-torchx set-aside`` and the UI's "Start over" do."""
    live = [use.app_id for use in uses if not use.ended]
    if live:
        raise CheckpointsInUseError(
            f"job(s) {', '.join(live)} still use {location}: cancel them first (nothing was moved)"
        )
    return set_aside(location, now)


def set_aside(location: str, now: float) -> str | None:
    """Rename the local checkpoint ``location`` to ``<location>+set-aside-<UTC time of now>``
    beside it (kept whole, never deleted), so the task instance's next job starts over; the
    new path, or None when nothing is there. ``InvalidRunConfigError`` for a URI: its owner's
    tools move it."""
    if is_uri(location):
        raise InvalidRunConfigError(
            f"{location!r} is not a local path: move what is under it with its own tools (aws s3 mv ...)"
        )
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f".{int(now * 1e6) % 1_000_000:06d}Z"
    target = f"{location}{SET_ASIDE}{stamp}"
    try:
        os.rename(location, target)
    except FileNotFoundError:
        return None
    return target
