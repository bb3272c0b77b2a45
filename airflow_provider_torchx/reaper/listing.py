"""The live jobs with Airflow labels, from every job source of the deployment (``sources.py``),
and their listing problems, each said once."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from airflow_provider_torchx.core.identity import TaskIdentity
from airflow_provider_torchx.core.specs import AppState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LiveJob:
    """A live job with Airflow labels, or one whose record the scheduler refuses (``refused``:
    why; its labels are those still readable, maybe none), and where it was listed
    (``conn_id`` None: the job store of a host-bound scheduler); ``started`` and
    ``start_timeout`` as the listing gives them (the reaper holds that guard:
    ``reaper/guards.py``)."""

    handle: str
    scheduler: str
    conn_id: str | None
    state: AppState
    labels: Mapping[str, str]
    created: float | None
    refused: str | None = None
    started: float | None = None
    start_timeout: float | None = None

    @property
    def identity(self) -> TaskIdentity | None:
        """The task instance its labels name (None only for a refused record naming none)."""
        return TaskIdentity.from_labels(self.labels)


class ProblemLog:
    """Says each lasting problem once: a warning when a source's failure is new or its text
    changes, a debug line while it repeats, an info line when the source works again. The
    reconciling loop lists every source each round; a connection it cannot read would
    otherwise be warned of every ``RECONCILE_EVERY`` seconds."""

    def __init__(self) -> None:
        self._current: dict[str, str] = {}
        self._lock = threading.Lock()

    def failed(self, what: str, err: BaseException) -> None:
        """``what`` (``listing torchx_batch``) failed with ``err``."""
        text = f"{type(err).__name__}: {err}"
        with self._lock:
            repeated = self._current.get(what) == text
            self._current[what] = text
        if repeated:
            log.debug("orphaned jobs: %s still fails (%s)", what, text)
        else:
            log.warning("orphaned jobs: %s failed (%s); said again only if that changes", what, text)

    def worked(self, what: str) -> None:
        """``what`` succeeded (an info line if it had failed)."""
        with self._lock:
            had = self._current.pop(what, None)
        if had is not None:
            log.info("orphaned jobs: %s works again", what)


#: The problems of this process's listings (``live_jobs``).
problems = ProblemLog()


def live_jobs(wanted: Callable[[TaskIdentity], bool] | None = None) -> list[LiveJob]:
    """Every live job with Airflow labels (and, given ``wanted``, whose identity it accepts)
    and every live job whose record the scheduler refuses (without ``wanted``; one of no
    readable labels once, though each local backend lists it), from one ``list_live`` per
    source: each host-bound scheduler's job store and each ``torchx`` connection of another
    scheduler. A source that fails is skipped, and said once (``problems``)."""
    from airflow_provider_torchx.sources import source_listings, torchx_connection_ids

    connections: list[str] = []
    try:
        connections = torchx_connection_ids()
    except Exception as e:
        problems.failed("listing the torchx connections", e)
    else:
        problems.worked("listing the torchx connections")
    found: dict[str, LiveJob] = {}
    for conn_id, scheduler, apps in source_listings(connections, live=True):
        what = f"listing {conn_id or 'the local job store'}"
        if isinstance(apps, Exception):
            problems.failed(what, apps)
            continue
        problems.worked(what)
        for app in apps:
            ident = TaskIdentity.from_labels(app.labels)
            if app.state.is_terminal() or (ident is None and app.refused is None):
                continue
            if wanted is not None and (ident is None or not wanted(ident)):
                continue
            job = LiveJob(
                app.app_handle,
                scheduler,
                conn_id,
                app.state,
                dict(app.labels),
                app.created,
                app.refused,
                app.started,
                app.start_timeout,
            )
            found.setdefault(f"refused:{app.app_id}" if ident is None else app.app_handle, job)
    return list(found.values())
