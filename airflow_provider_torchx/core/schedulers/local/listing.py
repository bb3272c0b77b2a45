"""What a listing shows of the local job store: one summary per job (backend, name, labels,
submission, state, start and end), from the store's index of ended jobs
(``store.FINISHED_INDEX``) for those that ended and from the others' records, and
``Scheduler.list``'s answers built from the summaries. Also which ended jobs a prune removes
(``prunable``, pure)."""

from __future__ import annotations

import heapq
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from airflow_provider_torchx.core.schedulers.api import ListAppResponse, labels_match
from airflow_provider_torchx.core.schedulers.local import store
from airflow_provider_torchx.core.schedulers.local.record import TERMINAL_NAMES, JobRecords
from airflow_provider_torchx.core.specs import AppState

log = logging.getLogger(__name__)
#: ``AppState`` by name: a dict lookup, cheaper than ``AppState[name]`` when listing thousands.
_STATES = {s.name: s for s in AppState}

Summaries = dict[str, dict[str, Any]]


def summary_key(item: tuple[str, Mapping[str, Any]]) -> tuple[float, str]:
    """Oldest first: by submission time, then app id (``Scheduler.list``'s order)."""
    return (item[1]["created"] or 0.0, item[0])


def summary(rec: Mapping[str, Any], st: Mapping[str, Any] | None) -> dict[str, Any]:
    """What a listing shows of the job of request record ``rec`` in state ``st`` (None: not
    read, so without ``state``, ``started`` and ``ended``); ``orphaned`` when its end is
    reported, not recorded (``finalize`` records it)."""
    entry = {"backend": rec["backend"], "name": rec["app_name"], "labels": rec["labels"], "created": rec["created"]}
    if st is not None:
        entry.update(state=st["state"], started=st.get("started"), ended=st.get("ended"))
        if st.get("orphaned"):
            entry["orphaned"] = True
    return entry


def prunable(summaries: Mapping[str, Mapping[str, Any]], *, cutoff: float, states: Iterable[str] = ()) -> list[str]:
    """The app ids of the ended jobs of ``summaries`` (in one of ``states`` if given) that
    ended (or, without an end, were submitted) at ``cutoff`` or before, oldest first."""
    wanted = {s.upper() for s in states}
    return [
        app_id
        for _, app_id in sorted(
            (entry.get("ended") or entry["created"], app_id)
            for app_id, entry in summaries.items()
            if entry["state"] in TERMINAL_NAMES
            and (not wanted or entry["state"] in wanted)
            and (entry.get("ended") or entry["created"]) <= cutoff
        )
    ]


class Listing:
    """The listings of the store ``job_store`` (read through ``records``) for the scheduler
    ``backend``. The index of ended jobs is filtered once per parse, and ``list``'s answers of
    ended jobs are built once per process and shared (they never change)."""

    def __init__(self, job_store: store.JobStore, records: JobRecords, backend: str) -> None:
        self.store = job_store
        self.records = records
        self.backend = backend
        # app id -> what ``list`` answers for an ended job (it never changes).
        self._ended_answers: dict[str, ListAppResponse] = {}
        # The ended entries of the index as last parsed, by that parse.
        self._ended_index: tuple[dict[str, Any], dict[str, Any]] | None = None

    def summaries(self, states: bool = True) -> Summaries:
        """What a listing shows of every job of the store (any local backend): app id ->
        ``summary``. Ended jobs come from the store's index; only the others' files are read,
        and those found ended are added to it. A job whose record is refused
        (``CorruptEntryError``) is still a job: listed while its supervisor runs (``refused``),
        skipped (logged) once none does.
        ``states`` False: the jobs not in the index have no ``state`` or ``ended`` (their state
        files are not read: what matching by backend and labels needs)."""
        index = self.store.finished()  # the same dict while the file is unchanged
        if self._ended_index is None or self._ended_index[0] is not index:
            ended = {k: v for k, v in index.items() if isinstance(v, dict) and v.get("state") in TERMINAL_NAMES}
            self._ended_index = (index, ended)
        ended = self._ended_index[1]
        present = self.store.app_ids()
        found: Summaries = {app_id: ended[app_id] for app_id in present & ended.keys()}
        learned = {}
        refused: dict[str, store.CorruptEntryError] = {}
        for app_id in present - ended.keys():
            try:
                rec = self.records.request(app_id)
                if rec is None:
                    continue
                st = self.records.state(app_id, rec) if states else None
            except store.CorruptEntryError as e:
                refused[app_id] = e
                continue
            found[app_id] = entry = summary(rec, st)
            if st is not None and not st.get("orphaned") and st["state"] in TERMINAL_NAMES:
                learned[app_id] = entry
        if learned:
            self.store.record_finished(learned, present)
        if refused:
            found.update(self.refused(refused))
        return found

    def refused(self, errors: Mapping[str, store.CorruptEntryError]) -> Summaries:
        """What a listing shows of the jobs whose record is refused (app id -> the refusal)
        while a supervisor of theirs runs (they may be running; one ``/proc`` scan for all):
        state ``UNKNOWN``, ``refused`` the refusal, and what the request record says when that
        can still be read (else no backend, which every local backend lists, no labels and no
        name). Those with none running are skipped, each with a warning."""
        running = self.records.running_supervisors(errors)
        found: Summaries = {}
        for app_id, err in errors.items():
            if app_id not in running:
                log.warning("list: skipping %s (no supervisor of it runs)", err)
                continue
            try:
                rec = self.records.request(app_id)
            except store.CorruptEntryError:
                rec = None
            entry = summary(rec, None) if rec else {"backend": None, "name": "", "labels": {}, "created": None}
            entry.update(state=AppState.UNKNOWN.name, started=None, ended=None, refused=str(err))
            found[app_id] = entry
        return found

    def matching(self, summaries: Summaries, labels: Mapping[str, str] | None) -> list[tuple[str, dict[str, Any]]]:
        """``(app id, summary)`` of this backend's jobs in ``summaries`` (and of refused ones of
        no known backend) whose labels include ``labels``."""
        backend = self.backend
        return [
            (app_id, entry)
            for app_id, entry in summaries.items()
            if entry["backend"] in (backend, None) and (not labels or labels_match(entry["labels"], labels))
        ]

    def answers(
        self, summaries: Summaries, labels: Mapping[str, str] | None, limit: int | None
    ) -> list[ListAppResponse]:
        """``list``'s answer from ``summaries``: the matching jobs oldest first, or the newest
        ``limit``; answers are built for those only."""
        ended = self._ended_answers
        for gone in ended.keys() - summaries.keys():  # deleted since
            del ended[gone]
        matching = self.matching(summaries, labels)
        if limit is not None and limit < len(matching):
            chosen = heapq.nlargest(limit, matching, key=summary_key)
            chosen.reverse()
        else:
            chosen = sorted(matching, key=summary_key)
        found = []
        for app_id, entry in chosen:
            resp = ended.get(app_id)
            if resp is None:
                resp = ListAppResponse(
                    app_id=app_id,
                    state=_STATES[entry["state"]],
                    name=entry["name"],
                    labels=dict(entry["labels"]),
                    created=entry["created"],
                    started=entry.get("started"),
                    ended=entry.get("ended"),
                    refused=entry.get("refused"),
                )
                if entry["state"] in TERMINAL_NAMES and not entry.get("orphaned"):
                    ended[app_id] = resp
            found.append(resp)
        return found
