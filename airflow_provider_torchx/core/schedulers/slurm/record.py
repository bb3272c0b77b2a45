"""A Slurm job's record under its directory, ``<job_dir>/<job id>/`` (on a file system this
host and the nodes share): what lets a job be described after Slurm forgot it (without
accounting, ``MinJobAge`` after its end) and listed by its labels.

- ``job.json``: written by ``schedule`` once ``sbatch`` accepted the job: the app's name, roles
  (name, replicas, command, resources), labels, cfg, ``sbatch``'s options and when it was
  submitted; ``sbatch.sh``: the script it was given.
- ``started`` / ``ended``: the batch script's start and end (epoch seconds).
- ``<role>/<k>/host``, ``<role>/<k>/exit``: where and when replica ``k`` started (``<node>
  <epoch seconds>``), and its exit code and end (``<code> <epoch seconds>``), written by the
  replica's wrapper (``render.py``).
- ``cancel.json``: who asked for a cancel and why, written before ``scancel``.

This host also keeps an index, ``<state dir>/slurm/jobs/<job id>``, naming each job's
directory: written when this host submits or first sees a job, read for a job Slurm forgot.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_provider_torchx.core.schedulers.api import CancelledBy
from airflow_provider_torchx.core.schedulers.slurm.render import EXIT_FILE
from airflow_provider_torchx.core.statedir import default_state_dir

JOB_FILE = "job.json"
SCRIPT_FILE = "sbatch.sh"
CANCEL_FILE = "cancel.json"
#: At most this many bytes of a record file are read (the job writes some of them).
MAX_RECORD_BYTES = 1 << 20


@dataclass
class ReplicaEnd:
    """How a replica ended: its exit code and when (epoch seconds)."""

    exit_code: int
    at: float


@dataclass
class JobRecord:
    """What a job's directory says of it (``read``)."""

    app_id: str
    directory: str
    name: str
    roles: list[dict[str, Any]]
    labels: dict[str, str]
    submitted: float | None
    #: ``sbatch``'s options and the job's cfg, as submitted.
    args: list[str] = field(default_factory=list)
    cfg: dict[str, Any] = field(default_factory=dict)
    started: float | None = None
    ended: float | None = None
    hosts: dict[tuple[str, int], str] = field(default_factory=dict)
    starts: dict[tuple[str, int], float] = field(default_factory=dict)
    exits: dict[tuple[str, int], ReplicaEnd] = field(default_factory=dict)
    cancel: dict[str, Any] | None = None

    @property
    def cancelled_by(self) -> CancelledBy | None:
        return CancelledBy.parse((self.cancel or {}).get("by"))

    @property
    def cancel_reason(self) -> str | None:
        reason = (self.cancel or {}).get("reason")
        return reason if isinstance(reason, str) else None


def _read_text(path: str) -> str | None:
    """The start of the regular file ``path`` (a symbolic link the job left there is not
    followed), or None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with open(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return f.read(MAX_RECORD_BYTES).decode("utf-8", "replace")


def _read_json(path: str) -> dict[str, Any] | None:
    text = _read_text(path)
    if text is None:
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _epoch(path: str) -> float | None:
    text = _read_text(path)
    try:
        return float(text.strip()) if text else None
    except ValueError:
        return None


def _exit(path: str) -> ReplicaEnd | None:
    parts = (_read_text(path) or "").split()
    try:
        return ReplicaEnd(int(parts[0]), float(parts[1])) if len(parts) == 2 else None
    except ValueError:
        return None


def write_json(path: str, doc: dict[str, Any]) -> None:
    """Write ``doc`` to ``path`` atomically (a temp file renamed over it)."""
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def script(directory: str) -> str | None:
    """The batch script the job was submitted with (``sbatch.sh``)."""
    return _read_text(os.path.join(directory, SCRIPT_FILE))


def read(app_id: str, directory: str) -> JobRecord | None:
    """The record of job ``app_id`` in ``directory``; None without a ``job.json``."""
    job = _read_json(os.path.join(directory, JOB_FILE))
    if job is None or not isinstance(job.get("roles"), list):
        return None
    roles = [r for r in job["roles"] if isinstance(r, dict) and isinstance(r.get("name"), str)]
    rec = JobRecord(
        app_id=app_id,
        directory=directory,
        name=str(job.get("name", "")),
        roles=roles,
        labels={str(k): str(v) for k, v in (job.get("labels") or {}).items()},
        submitted=job.get("submitted") if isinstance(job.get("submitted"), int | float) else None,
        args=[str(a) for a in job.get("args") or []],
        cfg=dict(job.get("cfg") or {}),
        started=_epoch(os.path.join(directory, "started")),
        ended=_epoch(os.path.join(directory, "ended")),
        cancel=_read_json(os.path.join(directory, CANCEL_FILE)),
    )
    for role in roles:
        for k in range(int(role.get("num_replicas", 0))):
            rdir = os.path.join(directory, role["name"], str(k))
            host = (_read_text(os.path.join(rdir, "host")) or "").split()
            if host:
                rec.hosts[(role["name"], k)] = host[0]
            with contextlib.suppress(IndexError, ValueError):
                rec.starts[(role["name"], k)] = float(host[1])
            end = _exit(os.path.join(rdir, EXIT_FILE))
            if end is not None:
                rec.exits[(role["name"], k)] = end
    return rec


class JobIndex:
    """This host's index of job directories: ``<root>/<job id>`` holds the directory's path."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or Path(default_state_dir()) / "slurm" / "jobs"

    def add(self, app_id: str, directory: str) -> None:
        """Remember that job ``app_id`` lives in ``directory`` (idempotent)."""
        path = self.root / app_id
        if _read_text(str(path)) == directory:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".tmp-")
        with os.fdopen(fd, "w") as f:
            f.write(directory)
        os.replace(tmp, path)

    def get(self, app_id: str) -> str | None:
        """The directory of job ``app_id``, or None when this host never saw it."""
        return _read_text(str(self.root / app_id)) if app_id.isdigit() else None

    def remove(self, app_id: str) -> None:
        """Forget job ``app_id`` (idempotent)."""
        with contextlib.suppress(FileNotFoundError):
            (self.root / app_id).unlink()

    def items(self) -> Iterator[tuple[str, str]]:
        """Every ``(job id, directory)`` this host knows."""
        with contextlib.suppress(FileNotFoundError), os.scandir(self.root) as it:
            for entry in it:
                if entry.name.isdigit():
                    directory = _read_text(entry.path)
                    if directory:
                        yield entry.name, directory
