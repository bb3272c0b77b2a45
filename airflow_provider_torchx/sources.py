"""The deployment's job sources: where this host lists jobs and finds the runner of one.

Jobs come from two places: the schedulers whose jobs live on this host (``host_bound`` in their
capabilities: ``local_cwd``/``local_dir``'s job store) and every ``torchx`` connection whose
scheduler is another backend (AWS Batch: that connection's queue and AWS settings). Runners come
from ``TorchXHook.get_runner()``, so every caller shares scheduler clients and the Batch status
poller with everything else in its process. The UI's listing (``plugins/jobs.py``) and the
orphaned-jobs reaper (``reaper/``) both read jobs from here.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterable, Iterator

from airflow_provider_torchx.core.runner import Runner, get_runner
from airflow_provider_torchx.core.schedulers.api import ListAppResponse
from airflow_provider_torchx.core.specs import parse_app_handle
from airflow_provider_torchx.hooks.torchx import TorchXHook

_CONN_ENV_PREFIX = "AIRFLOW_CONN_"


def torchx_connection_ids() -> list[str]:
    """Ids of the ``torchx`` connections in the metadata database and in ``AIRFLOW_CONN_*``
    environment variables (other secrets backends cannot be enumerated)."""
    from airflow.models import Connection
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        ids = set(session.scalars(select(Connection.conn_id).where(Connection.conn_type == "torchx")))
    for name in os.environ:
        if name.startswith(_CONN_ENV_PREFIX):
            conn_id = name[len(_CONN_ENV_PREFIX) :].lower()
            with contextlib.suppress(Exception):  # a malformed variable is not ours to report
                if TorchXHook.get_connection(conn_id).conn_type == "torchx":
                    ids.add(conn_id)
    return sorted(ids)


@functools.cache
def host_bound_schedulers() -> tuple[str, ...]:
    """The registered schedulers whose jobs live on this host (their capabilities say
    ``host_bound``): listed without a connection. A scheduler that fails to load is left out
    (its connections report it)."""
    with get_runner() as runner:
        names = []
        for name in runner.scheduler_backends():
            with contextlib.suppress(Exception):
                if runner.capabilities(name).host_bound:
                    names.append(name)
    return tuple(names)


def source_listings(
    connections: Iterable[str], live: bool = False
) -> Iterator[tuple[str | None, str, list[ListAppResponse] | Exception]]:
    """``(conn_id, scheduler, jobs)`` for each place to list jobs: the host-bound schedulers (no
    connection), then every ``torchx`` connection of ``connections`` but those of a host-bound
    scheduler (its jobs are listed once, without it). ``jobs``: ``Runner.list`` (``list_live``
    if ``live``), or the exception the listing raised (the caller reports it and goes on)."""
    sources = [(None, TorchXHook(None, scheduler=s)) for s in host_bound_schedulers()]
    for conn_id, hook in [*sources, *((c, TorchXHook(c)) for c in connections)]:
        scheduler = ""
        try:
            scheduler = hook.settings.scheduler
            if conn_id and scheduler in host_bound_schedulers():
                continue
            runner, cfg = hook.get_runner(), hook.resolve_cfg() if conn_id else None
            apps = runner.list_live(scheduler, cfg) if live else runner.list(scheduler, cfg)
        except Exception as err:
            yield conn_id, scheduler, err
            continue
        yield conn_id, scheduler, apps


def runner_for(app_handle: str, conn_id: str | None) -> Runner:
    """The runner for ``app_handle``: from connection ``conn_id`` (AWS settings) if given and
    defined, else the scheduler's defaults. Raises ``ValueError`` for a bad handle or an
    unknown scheduler."""
    parsed = parse_app_handle(app_handle)
    runner = TorchXHook(conn_id, scheduler=parsed.scheduler_backend, session_name=parsed.session_name).get_runner()
    runner.scheduler_run_opts(parsed.scheduler_backend)  # unknown scheduler: UnknownSchedulerError
    return runner
