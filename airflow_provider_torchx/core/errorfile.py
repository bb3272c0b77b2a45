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
(``Scheduler.read_error_file``); elsewhere (AWS Batch: the file stays in the container) the summary in
the replica's log is what there is.

A rank that recorded nothing (no ``record``, or killed by a signal: a C++ abort) still wrote its
last words to stderr. ``dist.spmd`` has torchrun tee each rank's stderr into a file of its own
(``--tee 2``) below torchrun's log directory; where the scheduler reads those files
(``Scheduler.rank_stderr``: the local schedulers point ``$PET_LOG_DIR`` into the replica's log
directory) the root cause carries the failing rank's own last lines, found by the local rank
torchrun's summary names, and takes the exception and frames of its last Python traceback.
Elsewhere (AWS Batch: the files stay in the container; a role that set its own ``--log-dir``)
only the node's stderr is left, which the rank shares with its sibling ranks and torchrun: the
root cause then carries the node's lines from before torchrun reported the failure (torchrun's
own log lines left out), said to be the node's, and takes a Python traceback among them as the
rank's only when it is the node's one traceback and not a peer gone (``_PEER_GONE``: a sibling
rank's collateral error is never quoted as the rank's own).

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
   Within one node, the same: when torchrun's summary names a peer gone as its root cause (a
   sibling rank that lost the failing one, in the same second), another failure of the
   summary that is neither a peer gone nor torchrun's stop of its ranks (SIGTERM, SIGKILL) is
   the node's cause.
3. Reads at most ``MAX_REPLICAS`` replicas, ``SUMMARY_LINES`` log lines each (none of a
   replica whose lines the caller passes), the failing rank's own last ``SUMMARY_LINES``
   stderr lines where the scheduler keeps them (``rank_stderr``), else, where the scheduler
   reads stderr apart (``separate_stderr``), ``SUMMARY_LINES`` lines of the node's stderr.

One exit code: a root cause from torchrun carries the failing rank's own exit code (``4`` for
``sys.exit(4)``, ``-6`` for SIGABRT). The replica's process is torchrun, which exits 1 whatever
its rank did; that code is in the scheduler's reason, and ``failed_replica_note`` says whose it
is instead of repeating it.
"""

from __future__ import annotations

import collections
import dataclasses
import json
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
#: The variable torchrun takes its ``--log-dir`` from, and the local scheduler's directory for
#: it in the replica's log directory: torchrun keeps each rank's tee'd stderr there
#: (``dist.spmd``'s ``--tee 2``), which the root cause quotes.
RANK_LOGS_ENV = "PET_LOG_DIR"
RANK_LOGS_NAME = "ranks"
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
_LOCAL_RANK = re.compile(r"\blocal_rank:\s*(?P<rank>\d+)")
_BORDER = re.compile(r"^\s*=+\s*$")
_SECTION = re.compile(r"^\s*-{10,}\s*$")
_ENTRY = re.compile(r"^\s*\[\d+\]:\s*$")
_FAILURES_HEADER = "Failures:"
#: A line of torchrun's own log (glog form: level, date, time, pid, source).
_AGENT_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ (?P<pid>\d+) \S+\.py:\d+\] ")
#: torchrun's line on a failed worker: where its failure report starts.
_WORKER_FAILED = "failed (exitcode: "
_PY_TRACEBACK = "Traceback (most recent call last):"
#: faulthandler's list of a crashed process' extension modules: one long line of noise, left
#: out of a root cause's excerpt.
EXTENSION_MODULES = "Extension modules: "


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
    #: The last lines the failing rank wrote to stderr: its own (``own_stderr``), else its
    #: node's (``node_stderr``: every rank of the node and torchrun).
    stderr: tuple[str, ...] = ()
    own_stderr: bool = False
    #: The failing rank's rank on its node (torchrun's summary), which names its own files.
    local_rank: int | None = None

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
            whose = "its" if self.own_stderr else "its node's"
            return head + f"\n  Last lines of {whose} stderr:\n" + "\n".join(f"  {line}" for line in self.stderr)
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
    """``cause`` with the node's last stderr lines (``node_stderr``); a cause that recorded no
    traceback takes the exception and frames of a Python traceback there only when it is the
    node's one traceback and not a peer gone: the node's lines are its sibling ranks' too."""
    return _with_stderr(cause, stderr, own=False)


def with_rank_stderr(cause: RootCause, stderr: Sequence[str]) -> RootCause:
    """``cause`` with the failing rank's own last stderr lines; a cause that recorded no
    traceback takes the exception and frames of the last Python traceback there."""
    return _with_stderr(cause, [line.rstrip("\r\n") for line in stderr if line.strip()], own=True)


def _with_stderr(cause: RootCause, stderr: Sequence[str], own: bool) -> RootCause:
    stderr = [line for line in stderr if not line.startswith(EXTENSION_MODULES)]
    if not stderr:
        return cause
    shown = tuple(
        line if len(line) <= STDERR_WIDTH else line[:STDERR_WIDTH] + " ..." for line in stderr[-STDERR_LINES:]
    )
    cause = dataclasses.replace(cause, stderr=shown, own_stderr=own)
    starts = [i for i, line in enumerate(stderr) if line.strip() == _PY_TRACEBACK]
    if cause.frames or not starts or not cause.error.startswith(_NO_RECORD):
        return cause
    traceback = "\n".join(stderr[starts[-1] :])
    error = _exception_line(traceback)
    if not error or (not own and (len(starts) > 1 or _PEER_GONE.search(error))):
        return cause
    return dataclasses.replace(cause, error=error, frames=last_frames(traceback))


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
    ``lines``): rank, exit code and, when the worker recorded it, the traceback. torchrun's own
    root cause, unless that is a peer gone (``_PEER_GONE``: a rank that lost its sibling of the
    same node, reported in the same second) and one of the summary's other failures is not,
    nor the stop torchrun dealt its other ranks (SIGTERM, SIGKILL): that one then."""
    entries = _summary_entries(lines, replica)
    return _pick(entries) if entries else None


def _pick(entries: Sequence[RootCause]) -> RootCause:
    """Of a summary's failures (its root cause first), the one ``parse_torchrun_summary`` says."""
    root = entries[0]
    if not _PEER_GONE.search(root.error):
        return root
    own = [e for e in entries[1:] if not _PEER_GONE.search(e.error) and not _STOP.search(e.error)]
    return own[0] if own else root


def _summary_entries(lines: Sequence[str], replica: str) -> list[RootCause]:
    """The failures of torchrun's last summary in ``lines``: its root cause, then the others
    (``Failures:``); empty when there is none."""
    lines = [line.rstrip("\r\n") for line in lines]
    starts = [i for i, line in enumerate(lines) if _ROOT_CAUSE_HEADER in line]
    if not starts:
        return []
    entries = [_summary_entry(lines[starts[-1] + 1 :], replica)]
    others = [i for i in range(starts[-1]) if lines[i].strip() == _FAILURES_HEADER]
    if others:
        section: list[str] = []
        for line in lines[others[-1] + 1 : starts[-1]]:
            if _BORDER.match(line) or _SECTION.match(line):
                break
            if _ENTRY.match(line) and section:
                entries.append(_summary_entry(section, replica))
                section = []
            section.append(line)
        if any(_FIELD.match(line) for line in section):
            entries.append(_summary_entry(section, replica))
    return entries


def _summary_entry(lines: Sequence[str], replica: str) -> RootCause:
    """One failure of torchrun's summary, from its field lines on (``[0]:``, ``time``, ...,
    ``traceback``) to the end of ``lines`` or a border."""
    fields: dict[str, str] = {}
    traceback: list[str] = []
    for line in lines:
        if _BORDER.match(line) or _SECTION.match(line):
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
    local_rank = _LOCAL_RANK.search(fields.get("rank", ""))
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
        local_rank=int(local_rank["rank"]) if local_rank else None,
    )


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
    written = runner.read_error_file(app_handle, rep.role, rep.id) if capabilities.error_files else None
    cause = _recorded_cause(tail, written, replica)
    if cause is None:
        return None
    own = _rank_stderr(runner, app_handle, rep, cause.local_rank)
    if own:
        return with_rank_stderr(cause, own)
    stderr = node_stderr(_stderr_tail(runner, app_handle, rep) if capabilities.separate_stderr else tail)
    return with_node_stderr(cause, stderr)


def _rank_stderr(runner: Runner, app_handle: str, rep: ReplicaStatus, local_rank: int | None) -> list[str]:
    """The failing rank's own last stderr lines (``Runner.rank_stderr``); empty when torchrun
    named no local rank, or its file is missing, empty or refused (a file the job swapped for
    a symbolic link: the node's stderr is quoted instead)."""
    if local_rank is None:
        return []
    try:
        lines = runner.rank_stderr(app_handle, rep.role, rep.id, local_rank, SUMMARY_LINES)
    except (ValueError, NotImplementedError, OSError):
        return []
    return lines if lines and any(line.strip() for line in lines) else []


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
    entries = _summary_entries(tail, replica)
    summary = _pick(entries) if entries else None
    found = parse_error_file(written[0], replica) if written else None
    if found is None or (summary is not None and summary is not entries[0]):
        # The error file is a copy of torchrun's root cause's: not the rank picked instead.
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
        local_rank=summary.local_rank,
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
