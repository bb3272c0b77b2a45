"""Reading a node's CloudWatch Logs streams through a resumable cursor (docs/architecture.md, "Cursors").

A node has one stream per attempt, read in attempt order. The cursor records the stream
being read, the CloudWatch forward token of the page being read and how many events of that
page were already returned, so a reader restarted from a saved cursor re-requests the same
page and skips what it has seen: every event once, in order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from airflow_provider_torchx.core.schedulers.aws_batch.poller import RateLimiter, call_with_retry
from airflow_provider_torchx.core.schedulers.aws_batch.render import LOG_GROUP

#: Events per GetLogEvents page (the API's maximum).
PAGE = 10000


@dataclass
class LogCursor:
    """Where a reader stands: stream ``index`` (in attempt order), the forward ``token`` of
    the current page (None: the stream's head) and events of that page already returned."""

    index: int = 0
    token: str | None = None
    skip: int = 0

    @classmethod
    def load(cls, text: str | None) -> LogCursor:
        """Parse a cursor string (None: the start); a malformed one raises ``ValueError``."""
        if not text:
            return cls()
        try:
            data = json.loads(text)
            return cls(index=int(data["i"]), token=data["token"], skip=int(data["skip"]))
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"cursor: {text!r} is not a cursor returned by aws_batch read_log ({err})") from None

    def dump(self) -> str:
        """The opaque JSON string handed to callers."""
        return json.dumps({"i": self.index, "token": self.token, "skip": self.skip})


def _missing_stream(err: Exception) -> bool:
    import botocore.exceptions as bce

    return isinstance(err, bce.ClientError) and err.response.get("Error", {}).get("Code") == "ResourceNotFoundException"


def read_events(
    logs_client: Any,
    limiter: RateLimiter,
    streams: list[str],
    cursor: LogCursor,
    max_lines: int | None,
    terminal: bool,
) -> tuple[list[dict[str, Any]], LogCursor, bool]:
    """Events after ``cursor`` across ``streams``; the next cursor; whether the log is over.

    A stream that does not exist yet has no events yet. ``eof`` is true when the job is
    ``terminal`` and the last stream is drained. Never waits for new events.
    """
    events: list[dict[str, Any]] = []
    cur = LogCursor(cursor.index, cursor.token, cursor.skip)
    while cur.index < len(streams):
        drained = False
        while not drained:
            if max_lines is not None and len(events) >= max_lines:
                return events, cur, False
            limiter.acquire()
            kwargs: dict[str, Any] = {"nextToken": cur.token} if cur.token else {}
            try:
                resp = call_with_retry(
                    logs_client.get_log_events,
                    logGroupName=LOG_GROUP,
                    logStreamName=streams[cur.index],
                    startFromHead=True,
                    limit=PAGE,
                    **kwargs,
                )
            except Exception as err:
                if not _missing_stream(err):
                    raise
                return events, cur, False
            raw = resp.get("events", [])
            page = raw[cur.skip :]
            room = len(page) if max_lines is None else max_lines - len(events)
            events.extend(page[:room])
            if room < len(page):
                cur.skip += room
                return events, cur, False
            nxt = resp.get("nextForwardToken")
            if not raw or not nxt or nxt == cur.token:
                cur.skip += len(page)
                drained = True
            else:
                cur = LogCursor(cur.index, nxt, 0)
        if cur.index + 1 >= len(streams):
            break
        cur = LogCursor(cur.index + 1, None, 0)
    return events, cur, terminal and cur.index >= len(streams) - 1


def as_line(event: dict[str, Any]) -> str:
    """A log event's message as a line ending in ``"\\n"``."""
    msg = str(event.get("message", ""))
    return msg if msg.endswith("\n") else msg + "\n"
