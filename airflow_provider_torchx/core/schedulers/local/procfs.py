"""Processes seen through ``/proc`` (Linux), with their identity.

A process is identified by ``(pid, start)`` where ``start`` is its start time in clock ticks
since boot: a reused pid has another start time, so a recorded process is never confused with
a newcomer. Signals go through a pidfd opened *before* the identity check, which leaves no
window for the pid to be reused between the check and the signal.

Standard library only: the per-job supervisor imports this at start-up, before it starts the
replicas, so ``signal`` (its enums) is imported where a signal is sent.
"""

from __future__ import annotations

import os
import time

TYPE_CHECKING = False  # not ``typing``/``collections``: the supervisor's start-up
if TYPE_CHECKING:
    from collections.abc import Iterable


class ProcInfo:
    """One live (non-zombie) process (a plain class: ``typing`` is too slow to import here)."""

    __slots__ = ("comm", "pgrp", "pid", "ppid", "sid", "start")

    def __init__(self, pid: int, ppid: int, pgrp: int, sid: int, start: int, comm: str = "") -> None:
        self.pid, self.ppid, self.pgrp, self.sid, self.start, self.comm = pid, ppid, pgrp, sid, start, comm


def _parse_stat(pid: int, text: str) -> ProcInfo | None:
    # "pid (comm) state ppid pgrp session ... starttime(22nd field)"; comm may hold spaces/parens.
    end = text.rindex(")")
    rest = text[end + 2 :].split()
    if rest[0] in ("Z", "X"):
        return None
    comm = text[text.index("(") + 1 : end]
    return ProcInfo(pid=pid, ppid=int(rest[1]), pgrp=int(rest[2]), sid=int(rest[3]), start=int(rest[19]), comm=comm)


_BOOT_ID: list[str] = []


def boot_id() -> str:
    """This boot of the host (pids and start times only mean something within one boot)."""
    if not _BOOT_ID:
        with open("/proc/sys/kernel/random/boot_id") as f:
            _BOOT_ID.append(f.read().strip())
    return _BOOT_ID[0]


def proc_info(pid: int) -> ProcInfo | None:
    """The process ``pid``, or None when it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return _parse_stat(pid, f.read())
    except (OSError, ValueError, IndexError):
        return None


def start_time(pid: int) -> int | None:
    """The start time of ``pid`` (clock ticks since boot), or None when gone or a zombie."""
    info = proc_info(pid)
    return info.start if info else None


def is_alive(pid: int | None, start: int | None) -> bool:
    """Whether the process recorded as ``(pid, start)`` still runs (not reused, not a zombie)."""
    return pid is not None and start is not None and start_time(pid) == start


def children(pid: int) -> list[int] | None:
    """The pids of the children of ``pid`` (None when the kernel does not tell)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        out: list[int] = []
        for tid in tasks:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
        return out
    except OSError:
        return None


def descendants(pid: int) -> list[ProcInfo]:
    """The live descendants of ``pid``, found by walking the kernel's child lists (cheaper
    than ``scan``; a child forked during the walk may be missed, so callers repeat it)."""
    out: list[ProcInfo] = []
    todo = [pid]
    while todo:
        for child in children(todo.pop()) or []:
            info = proc_info(child)
            if info is not None:
                out.append(info)
                todo.append(child)
    return out


def tree(roots: Iterable[tuple[int, int]], exclude: int | None = None) -> list[ProcInfo] | None:
    """The live ``roots`` (``(pid, start)``) and their descendants, from the kernel's child
    lists: a few reads per process of the tree instead of one per process of the host
    (``scan``). None when the kernel does not list children. A child forked during the walk
    may be missed (``descendants``)."""
    found: dict[int, ProcInfo] = {}
    for pid, start in roots:
        info = proc_info(pid)
        if info is None or info.start != start:
            continue
        if children(pid) is None:
            return None
        found[pid] = info
        found.update((p.pid, p) for p in descendants(pid))
    found.pop(exclude or -1, None)
    return list(found.values())


def scan() -> list[ProcInfo]:
    """Every live process on the host."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            info = proc_info(int(name))
            if info is not None:
                out.append(info)
    return out


def cmdline(pid: int) -> list[str] | None:
    """The argv of ``pid``, or None when it is gone (or a kernel thread, with none)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return [arg.decode(errors="replace") for arg in raw.split(b"\0")[:-1]] or None


def has_env(pid: int, marker: bytes) -> bool:
    """Whether the environment of ``pid`` holds the ``KEY=value`` ``marker``."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return b"\0" + marker + b"\0" in b"\0" + f.read()
    except OSError:
        return False


def job_processes(
    sid: int | None, roots: Iterable[tuple[int, int]], exclude: int | None = None, env_marker: str | None = None
) -> list[ProcInfo]:
    """The processes of a job: members of session ``sid``, the live ``roots`` (``(pid, start)``),
    those whose environment holds ``env_marker`` (``KEY=value``; this finds processes that left
    both the session and their parent) and every descendant of those."""
    procs = scan()
    root_ids = set(roots)
    marker = env_marker.encode() if env_marker else None
    chosen = {
        p.pid: p
        for p in procs
        if (sid and p.sid == sid) or (p.pid, p.start) in root_ids or (marker and has_env(p.pid, marker))
    }
    children: dict[int, list[ProcInfo]] = {}
    for p in procs:
        children.setdefault(p.ppid, []).append(p)
    todo = list(chosen)
    while todo:
        for child in children.get(todo.pop(), []):
            if child.pid not in chosen:
                chosen[child.pid] = child
                todo.append(child.pid)
    chosen.pop(exclude or -1, None)
    return list(chosen.values())


def open_if_same(pid: int, start: int) -> int | None:
    """A pidfd of ``pid`` if it still is the process that started at ``start``, else None."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return None
    if start_time(pid) != start:
        os.close(fd)
        return None
    return fd


def signal_if_same(pid: int, start: int, sig: int) -> bool:
    """Send ``sig`` to ``pid`` only if it still is the process that started at ``start``."""
    import signal

    fd = open_if_same(pid, start)
    if fd is None:
        return False
    try:
        signal.pidfd_send_signal(fd, sig)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def kill_job(
    sid: int | None,
    roots: Iterable[tuple[int, int]],
    exclude: int | None = None,
    env_marker: str | None = None,
    passes: int = 20,
) -> list[ProcInfo]:
    """SIGKILL every process of a job (as ``job_processes`` finds them) and return those
    killed. It scans again until two scans in a row find nothing (at most ``passes`` scans):
    a scan can miss a process forked while it ran, when the parent exited before the scan
    read it (a double-forking daemon), and the next scan finds it."""
    import signal

    roots = list(roots)
    killed: dict[tuple[int, int], ProcInfo] = {}
    empty = 0
    for _ in range(passes):
        procs = job_processes(sid, roots, exclude, env_marker)
        if not procs:
            empty += 1
            if empty == 2:
                break
            continue
        empty = 0
        signal_all(procs, signal.SIGKILL)
        killed.update(((p.pid, p.start), p) for p in procs)
        time.sleep(0.002)
    return list(killed.values())


def signal_all(procs: Iterable[ProcInfo], sig: int) -> int:
    """Signal each process (identity-checked); return how many were signalled."""
    sent = 0
    for p in procs:
        sent += signal_if_same(p.pid, p.start, sig)
    return sent
