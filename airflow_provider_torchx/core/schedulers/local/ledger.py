"""The host ledger: one small JSON file per host in the job store, shared by every process of
the host (launchers, supervisors, observers) and changed only under an exclusive ``fcntl``
lock. The GPU ledger (``gpus.py``) and the rendezvous-port reservations (``ports.py``) live in
it, each under a key of its own.

Guarantees:

1. A change is a read-modify-write under the lock, written atomically (temp file + rename):
   concurrent processes never lose each other's changes, and a reader without the lock
   (``read``) sees one whole version.
2. One ledger per host (the file is named after the host), also when the store is shared.
3. Entries name jobs by app id; ``job_over`` tells whose job has ended (or was deleted, or
   whose supervisor died or never started), so whoever holds the lock next drops stale
   entries: nothing is held forever by a job that is gone.

Standard library only: the supervisor imports this.
"""

from __future__ import annotations

import fcntl
import json
import os

from airflow_provider_torchx.core.clock import SYSTEM_CLOCK, Clock
from airflow_provider_torchx.core.schedulers.local import procfs, store

TYPE_CHECKING = False  # not ``typing``: the supervisor's start-up must stay fast
if TYPE_CHECKING:
    from typing import Any

#: The ledger's directory in the store (a leading dot: never taken for a job).
LEDGER_DIR = ".ledger"
#: A job whose supervisor has not recorded itself this long after it was created never
#: started (the scheduler then records it FAILED).
START_TIMEOUT = 60.0
_TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


def _paths(root: str) -> tuple[str, str]:
    host = os.uname().nodename
    folder = os.path.join(root, LEDGER_DIR)
    return os.path.join(folder, f"{host}.json"), os.path.join(folder, f"{host}.lock")


def _read_record(path: str) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when it is missing or corrupt (not JSON, not an
    object): ``list`` and ``describe`` report a corrupt file, the ledger only must not trip on
    it."""
    try:
        data = store.read_json(path, os.path.dirname(path))
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def read(root: str) -> dict[str, Any]:
    """The ledger as last written (no lock: for observers)."""
    return _read_record(_paths(root)[0]) or {}


class Locked:
    """``with Locked(root) as data:`` the ledger under the host's exclusive lock; ``data`` is
    written back at the end of the block if it changed (and not when the block raised)."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.path, self.lock_path = _paths(root)
        self.fd = -1
        self.data: dict[str, Any] = {}
        self.before = ""

    def __enter__(self) -> dict[str, Any]:
        os.makedirs(os.path.dirname(self.lock_path), mode=0o700, exist_ok=True)
        self.fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        self.data = _read_record(self.path) or {}  # a corrupt ledger (written atomically: by hand) starts anew
        self.before = json.dumps(self.data, sort_keys=True)
        return self.data

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        try:
            if exc_type is None and json.dumps(self.data, sort_keys=True) != self.before:
                store.write_json_atomic(self.path, self.data)
        finally:
            os.close(self.fd)  # releases the lock


def supervisor_alive(sup: dict[str, Any] | None) -> bool:
    """Whether the supervisor recorded as ``sup`` (pid, start time, boot) still runs: same
    boot, same pid and start time (None: none recorded)."""
    return sup is not None and sup.get("boot") == procfs.boot_id() and procfs.is_alive(sup.get("pid"), sup.get("start"))


def job_over(root: str, app_id: str, clock: Clock = SYSTEM_CLOCK) -> bool:
    """Whether the job ``app_id`` of the store at ``root`` is over: deleted, terminal, its
    supervisor dead (or its record unreadable), or no supervisor ``START_TIMEOUT`` (of
    ``clock``'s wall time) after the job was created."""
    job_dir = os.path.join(root, app_id)
    st = _read_record(os.path.join(job_dir, store.STATE))
    if st is not None and st.get("state") in _TERMINAL:
        return True
    sup_path = os.path.join(job_dir, store.SUPERVISOR)
    sup = _read_record(sup_path)
    if sup is not None:
        return not supervisor_alive(sup)
    if os.path.exists(sup_path):  # there, but corrupt: its devices cannot be vouched for
        return True
    try:
        return clock.wall() - os.stat(job_dir).st_mtime > START_TIMEOUT
    except FileNotFoundError:
        return True
