"""A Slurm job's record under its directory, ``<job_dir>/<job id>/`` (on a file system this
host and the nodes share): what lets a job be described after Slurm forgot it (without
accounting, ``MinJobAge`` after its end) and listed by its labels.

- ``job.json``: written by ``schedule`` once ``sbatch`` accepted the job: the app's name, roles
  (name, replicas, command, resources), labels, cfg, ``sbatch``'s options and when it was
  submitted; ``sbatch.sh``: the script it was given.
- ``started`` / ``ended``: the batch script's start and end (epoch seconds; ``ended`` then the
  run it ended, Slurm's ``SLURM_RESTART_COUNT``: 0, then +1 for each requeue).
- ``<role>/<k>/host``, ``<role>/<k>/exit``: where and when replica ``k`` started (``<node>
  <epoch seconds>``), and its exit code, end and run (``<code> <epoch seconds> <run>``), written
  by the replica's wrapper (``render.py``).
- ``<role>/<k>/runs``: the replica's earlier runs of a requeued job, one line each (``<node>
  <start>``, then ``<code> <end> <run>`` where it recorded its end), appended by the wrapper of
  the next run before it clears ``exit``.
- ``cancel.json``: who asked for a cancel and why, written before ``scancel``.

This host also keeps an index, ``<state dir>/slurm/jobs/<job id>``, naming each job's
directory: written when this host submits or first sees a job, read for a job Slurm forgot.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_provider_torchx.core.schedulers.api import CancelledBy
from airflow_provider_torchx.core.schedulers.slurm.render import EXIT_FILE, RUNS_FILE
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
    #: The job's run that wrote it (``SLURM_RESTART_COUNT``: 0 before any requeue).
    run: int = 0


@dataclass
class EarlierRun:
    """A replica's run before the job was requeued: where and when it started, how it ended
    (None: it was stopped before it could write its end)."""

    host: str
    started: float | None
    end: ReplicaEnd | None


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
    #: The run that wrote ``ended`` and each replica's earlier runs (a requeued job).
    ended_run: int = 0
    earlier: dict[tuple[str, int], list[EarlierRun]] = field(default_factory=dict)

    @property
    def run(self) -> int:
        """The latest run the record saw (0: the job was never requeued, as far as it shows)."""
        runs = [self.ended_run if self.ended is not None else 0, *(e.run for e in self.exits.values())]
        runs += [len(v) for v in self.earlier.values()]
        return max(runs)

    def at_run(self, run: int) -> JobRecord:
        """The record as of the job's run ``run`` (Slurm's restart count): an end an earlier
        run wrote (the job was requeued since, and its replicas of this run have not cleared
        it yet) is that run's, not this one's: the replica's start and end move to its earlier
        runs, and the job's ``ended`` goes."""
        stale = {key for key, end in self.exits.items() if end.run < run}
        if not stale and (self.ended is None or self.ended_run >= run):
            return self
        earlier = {key: list(runs) for key, runs in self.earlier.items()}
        for key in stale:
            run_end = EarlierRun(self.hosts.get(key, ""), self.starts.get(key), self.exits[key])
            earlier.setdefault(key, []).append(run_end)
        return dataclasses.replace(
            self,
            ended=self.ended if self.ended_run >= run else None,
            hosts={k: v for k, v in self.hosts.items() if k not in stale},
            starts={k: v for k, v in self.starts.items() if k not in stale},
            exits={k: v for k, v in self.exits.items() if k not in stale},
            earlier=earlier,
        )

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


def _epoch(path: str) -> tuple[float, int] | None:
    """An epoch (seconds) and the run that wrote it (0 when the file names none)."""
    parts = (_read_text(path) or "").split()
    try:
        return (float(parts[0]), int(parts[1]) if len(parts) > 1 else 0) if parts else None
    except ValueError:
        return None


def _end(parts: list[str]) -> ReplicaEnd | None:
    """``<code> <epoch seconds> [<run>]`` as a ``ReplicaEnd``."""
    try:
        if len(parts) == 2:
            return ReplicaEnd(int(parts[0]), float(parts[1]))
        return ReplicaEnd(int(parts[0]), float(parts[1]), int(parts[2])) if len(parts) == 3 else None
    except ValueError:
        return None


def _earlier(text: str) -> list[EarlierRun]:
    """The ``runs`` file: one line per earlier run, ``<node> <start> [<code> <end> <run>]``."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        try:
            started = float(parts[1]) if len(parts) > 1 else None
        except ValueError:
            started = None
        out.append(EarlierRun(parts[0], started, _end(parts[2:])))
    return out


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
        cancel=_read_json(os.path.join(directory, CANCEL_FILE)),
    )
    if (started := _epoch(os.path.join(directory, "started"))) is not None:
        rec.started = started[0]
    if (ended := _epoch(os.path.join(directory, "ended"))) is not None:
        rec.ended, rec.ended_run = ended
    for role in roles:
        for k in range(int(role.get("num_replicas", 0))):
            rdir = os.path.join(directory, role["name"], str(k))
            host = (_read_text(os.path.join(rdir, "host")) or "").split()
            if host:
                rec.hosts[(role["name"], k)] = host[0]
            with contextlib.suppress(IndexError, ValueError):
                rec.starts[(role["name"], k)] = float(host[1])
            end = _end((_read_text(os.path.join(rdir, EXIT_FILE)) or "").split())
            if end is not None:
                rec.exits[(role["name"], k)] = end
            runs = _earlier(_read_text(os.path.join(rdir, RUNS_FILE)) or "")
            if runs:
                rec.earlier[(role["name"], k)] = runs
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
