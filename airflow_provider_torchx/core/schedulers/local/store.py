"""The on-disk job store of the local scheduler.

One directory per job, ``<state dir>/local/<app_id>/``, created atomically (``mkdir``), so app
ids are unique across concurrent launchers. It holds JSON files, each written atomically
(temp file + rename) and each with one writer:

- ``request.json``: the launcher, once: the rendered request, roles, labels, cfg, backend.
- ``supervisor.json``: the supervisor's pid and start time (written by the launcher before it
  hands the supervisor the request, or by the supervisor itself when the launcher died first).
- ``state.json``: the supervisor (and, once the supervisor is dead, any observer): app and
  replica states, pids, exit codes, restarts, message.
- ``cancel.json``: whoever cancels: the request to stop, with its grace period, who or what
  asked in words (``reason``, may be null) and who asked as data (``by``: ``task``, ``reaper``
  or ``user``; null or missing: not said); ``refused``: why the job's record was refused when
  the cancel reached it all the same (missing: it was not).

Beside the jobs, ``<state dir>/local/.finished.json`` indexes the jobs that ended: for each,
what a listing shows (backend, name, labels, submission time, final state, when it ended).
None of it changes once a job has ended, so a listing reads the files of live jobs only; the
index is a cache (whoever lists adds what it learned; a job missing from it is read from its
files, an entry whose directory is gone is ignored), so a lost or stale write costs time, never
correctness, and a store that cannot be written is listed all the same.

Every file is read through ``open_inside`` (``core/safefiles.py``): a regular file reached
through real directories below the store (or the directory given), never through a symbolic link, so a job that swaps
one of its files (or its directory) for a link to ``/etc/shadow`` gets a clear error and the
target is never read.

Everything is created owner-only, whatever the umask. Store faults (a full or read-only
filesystem) raise ``StoreError`` naming the store and the cause; a file that is not what its
writer wrote (truncated, foreign, hand-edited) raises ``CorruptEntryError`` naming it (both
in ``core/errors.py``: the contract's errors).
Standard library only: the supervisor imports this before it starts the replicas, so what
only some functions use (``json``, ``re``, ``shutil``) is imported in them: a job's start waits
for nothing it does not use.
"""

from __future__ import annotations

import gc
import os
import time

# The store's errors are the contract's (callers catch them from ``core/errors.py``); the local
# modules name them through the store.
from airflow_provider_torchx.core.errors import CancelDeliveredError as CancelDeliveredError
from airflow_provider_torchx.core.errors import CancelNotRecordedError as CancelNotRecordedError
from airflow_provider_torchx.core.errors import CorruptEntryError as CorruptEntryError
from airflow_provider_torchx.core.errors import StoreError
from airflow_provider_torchx.core.safefiles import disk_usage, makedirs_private, read_json
from airflow_provider_torchx.core.statedir import default_state_dir

# Not ``typing``/``pathlib``/``collections``: they would slow the supervisor's start-up.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Set
    from typing import Any

    StrPath = str | os.PathLike[str]

REQUEST = "request.json"
STATE = "state.json"
SUPERVISOR = "supervisor.json"
CANCEL = "cancel.json"
SUPERVISOR_LOG = "supervisor.log"
#: The index of ended jobs (hidden: not an app id).
FINISHED_INDEX = ".finished.json"

#: Set in every replica's environment to the job directory, so that the job's processes can
#: be found even after they left its session and lost their parent.
JOB_ENV = "AIRFLOW_TORCHX_LOCAL_JOB"

#: What an app id is made of (it becomes a directory name in the store); it starts with
#: neither ``.`` nor ``-``.
_APP_ID_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")
#: The longest file name (``NAME_MAX``): a longer id names no job of the store.
NAME_MAX = 255
#: The app ids among names joined by ``/`` (which no file name holds): one pass of the regex
#: over a whole directory listing instead of one match per name.
_APP_IDS_PATTERN = r"(?<![^/])[A-Za-z0-9_][A-Za-z0-9_.-]*(?![^/])"
#: How old a directory's mtime must be for a listing to be reused while it is unchanged:
#: well above the coarse clock tick that stamps it.
_RACY_NS = 2_000_000_000


class GcPaused:
    """``with GcPaused():`` runs the block without the cyclic garbage collector (restored
    after, if it was on). Parsing the index or listing a big store makes hundreds of thousands
    of objects, none of them garbage, and would otherwise trigger collections that scan all of
    them again. A class, not ``contextlib``: the supervisor imports this module."""

    def __enter__(self) -> None:
        self.was_enabled = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc_info: object) -> None:
        if self.was_enabled:
            gc.enable()


def is_valid_app_id(app_id: object) -> bool:
    """Whether ``app_id`` can name a job directory (no ``/``, no ``..``, not hidden, not longer
    than a file name may be)."""
    return (
        isinstance(app_id, str)
        and 0 < len(app_id) <= NAME_MAX
        and ".." not in app_id
        and app_id[0] not in ".-"
        and _APP_ID_CHARS.issuperset(app_id)
    )


def job_marker(job_dir: StrPath) -> str:
    """The ``KEY=value`` every process of the job has in its environment."""
    return f"{JOB_ENV}={job_dir}"


def cancelled_msg(cancel: dict[str, Any] | None) -> str:
    """An ended job's message after the cancel request ``cancel`` (``cancel.json``), naming
    who or what asked when the request says (its ``reason``, else who: its ``by``)."""
    reason, by = (cancel or {}).get("reason"), (cancel or {}).get("by")
    if reason:
        return f"cancelled by request: {reason}"
    return f"cancelled by request of the {by}" if by else "cancelled by request"


def store_error(root: StrPath, what: str, err: OSError) -> StoreError:
    """A ``StoreError`` for ``err`` raised while doing ``what`` in the store at ``root``."""
    cause = err.strerror or str(err)
    return StoreError(err.errno, f"job store {os.fspath(root)}: cannot {what}: {cause}")


def create_logs(paths: list[str | None]) -> None:
    """Create a replica's log files ``paths`` (None: no such log) and their directories,
    owner-only, keeping what they hold: its error file goes in that directory too, so it exists
    before the replica starts."""
    for path in paths:
        if path:
            makedirs_private(os.path.dirname(path))
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600))


def write_json_atomic(path: StrPath, obj: Any, *, dir_fd: int | None = None) -> os.stat_result:
    """Write ``obj`` as JSON to ``path`` through a temp file and a rename (owner-only); return
    the written file's status (its inode is ``path``'s until the next writer's rename). On any
    error the temp file is removed and the old content of ``path`` stays. ``dir_fd``: ``path``
    is relative to that open directory (written there, through no link on the way)."""
    head, name = os.path.split(path)
    tmp = os.path.join(head, f".{name}.{os.getpid()}.tmp")
    import json

    data = json.dumps(obj, separators=(",", ":")).encode()  # json.dump's streaming encoder is slower
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600, dir_fd=dir_fd)
    try:
        try:
            os.fchmod(fd, 0o600)  # an older temp file of a dead writer with this pid
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            written = os.fstat(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        return written
    except BaseException:
        try:  # noqa: SIM105 - contextlib would cost start-up time
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise


#: Each store's parsed index and the ``_file_key`` it was read (or written) at, shared by the
#: process's stores of one directory (a ``local_cwd`` and a ``local_dir`` scheduler): reread
#: only when the file changed.
_PARSED_INDEXES: dict[str, tuple[tuple[int, int, int], dict[str, Any]]] = {}


def _file_key(st: os.stat_result) -> tuple[int, int, int]:
    """(inode, mtime, size): a file replaced or rewritten since gets another key."""
    return (st.st_ino, st.st_mtime_ns, st.st_size)


class JobStore:
    """The jobs directory (``<state dir>/local``), created owner-only on first use."""

    def __init__(self, state_dir: StrPath | None = None) -> None:
        base = os.path.abspath(os.path.expanduser(state_dir)) if state_dir else default_state_dir()
        self.root = os.path.join(base, "local")
        # The app ids as last listed and the store directory's mtime then (``app_ids``).
        self._ids: tuple[int, frozenset[str]] | None = None

    def ensure(self) -> None:
        """Create the store (owner-only) if missing; ``StoreError`` if it cannot be."""
        try:
            makedirs_private(self.root)
        except OSError as e:
            raise store_error(self.root, "create the store", e) from None

    def job_dir(self, app_id: str) -> str:
        """Where the job ``app_id`` lives (the caller checks ``is_valid_app_id`` first)."""
        return os.path.join(self.root, app_id)

    def create(self, app_id: str) -> str:
        """Create the job directory atomically (owner-only); ``FileExistsError`` if the id is
        taken, ``StoreError`` if the store cannot be written."""
        self.ensure()
        path = self.job_dir(app_id)
        try:
            os.mkdir(path, mode=0o700)
            os.chmod(path, 0o700)
        except FileExistsError:
            raise
        except OSError as e:
            raise store_error(self.root, f"create the job {app_id!r}", e) from None
        return path

    def app_ids(self) -> frozenset[str]:
        """The ids of the jobs in the store. The listing is reused while the store directory's
        mtime is what it was and was already ``_RACY_NS`` old when listed (a job created in
        the same clock tick as an earlier listing could leave the mtime unchanged)."""
        try:
            st = os.stat(self.root)
        except FileNotFoundError:
            return frozenset()
        if self._ids is not None and self._ids[0] == st.st_mtime_ns:
            return self._ids[1]
        import re

        ids = frozenset(n for n in re.findall(_APP_IDS_PATTERN, "/".join(os.listdir(self.root))) if ".." not in n)
        if time.time_ns() - st.st_mtime_ns > _RACY_NS:
            self._ids = (st.st_mtime_ns, ids)
        return ids

    def finished(self) -> dict[str, Any]:
        """The index of ended jobs (app id -> summary); empty when missing or unreadable."""
        path = os.path.join(self.root, FINISHED_INDEX)
        try:
            st = os.stat(path)
        except OSError:
            return {}
        key = _file_key(st)
        parsed = _PARSED_INDEXES.get(self.root)
        if parsed is not None and parsed[0] == key:
            return parsed[1]
        try:
            with GcPaused():
                index = read_json(path, self.root)
        except (OSError, ValueError):
            index = None
        if not isinstance(index, dict):
            index = {}
        _PARSED_INDEXES[self.root] = (key, index)
        return index

    def record_finished(self, entries: dict[str, Any], present: Set[str]) -> None:
        """Add ``entries`` to the index, dropping the jobs not in ``present`` (deleted); a store
        that cannot be written keeps the old index (this is a cache)."""
        index = {k: v for k, v in self.finished().items() if k in present}
        index.update(entries)
        try:
            written = write_json_atomic(os.path.join(self.root, FINISHED_INDEX), index)
        except OSError:
            return
        _PARSED_INDEXES[self.root] = (_file_key(written), index)  # what was written: not parsed again

    def disk_usage(self, app_id: str) -> int:
        """Bytes the job's directory takes on disk (``safefiles.disk_usage``)."""
        return disk_usage(self.job_dir(app_id))

    def remove(self, app_id: str) -> None:
        """Delete the job's directory and everything in it, or the foreign entry of that name
        (gone already: fine); ``StoreError`` if the store cannot be written."""
        import shutil

        path = self.job_dir(app_id)
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:  # a foreign entry
                os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise store_error(self.root, f"delete the job {app_id!r}", e) from None
