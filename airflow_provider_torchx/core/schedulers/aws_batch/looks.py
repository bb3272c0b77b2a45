"""A look at a Batch job for the poller's futures (``describe_future_as``,
``describe_on_loop_as``): the job's entry, then, for a multi-node job that ended, its nodes'
child jobs ``jobId#N``, whose exit codes describe the end (docs/architecture.md, "Economical
polling"). The node rules are pure functions over ``DescribeJobs`` entries; ``Look`` chains
the poller's two answers on the poller's thread.
"""

from __future__ import annotations

import concurrent.futures
import functools
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from airflow_provider_torchx.core.schedulers.api import DescribeAppResponse, settle, settle_on_loop
from airflow_provider_torchx.core.schedulers.aws_batch import render, status
from airflow_provider_torchx.core.schedulers.aws_batch.poller import NOT_VISIBLE, StatusPoller, answer_jobs

if TYPE_CHECKING:
    import asyncio

R = TypeVar("R")
#: How old an ended job's child jobs may be in the poller's cache (seconds): a node that
#: ended does not change.
ENDED_NODES_MAX_AGE = 3600.0
#: What describes a job from its entry and its nodes' child jobs (the scheduler's response).
Respond = Callable[[str, dict[str, Any] | None, dict[int, dict[str, Any]]], DescribeAppResponse | None]


def ended_nodes(job: Mapping[str, Any] | None) -> range:
    """The nodes whose child jobs describe ``job``'s end: all of an ended job's, else none."""
    if not job or job is NOT_VISIBLE or not status.has_ended(job) or not render.is_multinode(job):
        return range(0)
    return range(int((job.get("nodeProperties") or {}).get("numNodes", 0)))


def node_ids(job: Mapping[str, Any], nodes: Iterable[int]) -> dict[str, int]:
    """The child job ids ``jobId#N`` of ``nodes``, to their node index."""
    return {f"{job['jobId']}#{n}": n for n in nodes}


def by_node(ids: Mapping[str, int], found: Mapping[str, dict[str, Any] | None]) -> dict[int, dict[str, Any]]:
    """The child jobs ``found`` (by id) by node index, those not described (yet) left out."""
    return {ids[i]: c for i, c in found.items() if c is not None and c is not NOT_VISIBLE}


def _reraise(err: BaseException) -> Any:
    raise err


class Look(Generic[R]):
    """One look at an app's job for ``describe_future_as`` and ``describe_on_loop_as``,
    called with the poller's answer: the job, then, for a multi-node job that ended, its
    nodes' child jobs (``nodes``); described (``respond``), mapped by ``then`` on the
    poller's thread and handed to ``future`` (on its loop when it is an asyncio one). A look
    waits a whole poll, so whatever it holds outlives the collector's young generations and
    hastens the next full collection, which holds a triggerer's loop for hundreds of
    milliseconds at 5,000 watched jobs: one slotted object, not closures."""

    __slots__ = ("app_id", "future", "ids", "job", "job_id", "poller", "respond", "then")

    def __init__(
        self,
        respond: Respond,
        poller: StatusPoller,
        app_id: str,
        job_id: str,
        then: Callable[[DescribeAppResponse | None], R],
        future: concurrent.futures.Future[R] | asyncio.Future[R],
    ) -> None:
        self.respond, self.poller, self.app_id, self.job_id = respond, poller, app_id, job_id
        self.then, self.future = then, future
        self.job: dict[str, Any] | None = None
        self.ids: dict[str, int] = {}

    def __call__(self, answer: dict[str, dict[str, Any] | None] | BaseException) -> None:
        """The job's answer: describe it, or first ask for its ended nodes."""
        try:
            self.job = job = answer_jobs(answer)[self.job_id]
            ended = ended_nodes(job)
            if not job or not ended:
                self._deliver({})
                return
            self.ids = node_ids(job, ended)
            self.poller.request_then(self.future, self.nodes, list(self.ids), max_age=ENDED_NODES_MAX_AGE)
        except BaseException as err:
            self._settle(functools.partial(_reraise, err))

    def nodes(self, found: dict[str, dict[str, Any] | None] | BaseException) -> None:
        """The answer for the job's nodes: describe the job with them."""
        try:
            self._deliver(by_node(self.ids, answer_jobs(found)))
        except BaseException as err:
            self._settle(functools.partial(_reraise, err))

    def _deliver(self, nodes: dict[int, dict[str, Any]]) -> None:
        self._settle(lambda: self.then(self.respond(self.app_id, self.job, nodes)))

    def _settle(self, compute: Callable[[], R]) -> None:
        if isinstance(self.future, concurrent.futures.Future):
            settle(self.future, compute)
        else:
            settle_on_loop(self.future.get_loop(), self.future, compute)
