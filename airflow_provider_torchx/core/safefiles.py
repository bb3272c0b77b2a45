"""Opening a file only where it is meant to be: ``open_inside`` opens a regular file reached
through real directories below a root (no symbolic link on the way, the file itself included),
so a file swapped for a link to ``/etc/shadow``, a FIFO or a device gets a clear error
(``UnsafeFileError``) and is never read; ``read_json`` reads one such file's JSON. The local job
store's files and the watchers' cursor files (``core/cursors.py``) are read through it;
``makedirs_private`` makes the directories of such files (and checkpoint parents) owner-only;
``disk_usage`` measures a job's directory without following links.

Standard library only, loaded without ``typing``: the local supervisor imports it (through the
job store) before it starts the replicas.
"""

from __future__ import annotations

import errno
import os
import stat

# Not ``typing``: it would slow the supervisor's start-up.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    StrPath = str | os.PathLike[str]


class UnsafeFileError(ValueError):
    """A file of the store that is not a regular file reached through real directories (a
    symbolic link, a FIFO, a path through a swapped directory): it is not read. ``why`` says
    which, the message also names the file."""

    def __init__(self, what: str, path: str, why: str) -> None:
        super().__init__(f"{what} {path}: refused: {why}")
        self.why = f"refused: {why}"


def open_inside(path: StrPath, root: StrPath, what: str = "file") -> int | None:
    """A file descriptor of ``path`` open for reading, or None when it does not exist. Only a
    regular file below ``root`` reached through real directories (no symbolic link between
    ``root`` and the file, the file itself included; ``root`` may be one) is opened; anything
    else raises ``UnsafeFileError`` naming ``what`` and ``path``, and is never read."""
    path, root = os.fspath(path), os.fspath(root)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafeFileError(what, path, "it is a symbolic link, not the job's own file") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a directory, not a file" if stat.S_ISDIR(mode) else "not a regular file"
            raise UnsafeFileError(what, path, f"it is {kind}")
        real = os.readlink(f"/proc/self/fd/{fd}")
        expected = os.path.join(os.path.realpath(root), os.path.relpath(os.path.abspath(path), os.path.abspath(root)))
        # A writer's atomic replace after the open unlinks the inode read: the kernel then
        # names it "<path> (deleted)", still the path it was opened at (a whole old version).
        if real not in (expected, f"{expected} (deleted)"):
            raise UnsafeFileError(what, path, f"a directory on its way below {root} is a symbolic link")
        return fd
    except BaseException:
        os.close(fd)
        raise


def read_json(path: StrPath, root: StrPath) -> Any:
    """The JSON in ``path`` (a file below ``root``, read through ``open_inside``), or None when
    it does not exist (or vanished); ``ValueError`` when it is not JSON, ``UnsafeFileError``
    (a ``ValueError``) when it is not a file ``open_inside`` reads."""
    import json

    fd = open_inside(path, root)
    if fd is None:
        return None
    with open(fd, "rb") as f:
        return json.loads(f.read())


def makedirs_private(path: str | os.PathLike[str]) -> None:
    """``os.makedirs`` where every directory it creates is owner-only, whatever the umask
    (``makedirs`` applies its mode to the last one only, and through the umask)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        return
    head = os.path.dirname(path)
    if head and head != path:
        makedirs_private(head)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        return
    os.chmod(path, 0o700)


def disk_usage(path: StrPath) -> int:
    """Bytes the directory ``path`` takes on disk, everything below it included (symbolic
    links not followed; what cannot be read counts nothing)."""
    total, pending = 0, [os.fspath(path)]
    while pending:
        try:
            entries = list(os.scandir(pending.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            total += st.st_blocks * 512
            if entry.is_dir(follow_symlinks=False):
                pending.append(entry.path)
    return total
