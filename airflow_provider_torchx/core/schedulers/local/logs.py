"""Reading replica logs: whole lines from a byte offset (the resumable cursor), and
``LogIterator``, which follows a log file until its app is terminal (a finished log is
iterated by Python's text layer itself, as fast as ``for line in open(path)``).

Every read opens the file through ``safefiles.open_inside`` (``open_log``), which stays inside the
job's log directory: a log that a replica swapped for a symbolic link (to ``/etc/shadow``, say),
a FIFO or a device, or whose directory now leads elsewhere, raises ``safefiles.UnsafeFileError``
naming it; its target is never read. This holds for every reader (the UI, the trigger, the
worker, the CLI).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, cast

from airflow_provider_torchx.core import safefiles
from airflow_provider_torchx.core.errors import shown
from airflow_provider_torchx.core.schedulers.api import Stream, cursor_object

if TYPE_CHECKING:
    from airflow_provider_torchx.core.schedulers.api import Scheduler

#: At most this many bytes are read per ``read_log`` call (a reader loops for more).
MAX_READ_BYTES = 1 << 20
#: ``LogIterator`` reads in smaller chunks: small lists of lines reuse memory, which is faster.
ITER_READ_BYTES = 64 << 10
#: A longer line is returned in pieces (the supervisor already cuts lines at 1 MiB).
MAX_LINE_BYTES = 16 << 20
#: The most bytes ``tail_lines`` reads from a file's end, and the most entries ``rank_log``
#: looks at in one directory of torchrun's (the job writes them: a bound on a hostile tree).
TAIL_BYTES = 64 << 10
RANK_DIR_ENTRIES = 64
_ATTEMPT = re.compile(r"^attempt_\d+$")
#: How often a tailing reader looks for new lines.
TAIL_INTERVAL = 0.02
# The UTF-8 of line boundaries of ``str.splitlines`` other than "\n": without them it splits as
# we want. Single bytes, found with a fast ``memchr``; then \x85, \u2028 and \u2029 by their
# lead bytes, searched for only in text that is not ASCII (a two-byte search costs twice the
# decoding and splitting of the same bytes).
_ONE_BYTE_BREAKS = (b"\r", b"\x0b", b"\x0c", b"\x1c", b"\x1d", b"\x1e")
_MULTI_BYTE_BREAKS = (b"\xc2\x85", b"\xe2\x80")


def log_root(job_dir: str, app_id: str, cfg: Mapping[str, Any]) -> str:
    """The log directory of the job ``app_id`` as the store's layout makes it: its directory in
    the store (``job_dir``), or ``<log_dir>/<app_id>`` under the ``log_dir`` run option of its
    ``cfg``. Readers derive it so, never from a path the record names: a job may rewrite its
    ``request.json``."""
    log_dir = cfg.get("log_dir")
    return os.path.join(os.path.abspath(str(log_dir)), app_id) if log_dir else job_dir


def replica_log(
    app_id: str, root: str, role_params: Mapping[str, Any], role_name: str, k: int, streams: Stream | str | None
) -> tuple[str, str]:
    """``(stream name, path)`` of the log of replica ``k`` of ``role_name`` (default stream:
    combined) of the job ``app_id`` whose log directory is ``root``:
    ``<root>/<role>/<k>/<stream>.log``. ``ValueError`` names an unknown role (not a key of
    the record's ``role_params``), replica or stream, or a role name that cannot name a
    directory below ``root``."""
    params = role_params.get(role_name)
    if params is None:
        raise ValueError(f"role_name: app {app_id!r} has no role {role_name!r}; its roles: {', '.join(role_params)}")
    if not isinstance(k, int) or not 0 <= k < len(params):
        raise ValueError(f"k: role {role_name!r} has replicas 0..{len(params) - 1}; got {k!r}")
    try:
        stream = Stream(streams or Stream.COMBINED)
    except ValueError:
        raise ValueError(f"streams: {streams!r} is not one of {', '.join(s.value for s in Stream)}") from None
    if role_name in (".", "..") or "/" in role_name or "\0" in role_name:
        raise ValueError(f"role_name: {shown(role_name)} cannot name a log directory")
    return stream.value, os.path.join(root, role_name, str(k), f"{stream.value}.log")


def cursor_offset(cursor: str | None, stream: str) -> int:
    """The byte offset a ``read_log`` cursor of ``stream`` holds (None: the start, 0);
    ``ValueError`` for anything ``cursor_at`` did not make for that stream."""
    if cursor is None:
        return 0
    try:
        parsed = cursor_object(cursor)
        offset = parsed["offset"]
        if parsed.get("stream") == stream and type(offset) is int and 0 <= offset < 1 << 62:
            return offset
    except (ValueError, TypeError, KeyError):
        pass
    raise ValueError(f"cursor: {shown(cursor)} is not a cursor read_log returned for the {stream} stream")


def cursor_at(stream: str, offset: int) -> str:
    """The ``read_log`` cursor of byte ``offset`` of ``stream``."""
    return json.dumps({"stream": stream, "offset": offset})


def open_log(path: str, root: str) -> int | None:
    """A file descriptor of the log ``path`` open for reading, or None when it does not exist;
    only a regular file reached through real directories below ``root`` (the job's log
    directory) is opened (``safefiles.open_inside``)."""
    return safefiles.open_inside(path, root, "log")


def read_lines(
    path: str, offset: int, final: bool, max_lines: int | None = None, max_bytes: int = MAX_READ_BYTES, *, root: str
) -> tuple[list[str], int, bool]:
    """Whole lines of ``path`` (inside ``root``, see ``open_log``) from byte ``offset``:
    ``(lines, next offset, more to read)``.

    Each line ends in ``"\\n"``. An unterminated last line is held back (the writer may not be
    done) unless ``final`` (the app is terminal), when it is returned with a newline. A
    missing file reads as empty. Bytes that are not UTF-8 are replaced.
    """
    fd = open_log(path, root)
    if fd is None:
        return [], offset, False
    with open(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        f.seek(offset)
        data = f.read(max_bytes)
        while b"\n" not in data and len(data) < MAX_LINE_BYTES:  # a long line: read to its end
            extra = f.read(max_bytes)
            if not extra:
                break
            data += extra
    full = offset + len(data) < size
    cut = data.rfind(b"\n") + 1
    if (final and not full) or (not cut and len(data) >= MAX_LINE_BYTES):
        cut = len(data)
    available = cut
    if max_lines is not None:
        pos = 0
        for _ in range(max_lines):
            nl = data.find(b"\n", pos, cut)
            pos = cut if nl < 0 else nl + 1
            if pos == cut:
                break
        cut = pos
    if not cut:
        return [], offset, full
    chunk = data[:cut] if cut < len(data) else data
    text = chunk.decode("utf-8", "replace")
    if not text.endswith("\n"):
        text += "\n"
    if any(b in chunk for b in _ONE_BYTE_BREAKS) or (
        not chunk.isascii() and any(b in chunk for b in _MULTI_BYTE_BREAKS)
    ):
        out = [line + "\n" for line in text.split("\n")[:-1]]
    else:
        out = text.splitlines(keepends=True)  # the same lines, faster
    return out, offset + cut, full or cut < available


def finished_lines(path: str, *, root: str) -> Iterator[str] | None:
    """Every line of a log nobody writes any more (inside ``root``, see ``open_log``),
    iterated by the text layer itself (no Python code runs per line; the file is closed once
    exhausted). None when the file is missing or does not end in a newline: read it with
    ``read_lines`` then. Lines are not cut (the supervisor already cuts them at 1 MiB)."""
    fd = open_log(path, root)
    if fd is None:
        return None
    f = open(fd, encoding="utf-8", errors="replace", newline="\n")  # noqa: SIM115 - closed at the end
    size = os.fstat(f.fileno()).st_size
    if size and os.pread(f.fileno(), 1, size - 1) != b"\n":
        f.close()
        return None
    return cast(Iterator[str], itertools.chain(f, iter(f.close, None)))  # close() returns None: the end


def rank_log(base: str, local_rank: int, stream: str = "stderr") -> str | None:
    """The newest ``<base>/<run>/attempt_<n>/<local_rank>/<stream>.log``: the layout torchrun
    gives a rank's file below its log directory ``base`` (``--log-dir``; ``<run>`` is
    ``<rdzv id>_<random>``, one per torchrun started, ``attempt_<n>`` one per restart). None
    when there is none. Only real directories are walked (no symbolic link is followed), at
    most ``RANK_DIR_ENTRIES`` entries of each; the newest file (modification time) wins: the
    one of the run and attempt that ended last."""
    best: tuple[float, str] | None = None
    for run in _subdirs(base):
        for attempt in _subdirs(run):
            if not _ATTEMPT.match(os.path.basename(attempt)):
                continue
            path = os.path.join(attempt, str(local_rank), f"{stream}.log")
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if best is None or st.st_mtime > best[0]:
                best = (st.st_mtime, path)
    return best[1] if best else None


def _subdirs(path: str) -> list[str]:
    """The real directories (not symbolic links) among the first ``RANK_DIR_ENTRIES`` entries
    of ``path``; empty when it cannot be listed."""
    try:
        with os.scandir(path) as it:
            entries = list(itertools.islice(it, RANK_DIR_ENTRIES))
    except OSError:
        return []
    return [e.path for e in entries if e.is_dir(follow_symlinks=False)]


def tail_lines(path: str, n: int, *, root: str) -> list[str]:
    """The last ``n`` lines (without line ends) of the file ``path`` (inside ``root``, see
    ``open_log``), from its last ``TAIL_BYTES`` bytes (a first line cut there is dropped);
    empty when it is missing. Bytes that are not UTF-8 are replaced."""
    fd = open_log(path, root)
    if fd is None:
        return []
    with open(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        start = max(0, size - TAIL_BYTES)
        f.seek(start)
        data = f.read(TAIL_BYTES)
    lines = data.decode("utf-8", errors="replace").split("\n")
    if start > 0:
        lines = lines[1:]
    if lines and lines[-1] == "":
        lines.pop()
    return lines[-n:] if n > 0 else []


class LogIterator:
    """The lines of one log file of app ``app_id`` (inside ``root``, its log directory); with
    ``should_tail`` it follows the file until the app is terminal (as ``scheduler.describe``
    says) and everything was read. A read: a job whose supervisor died is reported ended and
    left as it is (whoever acts on the end settles it: ``Scheduler.finalize``)."""

    def __init__(
        self, app_id: str, log_file: str, scheduler: Scheduler[Any], should_tail: bool = True, *, root: str
    ) -> None:
        self.app_id = app_id
        self.log_file = log_file
        self.root = root
        self.scheduler = scheduler
        self.should_tail = should_tail

    def _terminal(self) -> bool:
        """Whether the app ended (or is gone)."""
        desc = self.scheduler.describe(self.app_id)
        return desc is None or desc.state.is_terminal()

    def __iter__(self) -> Iterator[str]:
        final = self._terminal()  # checked before reading: what follows was all written
        finished = finished_lines(self.log_file, root=self.root) if final else None
        if finished is not None:
            return finished
        return itertools.chain.from_iterable(self._chunks(final))  # cheaper per line than ``yield from``

    def _chunks(self, final: bool) -> Iterator[list[str]]:
        offset = 0
        while True:
            lines, offset, more = read_lines(self.log_file, offset, final, max_bytes=ITER_READ_BYTES, root=self.root)
            yield lines
            if more:
                continue
            if final or not self.should_tail:
                return
            time.sleep(TAIL_INTERVAL)
            final = self._terminal()
