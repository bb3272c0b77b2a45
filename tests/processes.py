"""Finding a test's processes on the host by their environment."""

from __future__ import annotations

import psutil


def processes_with_env(**wanted: str) -> list[psutil.Process]:
    """Every live (not zombie) process on the host whose environment holds each of ``wanted``.
    A process that exits meanwhile is skipped: each is read once, inside one guard, since a
    replica's short-lived children come and go between any two reads."""
    found = []
    for p in psutil.process_iter():
        try:
            env = p.environ()
            if all(env.get(k) == v for k, v in wanted.items()) and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found
