"""Cursor files: where a watcher's reading of one job's logs stands, kept on disk.

A watcher that copies a job's log lines somewhere (the Airflow trigger, a task waiting in its
worker) saves its per-replica log cursors after each batch it wrote, so that whoever watches
the job next (a restarted triggerer, a retried task) goes on from there instead of repeating
lines. There is one file per task instance (``TaskIdentity``, not a try) and job.

Rules:

- Each save carries a sequence number one higher than the position it continues; a reader
  takes the highest-numbered position it has (``newest``): a trigger's kwargs, an event, the
  file. Writes are atomic (temp file + rename), so a reader sees a whole old or a whole new
  position, never a torn one.
- ``reported``: a try of the task instance finished successfully with this job. A retry adopts
  a SUCCEEDED job only when its file exists and says it was not reported.
- Where: in the scheduler's ``sidecar_dir`` (beside a local job, in its store), else under
  the host's state dir (``<state dir>/airflow-cursors/<backend>/``). Never a file a scheduler
  writes.

No Airflow imports: the core may use it too.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from airflow_provider_torchx.core.identity import TaskIdentity
from airflow_provider_torchx.core.safefiles import read_json
from airflow_provider_torchx.core.specs import parse_app_handle
from airflow_provider_torchx.core.statedir import default_state_dir

log = logging.getLogger(__name__)

#: The directory under the state dir that holds cursor files of jobs without a sidecar dir.
CURSOR_DIR = "airflow-cursors"
_FORMAT = 1


@dataclass(frozen=True)
class LogPosition:
    """A watcher's reading of one job's logs: ``cursors`` (``{"role/k": cursor}``), the
    sequence number ``seq`` of the save that wrote them (0: nothing saved yet) and whether a
    try ``reported`` the job's success."""

    seq: int = 0
    cursors: dict[str, str] = field(default_factory=dict)
    reported: bool = False

    def advanced(self, cursors: Mapping[str, str]) -> LogPosition:
        """The next position: ``cursors`` under the next sequence number."""
        return replace(self, seq=self.seq + 1, cursors=dict(cursors))


def newest(*positions: LogPosition | None) -> LogPosition:
    """The highest-numbered of ``positions`` (the first of equals); an empty position if none."""
    found = [p for p in positions if p is not None]
    return max(found, key=lambda p: p.seq) if found else LogPosition()


def identity_key(identity: TaskIdentity) -> str:
    """A short, stable file-name key for a task instance (from its identity labels)."""
    canonical = json.dumps(sorted(identity.labels().items()))
    return hashlib.sha256(canonical.encode()).hexdigest()[:20]


def _make_private_dirs(directory: Path) -> None:
    """Create ``directory`` and its missing parents, each owner-only."""
    missing = []
    while not directory.is_dir():
        missing.append(directory)
        directory = directory.parent
    for d in reversed(missing):
        d.mkdir(mode=0o700, exist_ok=True)


class CursorFile:
    """The cursor file of task instance ``identity`` for job ``app_handle`` at ``path``.

    ``create_dir=False`` (a job's sidecar dir): a missing directory means the job was deleted,
    and is not created again."""

    def __init__(self, path: Path, app_handle: str, identity: TaskIdentity, *, create_dir: bool = True) -> None:
        self.path = path
        self.app_handle = app_handle
        self.identity = identity
        self.create_dir = create_dir

    @classmethod
    def locate(
        cls,
        app_handle: str,
        identity: TaskIdentity,
        sidecar_dir: Path | None,
        state_dir: str | os.PathLike[str] | None = None,
    ) -> CursorFile:
        """The file for ``app_handle`` and ``identity``: in ``sidecar_dir`` when the scheduler
        gives one, else under ``state_dir`` (default: the host's state dir)."""
        parsed = parse_app_handle(app_handle)
        key = identity_key(identity)
        if sidecar_dir is not None:
            return cls(Path(sidecar_dir) / f"airflow-cursor.{key}.json", app_handle, identity, create_dir=False)
        base = Path(state_dir) if state_dir is not None else Path(default_state_dir())
        return cls(base / CURSOR_DIR / parsed.scheduler_backend / f"{parsed.app_id}.{key}.json", app_handle, identity)

    @staticmethod
    def handles_in_state_dir(
        identity: TaskIdentity, backend: str, state_dir: str | os.PathLike[str] | None = None
    ) -> list[str]:
        """The handles of the ``backend`` jobs whose cursor files for task instance ``identity``
        are under ``state_dir`` (default: the host's): jobs without a sidecar dir, and jobs
        whose directory was refused when their watcher stopped them (``watch.py``,
        ``refused_event``), which nothing else names once their labels cannot be read. A
        file that is unreadable, or whose name, job or identity do not agree, is skipped."""
        base = (Path(state_dir) if state_dir is not None else Path(default_state_dir())) / CURSOR_DIR / backend
        suffix = f".{identity_key(identity)}.json"
        found = []
        for path in sorted(base.glob(f"*{suffix}")):
            try:
                data = read_json(path, base)
                handle = data["app_handle"]
                parsed = parse_app_handle(handle)
            except (OSError, ValueError, KeyError, TypeError):
                continue
            named = (parsed.scheduler_backend, parsed.app_id + suffix) == (backend, path.name)
            if named and data.get("identity") == identity.labels():
                found.append(handle)
        return found

    def load(self) -> LogPosition | None:
        """The saved position, or None when there is none (no file, unreadable, one for
        another job, or not a regular file: a symbolic link's target or a FIFO is never read,
        so a swapped file can neither leak another file nor hold the reader)."""
        try:
            data = read_json(self.path, self.path.parent)
            if data is None:
                return None
            if data.get("app_handle") != self.app_handle:
                log.warning("ignoring cursor file %s: it is for %s", self.path, data.get("app_handle"))
                return None
            cursors = data["cursors"]
            if not isinstance(cursors, dict):
                raise TypeError(f"cursors is a {type(cursors).__name__}")
            return LogPosition(
                seq=int(data["seq"]),
                cursors={str(k): str(v) for k, v in cursors.items()},
                reported=bool(data.get("reported", False)),
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            log.warning("ignoring unreadable cursor file %s: %s", self.path, e)
            return None

    def save(self, position: LogPosition) -> bool:
        """Write ``position`` atomically (owner-only). Best effort: on failure (a deleted job's
        sidecar dir, a full disk) log a warning and return False; a later watcher may then
        repeat lines, never miss them."""
        record: dict[str, Any] = {
            "format": _FORMAT,
            "app_handle": self.app_handle,
            "identity": self.identity.labels(),
            "seq": position.seq,
            "cursors": position.cursors,
            "reported": position.reported,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "time": time.time(),
        }
        directory = self.path.parent
        try:
            if self.create_dir:
                _make_private_dirs(directory)
            # A unique temp name: several threads of one process may save the same file.
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{self.path.name}.", suffix=".tmp")
            try:
                with os.fdopen(fd, "w") as f:
                    f.write(json.dumps(record, separators=(",", ":")))
                os.replace(tmp, self.path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as e:
            log.warning("could not save log position #%d of %s to %s: %s", position.seq, self.app_handle, self.path, e)
            return False
        return True

    def mark_reported(self, position: LogPosition | None = None) -> LogPosition:
        """Record that a try reported the job's success (going on from the newest of
        ``position`` and the file); return the saved position."""
        current = newest(self.load(), position)
        saved = replace(current, seq=current.seq + 1, reported=True)
        self.save(saved)
        return saved

    def __repr__(self) -> str:
        return f"CursorFile({str(self.path)!r})"
