"""A Batch job's replica logs: which streams hold a replica's output, and reading them
(docs/architecture.md, "Cursors"; docs/schedulers.md, "Batch on EKS").

The rules are pure functions over ``DescribeJobs`` entries (which node runs a replica, its
attempts' streams, the time window and the tail's pauses); ``JobLogs``, which the scheduler
composes, applies them with its lookups: the job's entry from the status poller, a node's
child job, the queue's compute environments. Below it, ``logs.py`` reads CloudWatch under
the process's ``LogBudget`` and ``eks_logs.py`` finds an EKS pod's Container Insights streams.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from airflow_provider_torchx.core.clock import SYSTEM_CLOCK, Clock
from airflow_provider_torchx.core.errors import UnknownAppError
from airflow_provider_torchx.core.schedulers.api import LogChunk, Stream, filter_regex
from airflow_provider_torchx.core.schedulers.aws_batch import eks, eks_logs, render, status
from airflow_provider_torchx.core.schedulers.aws_batch.logs import (
    LogCursor,
    as_line,
    list_streams,
    read_events,
    warn_once,
)
from airflow_provider_torchx.core.schedulers.aws_batch.poller import NOT_VISIBLE

if TYPE_CHECKING:
    from airflow_provider_torchx.core.schedulers.aws_batch.clients import AWSClients
    from airflow_provider_torchx.core.schedulers.aws_batch.preflight import QueueView

#: How old the job's entry in the status poller may be when a log read looks up its streams
#: (seconds). Streams change only when an attempt starts, so a somewhat older entry costs at
#: most a late first line; a terminal entry is always the cached one, so the drain sees the
#: end. A log read then never waits for the poller's next round on a watch-pool thread: with
#: thousands of jobs watched, a round takes seconds, and threads held that long starved the
#: pool that every trigger's end goes through.
LOG_STREAMS_MAX_AGE = 30.0
#: Pods' found log streams kept per scheduler (``JobLogs``).
MAX_POD_STREAMS = 10000
#: A tail's pause after a read that returned lines, and the longest it backs off to.
TAIL_PAUSE = 0.5
TAIL_MAX_PAUSE = 5.0


class LogTarget(NamedTuple):
    """A node's log: the ``streams`` of log ``group`` in attempt order, whether the log is over
    once they are drained (``terminal``), and how an event reads as a line."""

    group: str
    streams: list[str]
    terminal: bool
    line: Callable[[Mapping[str, Any]], str]


def check_stream(streams: Stream | None) -> None:
    """Refuse a stream other than the combined one: Batch logs hold stdout and stderr together."""
    if streams not in (None, Stream.COMBINED):
        raise ValueError(
            f"streams: {streams!r}; AWS Batch logs hold stdout and stderr together: use Stream.COMBINED or None"
        )


def replica_node(app_id: str, job: Mapping[str, Any], role_name: str, k: int) -> int:
    """The node index that runs replica ``k`` of ``role_name`` in ``job`` (a single-node job's
    only replica is node 0); ``ValueError`` naming what exists for an unknown role or replica."""
    ranges = render.node_ranges(job)
    for name, first, last, _ in ranges:
        if name == role_name:
            if not 0 <= k <= last - first:
                raise ValueError(f"k: role {role_name!r} of {app_id} has replicas 0..{last - first}, not {k}")
            return first + k
    raise ValueError(f"role_name: {role_name!r} is not a role of {app_id}; roles: {', '.join(r[0] for r in ranges)}")


def attempt_streams(entry: Mapping[str, Any]) -> list[str]:
    """Log streams of a job's (or node's child job's) attempts, oldest first, then the running
    attempt's; each stream once."""
    names: list[str] = []
    containers = [a.get("container") or {} for a in entry.get("attempts", [])] + [entry.get("container") or {}]
    for container in containers:
        name = container.get("logStreamName")
        if name and name not in names:
            names.append(str(name))
    return names


def container_target(entry: Mapping[str, Any], terminal: bool) -> LogTarget:
    """An ECS or Fargate node's log: its attempts' streams in Batch's log group."""
    return LogTarget(render.LOG_GROUP, attempt_streams(entry), terminal, as_line)


def in_window(
    events: Iterable[Mapping[str, Any]],
    since_ms: float | None,
    until_ms: float | None,
    line: Callable[[Mapping[str, Any]], str],
) -> tuple[list[str], bool]:
    """The lines of ``events`` stamped within ``[since_ms, until_ms]`` (epoch milliseconds;
    None: unbounded), and whether an event came after ``until_ms`` (the window is over: events
    arrive in time order)."""
    out: list[str] = []
    for event in events:
        stamp = float(event.get("timestamp", 0))
        if until_ms is not None and stamp > until_ms:
            return out, True
        if since_ms is None or stamp >= since_ms:
            out.append(line(event))
    return out, False


def next_pause(pause: float, read_any: bool) -> float:
    """A tail's next pause: ``TAIL_PAUSE`` after a read that returned events, else twice the
    last one, up to ``TAIL_MAX_PAUSE``."""
    return TAIL_PAUSE if read_any else min(pause * 2, TAIL_MAX_PAUSE)


def _epoch_ms(when: datetime | None) -> float | None:
    return when.timestamp() * 1000 if when else None


class JobLogs:
    """The replica logs of one scheduler's jobs, read through its ``aws`` clients.

    ``job(app_id, max_age)``: the job's poller entry (``NOT_VISIBLE``, or None: no such job);
    ``nodes(job, indexes)``: child jobs by node index; ``queue_view(queue)``: the queue's
    cached descriptions (an EKS job's log group when the job names none). An EKS pod's found
    streams are kept (up to ``MAX_POD_STREAMS``). ``clock``: the wall time a pod's shipping
    grace is measured by and the tail's pauses.
    """

    def __init__(
        self,
        aws: AWSClients,
        backend: str,
        job: Callable[[str, float], dict[str, Any] | None],
        nodes: Callable[[Mapping[str, Any], Iterable[int]], dict[int, dict[str, Any]]],
        queue_view: Callable[[str], QueueView],
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.aws, self.backend, self.clock = aws, backend, clock
        self._job, self._nodes, self._queue_view = job, nodes, queue_view
        self._lock = threading.Lock()
        self._pod_streams: dict[tuple[str, eks_logs.PodRef], list[str]] = {}

    def target(self, app_id: str, role_name: str, k: int, max_age: float = LOG_STREAMS_MAX_AGE) -> LogTarget | None:
        """The node's log (``LogTarget``); None while the job is not visible yet. Unknown
        app/role/replica raise. The job's entry may be ``max_age`` old (default
        ``LOG_STREAMS_MAX_AGE``: see there). An EKS job's streams are looked up by name
        (``_pod_target``): a running job's as far as the call budget allows now, a terminal
        job's waiting for its turns, as its reads do."""
        job = self._job(app_id, max_age)
        if job is None:
            raise UnknownAppError(f"app_id: no app {app_id!r} on {self.backend}")
        if job is NOT_VISIBLE:
            return None
        node = replica_node(app_id, job, role_name, k)
        child = self._nodes(job, [node]).get(node) if render.is_multinode(job) else None
        entry = child if child is not None else job
        terminal = status.has_ended(job)
        if eks.is_eks_job(entry) or eks.is_eks_job(job):
            return self._pod_target(app_id, job, entry, terminal, (app_id, role_name, k))
        return container_target(entry, terminal)

    def _pod_target(
        self,
        app_id: str,
        job: Mapping[str, Any],
        entry: Mapping[str, Any],
        terminal: bool,
        key: tuple[str, str, int],
    ) -> LogTarget:
        """An EKS node's log: its pods' Container Insights streams (``eks_logs``), found by
        name prefix (``DescribeLogStreams`` from the read's budget; a found stream is kept);
        without a log group, none, said once per job."""
        group = eks_logs.job_log_group(job.get("tags"), entry)
        why = ""
        if group is None:
            group, why = self._queue_log_group(app_id.partition(":")[0])
        if group is None:
            warn_once(
                ("eks-log-group", app_id),
                "aws_batch: no log lines for EKS job %s: no CloudWatch log group is known for its pods (%s); set the "
                "run option eks_log_group=/aws/containerinsights/CLUSTER/application (docs/schedulers.md, "
                '"Batch on EKS")',
                app_id,
                why,
            )
            return LogTarget(render.LOG_GROUP, [], terminal, eks_logs.line)
        budget = self.aws.log_budget

        def found(ref: eks_logs.PodRef) -> list[str] | None:
            slot = (group, ref)
            with self._lock:
                known = self._pod_streams.get(slot)
            if known:
                return known
            names = list_streams(self.aws.log_client, budget, key, group, eks_logs.stream_prefix(ref), wait=terminal)
            if names is None:
                return None
            names = [n for n in names if eks_logs.matches(ref, n)]
            if names:
                with self._lock:
                    self._pod_streams[slot] = names
                    if len(self._pod_streams) > MAX_POD_STREAMS:
                        del self._pod_streams[next(iter(self._pod_streams))]
            return names

        streams, complete = eks_logs.streams_in_order(eks_logs.pods(entry), found, self.clock.wall())
        return LogTarget(group, streams, terminal and complete, eks_logs.line)

    def _queue_log_group(self, queue: str) -> tuple[str | None, str]:
        """The log group of the single EKS cluster of ``queue`` (the queue check's cached
        descriptions), or None and why not."""
        try:
            envs = self._queue_view(queue).envs
        except Exception as err:
            return None, f"its queue {queue!r} could not be read: {err}"
        return eks_logs.queue_log_group(eks_logs.queue_clusters(envs))

    def _events(
        self,
        key: tuple[str, str, int],
        target: LogTarget | None,
        cursor: LogCursor,
        max_lines: int | None,
        *,
        wait: bool,
    ) -> tuple[Sequence[Mapping[str, Any]], LogCursor, bool, float | None]:
        """``read_events`` of ``target`` as reader ``key`` from the process's ``LogBudget``;
        without streams (none yet, or none at all: a job without a log group) nothing, over
        once the job is terminal, with no lag to tell."""
        if target is None or not target.streams:
            return [], cursor, target is not None and target.terminal, None
        budget = self.aws.log_budget
        return read_events(
            self.aws.log_client,
            budget,
            key,
            target.streams,
            cursor,
            max_lines,
            target.terminal,
            wait=wait,
            group=target.group,
        )

    def read(
        self,
        app_id: str,
        role_name: str,
        k: int,
        cursor: str | None,
        streams: Stream | None,
        max_lines: int | None,
    ) -> LogChunk:
        """Lines of replica ``k`` of ``role_name`` after ``cursor`` (see ``LogCursor``).

        CloudWatch calls come from the process's fair ``LogBudget``: a running job's read
        returns what its turn allows (``behind_s`` says how far it lags); a terminal job's
        read waits for its turns, so that draining it reaches the end."""
        check_stream(streams)
        start = LogCursor.load(cursor)
        target = self.target(app_id, role_name, k)
        wait = target is not None and target.terminal
        events, nxt, eof, behind = self._events((app_id, role_name, k), target, start, max_lines, wait=wait)
        line = target.line if target is not None else as_line
        return LogChunk(lines=[line(e) for e in events], cursor=nxt.dump(), eof=eof, behind_s=behind)

    def lines(
        self,
        app_id: str,
        role_name: str,
        k: int,
        regex: str | None,
        since: datetime | None,
        until: datetime | None,
        should_tail: bool,
        streams: Stream | None,
    ) -> Iterable[str]:
        """Lines of replica ``k`` of ``role_name`` within ``[since, until]`` matching
        ``regex``; with ``should_tail`` follows (pauses ``next_pause``) until the job ended and
        its log is drained. Unknown app/role/replica raise now, not on the first ``next``."""
        check_stream(streams)
        self.target(app_id, role_name, k)
        return filter_regex(regex, self._follow(app_id, role_name, k, since, until, should_tail))

    def _follow(
        self,
        app_id: str,
        role_name: str,
        k: int,
        since: datetime | None,
        until: datetime | None,
        should_tail: bool,
    ) -> Iterator[str]:
        since_ms, until_ms = _epoch_ms(since), _epoch_ms(until)
        cursor = LogCursor()
        pause = TAIL_PAUSE
        while True:
            # A tail sees the job's end within its own pause, not a log read's allowed age.
            target = self.target(app_id, role_name, k, max_age=pause if should_tail else LOG_STREAMS_MAX_AGE)
            events, cursor, eof, _ = self._events((app_id, role_name, k), target, cursor, None, wait=True)
            lines, over = in_window(events, since_ms, until_ms, target.line if target is not None else as_line)
            yield from lines
            if over or eof or not should_tail:
                return
            pause = next_pause(pause, bool(events))
            self.clock.sleep(pause)
