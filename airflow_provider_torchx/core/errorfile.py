"""The root cause of a failed job: the first failing rank's exception, from torchrun.

torchrun (TorchElastic) gives each worker process an error file; a worker whose ``main`` is
decorated with ``torch.distributed.elastic.multiprocessing.errors.record`` writes its uncaught
exception there as JSON::

    {"message": {"message": "RuntimeError: boom",
                 "extraInfo": {"py_callstack": "Traceback ...", "timestamp": "1700000000"},
                 "errorCode": 1}}

(``errorCode`` only when torchrun copies it; an older/newer form has ``"message"`` as a plain
string and ``"timestamp"`` beside it). torchrun copies the first failure's file to the file its
own environment names in ``TORCHELASTIC_ERROR_FILE`` and prints a summary ("Root Cause (first
observed failure)", with the rank, exit code and traceback) in its log. A scheduler with the
``error_files`` capability sets ``TORCHELASTIC_ERROR_FILE`` for every replica to a file this host
can read (the local schedulers: ``error.json`` beside its logs) and names it
(``Scheduler.error_file``); elsewhere (AWS Batch: the file stays in the container) the summary in
the replica's log is what there is.

A rank that recorded nothing (no ``record``, or killed by a signal: a C++ abort) still wrote its
last words to stderr, which its node shares with its sibling ranks and torchrun: the root cause
then carries the node's stderr lines from before torchrun reported the failure (torchrun's own
log lines left out), and takes the exception and frames of a Python traceback among them.

Guarantees of ``find_root_cause``:

1. Never raises for unreadable or malformed files and logs: it returns None instead (the
   caller falls back to the log tail).
2. Of several failed replicas, one whose failure names a rank (torchrun's error file or
   summary) wins over one whose failure is torchrun's own (an agent's traceback, such as a
   rendezvous store lost when a sibling node went down: a consequence); then one whose error
   is not a peer gone (gloo's "Connection closed by peer", a lost store: also a consequence,
   often within the same second); then the one whose error is oldest (ties: the status'
   order), as torchrun picks its root cause among its workers. A failed job's replicas that
   were stopped after the first failure count too when torchrun reported a failed rank of
   theirs (not the stop): the first replica to end is not always the one that failed first.
3. Reads at most ``MAX_REPLICAS`` replicas, ``SUMMARY_LINES`` log lines each (none of a
   replica whose lines the caller passes), and, where the scheduler reads stderr apart
   (``separate_stderr``), ``SUMMARY_LINES`` lines of its stderr.

One exit code: a root cause from torchrun carries the failing rank's own exit code (``4`` for
``sys.exit(4)``, ``-6`` for SIGABRT). The replica's process is torchrun, which exits 1 whatever
its rank did; that code is in the scheduler's reason, and ``failed_replica_note`` says whose it
is instead of repeating it.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_provider_torchx.core.schedulers.api import SchedulerCapabilities, Stream
from airflow_provider_torchx.core.specs import AppState, AppStatus, ReplicaStatus, parse_app_handle

if TYPE_CHECKING:
    from airflow_provider_torchx.core.runner import Runner

#: The variable naming the error file of a process (TorchElastic's name).
ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"
#: The local scheduler's error file of a replica, in the replica's log directory.
ERROR_FILE_NAME = "error.json"
#: How many of the traceback's last frames the root cause shows.
FRAMES = 3
#: How many failed replicas are examined, and how many of their last log lines.
MAX_REPLICAS = 8
SUMMARY_LINES = 200
#: How many of the node's last stderr lines a root cause shows, and the most characters of each.
STDERR_LINES, STDERR_WIDTH = 10, 300

_ROOT_CAUSE_HEADER = "Root Cause (first observed failure):"
_NO_RECORD = "the worker recorded no traceback"
_NO_TRACEBACK = "To enable traceback see"
_FIELD = re.compile(r"^\s*(?P<key>time|host|rank|exitcode|error_file|traceback)\s*:\s?(?P<value>.*)$")
_RANK = re.compile(r"^(?P<rank>-?\d+)")
_BORDER = re.compile(r"^\s*=+\s*$")
#: A line of torchrun's own log (glog form: level, date, time, pid, source).
_AGENT_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ (?P<pid>\d+) \S+\.py:\d+\] ")
#: torchrun's line on a failed worker: where its failure report starts.
_WORKER_FAILED = "failed (exitcode: "
_PY_TRACEBACK = "Traceback (most recent call last):"


@dataclass(frozen=True)
class RootCause:
    """Why a replica failed: ``error`` (``Type: message``), the replica (``role/k``), the
    global ``rank`` and ``exit_code`` when torchrun said, the last ``frames`` of the traceback
    (source lines included) and when the error was recorded (epoch seconds)."""

    error: str
    replica: str
    rank: int | None = None
    exit_code: int | None = None
    frames: tuple[str, ...] = ()
    timestamp: float | None = None
    #: The last lines the failing rank's node wrote to stderr (``node_stderr``).
    stderr: tuple[str, ...] = ()

    def format(self) -> str:
        """``Root cause (rank 1, replica trainer/0): RuntimeError: boom`` and the last frames."""
        where = ", ".join(
            part
            for part in (
                f"rank {self.rank}" if self.rank is not None else "",
                f"replica {self.replica}",
                f"exit code {self.exit_code}" if self.exit_code is not None else "",
            )
            if part
        )
        head = f"Root cause ({where}): {self.error}"
        if self.frames:
            return head + "\n  Last frames of its traceback:\n" + "\n".join(f"  {line}" for line in self.frames)
        if self.stderr:
            return head + "\n  Last lines of its node's stderr:\n" + "\n".join(f"  {line}" for line in self.stderr)
        return head


def node_stderr(lines: Sequence[str]) -> list[str]:
    """What the ranks of a node wrote to stderr before torchrun reported the failure: the
    non-blank lines of ``lines`` (the node's stderr, or its whole log) before torchrun's last
    ``failed (exitcode: ...)`` line, without torchrun's own log lines. Empty when ``lines``
    hold no such report."""
    lines = [line.rstrip("\r\n") for line in lines]
    reports = [
        (i, m["pid"]) for i, line in enumerate(lines) if (m := _AGENT_LINE.match(line)) and _WORKER_FAILED in line
    ]
    if not reports:
        return []
    end, agent = reports[-1]
    return [line for line in lines[:end] if line.strip() and not ((m := _AGENT_LINE.match(line)) and m["pid"] == agent)]


def with_node_stderr(cause: RootCause, stderr: Sequence[str]) -> RootCause:
    """``cause`` with the node's last stderr lines; a cause that recorded no traceback takes the
    exception and frames of the last Python traceback the node printed."""
    if not stderr:
        return cause
    shown = tuple(
        line if len(line) <= STDERR_WIDTH else line[:STDERR_WIDTH] + " ..." for line in stderr[-STDERR_LINES:]
    )
    cause = dataclasses.replace(cause, stderr=shown)
    starts = [i for i, line in enumerate(stderr) if line.strip() == _PY_TRACEBACK]
    if cause.frames or not starts or not cause.error.startswith(_NO_RECORD):
        return cause
    traceback = "\n".join(stderr[starts[-1] :])
    error = _exception_line(traceback)
    return dataclasses.replace(cause, error=error or cause.error, frames=last_frames(traceback)) if error else cause


def last_frames(traceback: str, n: int = FRAMES) -> tuple[str, ...]:
    """The last ``n`` frames (``File ...`` line and its source lines) of the innermost
    traceback in ``traceback``; caret lines (``^^^``) are dropped. Indentation is not relied
    on (some log pipelines strip it): the last line is the exception, the lines between two
    ``File`` lines are the first one's source."""
    body = traceback.rsplit("Traceback (most recent call last):", 1)[-1]
    lines = [line.strip() for line in body.splitlines() if line.strip() and set(line.strip()) - set("^~ ")]
    frames: list[list[str]] = []
    for line in lines[:-1]:
        if line.startswith('File "'):
            frames.append([line])
        elif frames:
            frames[-1].append("  " + line)
    return tuple(line for frame in frames[-n:] for line in frame)


def _exception_line(traceback: str) -> str:
    """The last line of a traceback that is not indented (``Type: message``)."""
    lines = [line for line in traceback.splitlines() if line.strip() and not line.startswith(" ")]
    return lines[-1].strip() if lines else ""


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def parse_error_file(text: str, replica: str) -> RootCause | None:
    """The root cause an error file's JSON holds (see the module docstring); None if it is not
    such a file."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    message = data.get("message") if isinstance(data, dict) else None
    if isinstance(message, str) and message.strip():
        return RootCause(error=message.strip(), replica=replica, timestamp=_int(data.get("timestamp")))
    if not isinstance(message, dict):
        return None
    extra = message.get("extraInfo")
    extra = extra if isinstance(extra, dict) else {}
    callstack = str(extra.get("py_callstack") or "")
    error = str(message.get("message") or "").strip() or _exception_line(callstack)
    if not error:
        return None
    return RootCause(
        error=error,
        replica=replica,
        exit_code=_int(message.get("errorCode")),
        frames=last_frames(callstack),
        timestamp=_int(extra.get("timestamp")),
    )


def parse_torchrun_summary(lines: Sequence[str], replica: str) -> RootCause | None:
    """The root cause torchrun printed in its ``ChildFailedError`` summary (the last one in
    ``lines``): rank, exit code and, when the worker recorded it, the traceback."""
    lines = [line.rstrip("\r\n") for line in lines]
    starts = [i for i, line in enumerate(lines) if _ROOT_CAUSE_HEADER in line]
    if not starts:
        return None
    fields: dict[str, str] = {}
    traceback: list[str] = []
    for line in lines[starts[-1] + 1 :]:
        if _BORDER.match(line):
            break
        if traceback:
            traceback.append(line[2:] if line.startswith("  ") else line)
            continue
        m = _FIELD.match(line)
        if m:
            fields[m["key"]] = m["value"].strip()
            if m["key"] == "traceback":
                traceback.append(m["value"])
    rank = _RANK.match(fields.get("rank", ""))
    code = _RANK.match(fields.get("exitcode", ""))
    text = "\n".join(traceback).strip()
    if text.startswith(_NO_TRACEBACK) or not text:
        error = _NO_RECORD + ": decorate its main function with torch.distributed.elastic.multiprocessing.errors.record"
        frames: tuple[str, ...] = ()
    else:
        error = _exception_line(text) or text.splitlines()[-1].strip()
        frames = last_frames(text)
    return RootCause(
        error=error,
        replica=replica,
        rank=int(rank["rank"]) if rank else None,
        exit_code=int(code["rank"]) if code else None,
        frames=frames,
    )


def _error_file(runner: Runner, app_handle: str, rep: ReplicaStatus) -> tuple[str, float] | None:
    """The text of a replica's error file, if it wrote one where this host reads it
    (``Runner.error_file``), and when it was written (the file's time: finer than the whole
    seconds inside, so that of two replicas failing in the same second the first one is told
    apart)."""
    path = runner.error_file(app_handle, rep.role, rep.id)
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(), os.fstat(f.fileno()).st_mtime
    except OSError:
        return None


def _replica_root_cause(
    runner: Runner,
    app_handle: str,
    rep: ReplicaStatus,
    capabilities: SchedulerCapabilities,
    tail: Sequence[str] | None,
) -> RootCause | None:
    replica = f"{rep.role}/{rep.id}"
    if tail is None:
        # Imported here: the local scheduler imports this module for its constants, and a
        # CLI ``list`` or ``status`` has no use for the log machinery.
        from airflow_provider_torchx.core.logstream import last_lines

        tail = last_lines(runner, app_handle, rep.role, rep.id, SUMMARY_LINES)
    stderr = node_stderr(_stderr_tail(runner, app_handle, rep) if capabilities.separate_stderr else tail)
    written = _error_file(runner, app_handle, rep) if capabilities.error_files else None
    cause = _recorded_cause(tail, written, replica)
    return with_node_stderr(cause, stderr) if cause is not None else None


def _stderr_tail(runner: Runner, app_handle: str, rep: ReplicaStatus) -> list[str]:
    """The last ``SUMMARY_LINES`` lines of a replica's stderr (empty if unreadable)."""
    try:
        lines = runner.log_lines(app_handle, rep.role, rep.id, streams=Stream.STDERR)
        return list(collections.deque(lines, maxlen=SUMMARY_LINES))
    except (ValueError, NotImplementedError, OSError):
        return []


def _recorded_cause(tail: Sequence[str], written: tuple[str, float] | None, replica: str) -> RootCause | None:
    """The cause from torchrun's summary in ``tail`` and the replica's error file ``written``
    (its text and time)."""
    summary = parse_torchrun_summary(tail, replica)
    found = parse_error_file(written[0], replica) if written else None
    if found is None:
        return summary
    if written:
        found = dataclasses.replace(found, timestamp=written[1])
    if summary is None:
        return found
    return RootCause(
        error=found.error,
        replica=replica,
        rank=summary.rank,
        exit_code=found.exit_code if found.exit_code is not None else summary.exit_code,
        frames=found.frames or summary.frames,
        timestamp=found.timestamp,
    )


def failed_replica_note(rep: ReplicaStatus, cause: RootCause | None) -> str:
    """How a failure report names its failed replica after the scheduler's reason:
    ``; failed replica trainer/1, exit code 1``. When ``cause`` is a torchrun rank of that
    replica with the rank's own exit code, the replica's code (torchrun's, already in the
    reason) is said to be torchrun's rather than repeated: ``; failed replica trainer/1
    (torchrun's exit code for its failed rank 3)``, so the report's one exit code for the
    failure is the rank's, in the root cause."""
    replica = f"{rep.role}/{rep.id}"
    if cause is not None and cause.replica == replica and cause.rank is not None and cause.exit_code is not None:
        return f"; failed replica {replica} (torchrun's exit code for its failed rank {cause.rank})"
    code = f", exit code {rep.exit_code}" if rep.exit_code is not None else ""
    return f"; failed replica {replica}{code}"


def _candidates(status: AppStatus) -> Iterable[tuple[ReplicaStatus, bool]]:
    """The failed replicas, then (of a failed job) those stopped after a sibling failed, each
    with whether it was stopped. A node whose rank failed can take a while to exit, and a
    sibling that fails because of it (its rendezvous store gone) can end first: the stopped
    node is then the one whose error file holds the root cause."""
    replicas = [rep for role in status.roles for rep in role.replicas]
    yield from ((rep, False) for rep in replicas if rep.state == AppState.FAILED)
    if status.state == AppState.FAILED:
        yield from ((rep, True) for rep in replicas if rep.state == AppState.CANCELLED)


def _counts(cause: RootCause, stopped: bool) -> bool:
    """A stopped replica's cause counts only if torchrun reported a rank's failure (a rank),
    and not the stop itself (torchrun's ``SignalException``, a rank's SIGTERM or SIGKILL)."""
    if not stopped:
        return True
    return cause.rank is not None and not cause.error.startswith("SignalException") and not _STOP.search(cause.error)


_STOP = re.compile(r"\bSIG(TERM|KILL)\b")


#: Errors that report a peer gone (its process ended, its store closed), not a failure of the
#: rank's own: the ranks of the node that failed first see them a moment later, often within
#: the same second as the failure they follow (gloo, NCCL, c10d store).
_PEER_GONE = re.compile(
    r"Connection closed by peer|Connection reset by peer|remote worker crashing|RendezvousConnectionError"
    r"|ncclRemoteError|remote process exited",
    re.IGNORECASE,
)


def root_cause_of(causes: Sequence[RootCause]) -> RootCause | None:
    """The root cause among the replicas' ``causes`` (guarantee 2): a failed rank first, then
    one that is not a peer gone (``_PEER_GONE``), then the oldest error, then the first given."""
    if not causes:
        return None
    return min(
        causes,
        key=lambda c: (
            c.rank is None,
            bool(_PEER_GONE.search(c.error)),
            c.timestamp if c.timestamp is not None else float("inf"),
        ),
    )


def find_root_cause(
    runner: Runner, app_handle: str, status: AppStatus, tails: Mapping[tuple[str, int], Sequence[str]] | None = None
) -> RootCause | None:
    """The root cause of the failed job ``app_handle`` (see the module's guarantees).
    ``tails``: the last ``SUMMARY_LINES`` log lines of replicas the caller read already, by
    ``(role, k)`` (not read again)."""
    capabilities = runner.capabilities(parse_app_handle(app_handle).scheduler_backend)
    causes: list[RootCause] = []
    for i, (rep, stopped) in enumerate(_candidates(status)):
        if i >= MAX_REPLICAS:
            break
        try:
            cause = _replica_root_cause(runner, app_handle, rep, capabilities, (tails or {}).get((rep.role, rep.id)))
        except Exception:  # a root cause is a bonus: never fail the failure report for it
            cause = None
        if cause is not None and _counts(cause, stopped):
            causes.append(cause)
    return root_cause_of(causes)
