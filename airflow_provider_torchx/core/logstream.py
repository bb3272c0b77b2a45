"""Follow every replica's log of one app through resumable cursors.

Used wherever logs are streamed while a job runs (the CLI's ``run --wait --log``, the Airflow
operator in the worker and the trigger): each ``poll()`` returns only lines not returned
before, and ``cursors`` can be saved and handed to a new follower (another process, a resumed
task) which then repeats and misses nothing (DESIGN.md, contract 2).
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple

from airflow_provider_torchx.core.specs import AppStatus

if TYPE_CHECKING:
    from airflow_provider_torchx.core.runner import Runner


class LogLine(NamedTuple):
    """One line of one replica (``line`` ends in ``"\\n"``)."""

    role: str
    k: int
    line: str

    def format(self) -> str:
        """``[role/k] line`` without the trailing newline, as shown in task logs."""
        return f"[{self.role}/{self.k}] {self.line.rstrip(chr(10))}"


def replica_key(role: str, k: int) -> str:
    """The key of a replica's cursor: ``"role/k"``."""
    return f"{role}/{k}"


class LogFollower:
    """Reads new lines of every replica of ``app_handle`` on each ``poll()``.

    ``cursors`` (a JSON-able ``{"role/k": cursor}``) says where each replica's reading stands;
    pass the saved dict back in to resume. Replicas are learnt from the app's status, so ones
    that appear late (a Batch job still starting) are picked up by a later poll.
    """

    def __init__(
        self,
        runner: Runner,
        app_handle: str,
        cursors: Mapping[str, str] | None = None,
        max_lines_per_poll: int | None = None,
    ) -> None:
        self.runner = runner
        self.app_handle = app_handle
        self.cursors: dict[str, str] = dict(cursors or {})
        self.max_lines_per_poll = max_lines_per_poll
        self._eof: dict[str, bool] = {}

    def poll(self, status: AppStatus | None = None) -> list[LogLine]:
        """New lines of every replica, in order per replica. ``status`` (if the caller just
        fetched it) saves a status call."""
        status = status or self.runner.status(self.app_handle)
        out: list[LogLine] = []
        if status is None:
            return out
        for role in status.roles:
            for rep in role.replicas:
                key = replica_key(role.role, rep.id)
                chunk = self.runner.read_log(
                    self.app_handle, role.role, rep.id, cursor=self.cursors.get(key), max_lines=self.max_lines_per_poll
                )
                self.cursors[key] = chunk.cursor
                self._eof[key] = chunk.eof
                out.extend(LogLine(role.role, rep.id, line) for line in chunk.lines)
        return out

    @property
    def drained(self) -> bool:
        """Whether every replica seen so far reported the end of its log."""
        return bool(self._eof) and all(self._eof.values())


def last_lines(runner: Runner, app_handle: str, role: str, k: int, n: int = 20) -> list[str]:
    """The last ``n`` lines of replica ``k`` of ``role`` (for failure messages); empty when the
    log cannot be read."""
    try:
        return list(collections.deque(runner.log_lines(app_handle, role, k), maxlen=n))
    except (ValueError, NotImplementedError):
        return []
