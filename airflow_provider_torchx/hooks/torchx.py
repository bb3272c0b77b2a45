"""``TorchXHook``: a ``torchx`` connection turned into a configured ``Runner``.

Runners are shared by every task, sensor and trigger of the process (one per scheduler,
session and AWS settings), so that many watchers share scheduler clients and the Batch status
poller; ``close_runners`` closes and forgets them. The AWS settings include what the AWS
connection says (``aws_fingerprint``): a connection edited in the UI or its keys rotated give
the next hook a new runner, built from the new settings, without restarting the process;
watchers holding the previous one finish with it. How a job is watched lives in ``watch.py``.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from airflow.exceptions import AirflowException, AirflowNotFoundException
from airflow.sdk import BaseHook

from airflow_provider_torchx._compat import conf, connection_form_widgets, ui_field_behaviour
from airflow_provider_torchx.core.errors import InvalidRunConfigError
from airflow_provider_torchx.core.guards import MAX_COST, MAX_GPU_HOURS, START_TIMEOUT, positive_limit
from airflow_provider_torchx.core.rates import Rates, parse_rates
from airflow_provider_torchx.core.runner import DEFAULT_SESSION_NAME, Runner, get_runner
from airflow_provider_torchx.core.specs import parse_app_handle
from airflow_provider_torchx.ladder import MAX_INFRA_FAILURES, max_infra_failures

#: The connection extras that give the guards' defaults (``core/guards.py``), with the unit of
#: each (None: seconds).
GUARD_EXTRAS = {START_TIMEOUT: None, MAX_GPU_HOURS: "GPU-hours", MAX_COST: "US dollars"}
_EXTRA_KEYS = (
    "scheduler",
    "cfg",
    "session_name",
    "aws_conn_id",
    "region_name",
    "checkpoint_root",
    "rates",
    MAX_INFRA_FAILURES,
    *GUARD_EXTRAS,
)


@dataclass(frozen=True)
class TorchXSettings:
    """What a ``torchx`` connection (or the operator's overrides) says: the scheduler, its
    raw run config (a dict or a ``k=v,...`` string), the session name and AWS settings."""

    scheduler: str
    cfg: Mapping[str, Any] | str | None = None
    session_name: str = DEFAULT_SESSION_NAME
    aws_conn_id: str | None = None
    region_name: str | None = None
    #: Where tasks' jobs checkpoint (the extra ``checkpoint_root``; ``core/checkpoints.py``).
    checkpoint_root: str | None = None
    #: The connection's guard defaults (``core/guards.py``): seconds, GPU-hours, US dollars.
    start_timeout: float | None = None
    max_gpu_hours: float | None = None
    max_cost: float | None = None
    #: What the hardware costs (the extra ``rates``, else ``[torchx] rates``; None: unpriced).
    rates: Rates | None = None
    #: As a rung of a capacity ladder: its ``infra``/``capacity`` failures before the job moves
    #: on (``ladder.py``; None: never).
    max_infra_failures: int | None = None

    @property
    def runner_key(self) -> tuple[str, str, str | None, str | None]:
        """What distinguishes one configured Runner from another (cfg is per submit)."""
        return (self.scheduler, self.session_name, self.aws_conn_id, self.region_name)


@dataclass(frozen=True)
class PrefetchedConnection:
    """The Airflow connection ``conn_id`` as fetched already (``connection``; None: not
    defined), so that the hook builds its boto3 session with no Task SDK call of its own: a
    trigger fetches it on the loop (``aget_connection``), while the session is built on a pool
    or poller thread."""

    conn_id: str
    connection: Any | None


def default_deferrable() -> bool:
    """``[operators] default_deferrable`` (Airflow's config, as this version exposes it)."""
    return bool(conf.getboolean("operators", "default_deferrable", fallback=False))


def _extra_value(extra: Mapping[str, Any], key: str) -> Any:
    """A connection extra, stored plain (``scheduler``) or UI-prefixed (``extra__torchx__scheduler``)."""
    value = extra.get(key, extra.get(f"extra__torchx__{key}"))
    return None if value == "" else value


#: The shared runners by ``TorchXSettings.runner_key``, each with the AWS connection's
#: fingerprint it was built for (``TorchXHook.aws_fingerprint``).
_RUNNERS: dict[tuple[str, str, str | None, str | None], tuple[str | None, Runner]] = {}
_RUNNERS_LOCK = threading.Lock()


def amazon_provider_installed() -> bool:
    """Whether the Amazon provider, which alone reads an ``aws_conn_id``, is installed."""
    return importlib.util.find_spec("airflow.providers.amazon") is not None


def connection_fingerprint(conn: Any | None) -> str:
    """A digest of everything a connection says (type, host, login, password, schema, port,
    extra; ``none`` for no connection): equal digests, same settings. Secrets do not leave it."""
    if conn is None:
        return "none"
    fields = [conn.conn_type, conn.host, conn.login, conn.password, conn.schema, conn.port, conn.extra]
    return hashlib.sha256(json.dumps(fields, default=str).encode()).hexdigest()[:32]


def close_runners() -> None:
    """Close and forget every shared runner of the process (tests, a clean shutdown)."""
    with _RUNNERS_LOCK:
        runners = [runner for _, runner in _RUNNERS.values()]
        _RUNNERS.clear()
    for runner in runners:
        runner.close()


class TorchXHook(BaseHook):
    """Reads the ``torchx`` connection ``torchx_conn_id`` and builds a ``Runner`` from it.

    Explicit ``scheduler``, ``session_name``, ``aws_conn_id`` and ``region_name`` win over the
    connection's. With a ``scheduler`` given, a missing connection (or ``torchx_conn_id=None``)
    is fine: defaults are used, so a local run needs no connection at all. ``aws_connection``:
    the connection ``aws_conn_id`` fetched already (see ``PrefetchedConnection``).
    """

    conn_name_attr = "torchx_conn_id"
    default_conn_name = "torchx_default"
    conn_type = "torchx"
    hook_name = "TorchX"

    @classmethod
    def get_connection_form_widgets(cls) -> dict[str, Any]:
        """The connection form's extra fields for Airflow 3.1 (later versions read them from the
        provider info and never call this)."""
        return connection_form_widgets(cls.conn_type)

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """The connection form's hidden fields and placeholders for Airflow 3.1 (see above)."""
        return ui_field_behaviour(cls.conn_type)

    def __init__(
        self,
        torchx_conn_id: str | None = default_conn_name,
        *,
        scheduler: str | None = None,
        session_name: str | None = None,
        aws_conn_id: str | None = None,
        region_name: str | None = None,
        aws_connection: PrefetchedConnection | None = None,
    ) -> None:
        super().__init__()
        self.torchx_conn_id = torchx_conn_id
        self.aws_connection = aws_connection
        self._overrides = {
            "scheduler": scheduler,
            "session_name": session_name,
            "aws_conn_id": aws_conn_id,
            "region_name": region_name,
        }

    def _connection_extra(self) -> dict[str, Any]:
        if not self.torchx_conn_id:
            return {}
        try:
            conn = self.get_connection(self.torchx_conn_id)
        except AirflowNotFoundException:
            if self._overrides["scheduler"]:
                self.log.info(
                    "No connection %r: using scheduler %s with defaults",
                    self.torchx_conn_id,
                    self._overrides["scheduler"],
                )
                return {}
            raise AirflowNotFoundException(
                f"torchx_conn_id: connection {self.torchx_conn_id!r} is not defined and no scheduler was given; "
                "define a `torchx` connection or pass scheduler= (e.g. local_cwd)"
            ) from None
        extra = conn.extra_dejson
        return {key: _extra_value(extra, key) for key in _EXTRA_KEYS}

    @cached_property
    def settings(self) -> TorchXSettings:
        """The merged settings (explicit arguments over the connection's extras)."""
        values = self._connection_extra()
        values.update({k: v for k, v in self._overrides.items() if v})
        if not values.get("scheduler"):
            raise AirflowException(
                f"scheduler: connection {self.torchx_conn_id!r} names no scheduler; "
                "set its `scheduler` extra (local_cwd, local_dir, aws_batch) or pass scheduler="
            )
        cfg = values.get("cfg")
        if cfg is not None and not isinstance(cfg, str | Mapping):
            raise InvalidRunConfigError(
                f"cfg: connection {self.torchx_conn_id!r} has cfg={cfg!r}; expected a JSON object or a 'k=v,...' string"
            )
        try:
            limits = {
                key: positive_limit(
                    f"connection {self.torchx_conn_id!r} extra {key}",
                    values.get(key),
                    seconds=unit is None,
                    unit=unit or "",
                )
                for key, unit in GUARD_EXTRAS.items()
            }
            rates = (
                parse_rates(values["rates"], f"connection {self.torchx_conn_id!r} extra rates")
                if values.get("rates") is not None
                else parse_rates(conf.get("torchx", "rates", fallback=""), "[torchx] rates")
            )
        except ValueError as e:  # a retry cannot fix it: the task fails without retry
            raise InvalidRunConfigError(str(e)) from None
        return TorchXSettings(
            **limits,
            scheduler=str(values["scheduler"]),
            cfg=cfg,
            session_name=str(values.get("session_name") or DEFAULT_SESSION_NAME),
            aws_conn_id=values.get("aws_conn_id"),
            region_name=values.get("region_name"),
            checkpoint_root=values.get("checkpoint_root"),
            rates=rates,
            max_infra_failures=max_infra_failures(values.get(MAX_INFRA_FAILURES), str(self.torchx_conn_id)),
        )

    # ------------------------------------------------------------------ runner

    @cached_property
    def aws_fingerprint(self) -> str | None:
        """``connection_fingerprint`` of the AWS connection ``aws_conn_id`` (None: there is
        none, or the Amazon provider that reads it is not installed). Read from
        ``aws_connection`` when given (a trigger fetched it on the loop), else looked up once
        and kept there, for the session to be built from without another lookup."""
        conn_id = self.settings.aws_conn_id
        if not conn_id or not amazon_provider_installed():
            return None
        if self.aws_connection is None or self.aws_connection.conn_id != conn_id:
            try:
                found = self.get_connection(conn_id)
            except AirflowNotFoundException:
                found = None
            self.aws_connection = PrefetchedConnection(conn_id, found)
        return connection_fingerprint(self.aws_connection.connection)

    def _scheduler_params(self) -> dict[str, Any]:
        """Factory kwargs: ``session_factory`` builds the boto3 session of the connection's AWS
        settings, called only by schedulers that declare ``aws_session`` and only when they
        use AWS (so boto3 is imported only then); ``session_key`` names those credentials
        (the AWS connection's id and fingerprint; None: boto3's default chain)."""
        fingerprint = self.aws_fingerprint
        key = None if fingerprint is None else f"{self.settings.aws_conn_id}:{fingerprint}"
        return {"session_factory": self.boto3_session, "session_key": key}

    def boto3_session(self) -> Any:
        """A boto3 session from the Amazon provider's connection ``aws_conn_id`` when that
        provider is installed, else from boto3's default credential chain."""
        settings = self.settings
        if settings.aws_conn_id:
            try:
                from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook
            except ImportError:
                self.log.warning(
                    "aws_conn_id=%r ignored: apache-airflow-providers-amazon (the amazon extra) is not installed; "
                    "using boto3's default credential chain",
                    settings.aws_conn_id,
                )
            else:  # its session factory: an assumed role's credentials refresh as they expire
                aws = AwsBaseHook(aws_conn_id=settings.aws_conn_id, region_name=settings.region_name)
                prefetched = self.aws_connection
                if prefetched is not None and prefetched.conn_id == settings.aws_conn_id:
                    aws.get_connection = functools.partial(_prefetched, prefetched)  # no lookup on this thread
                return aws.get_session()
        import boto3

        return boto3.Session(region_name=settings.region_name)

    def get_runner(self) -> Runner:
        """The process-wide ``Runner`` for these settings and what the AWS connection says now
        (shared, so that many watchers in a triggerer share scheduler clients and pollers;
        callers never close it: see ``close_runners``). When the AWS connection changed since
        the shared one was built, a new one replaces it in the cache; the previous one is left
        to the watchers that hold it."""
        key, fingerprint = self.settings.runner_key, self.aws_fingerprint
        with _RUNNERS_LOCK:
            held = _RUNNERS.get(key)
            if held is not None and held[0] == fingerprint:
                return held[1]
            if held is not None:
                self.log.info("AWS connection %r changed: new clients for it", self.settings.aws_conn_id)
            runner = get_runner(self.settings.session_name, **self._scheduler_params())
            _RUNNERS[key] = (fingerprint, runner)
            return runner

    def get_conn(self) -> Runner:
        """Same as ``get_runner()``."""
        return self.get_runner()

    def resolve_cfg(self, cfg: Mapping[str, Any] | str | None = None) -> dict[str, Any]:
        """The connection's cfg with ``cfg`` merged over it; strings are parsed and checked with
        ``Runner.cfg_from_str``. Required options are checked later, at submit."""
        merged: dict[str, Any] = {}
        for part in (self.settings.cfg, cfg):
            if isinstance(part, str):
                merged.update(self.get_runner().cfg_from_str(self.settings.scheduler, part) if part.strip() else {})
            elif isinstance(part, Mapping):
                merged.update(part)
            elif part is not None:
                raise InvalidRunConfigError(f"cfg: {part!r} is a {type(part).__name__}; expected a dict or 'k=v,...'")
        return merged

    def test_connection(self) -> tuple[bool, str]:
        """Check that the scheduler exists and the cfg is valid, and whatever the scheduler
        checks of its settings (``Scheduler.check_settings``: for AWS Batch, that the queue
        exists and runs jobs, by the rule its submit-time check applies)."""
        try:
            return True, self.get_runner().check_settings(self.settings.scheduler, self.resolve_cfg())
        except Exception as e:
            return False, f"{type(e).__name__}: {e}"


def _prefetched(prefetched: PrefetchedConnection, conn_id: str) -> Any:
    """``BaseHook.get_connection`` answered from ``prefetched``."""
    if prefetched.connection is None:
        raise AirflowNotFoundException(f"The conn_id `{conn_id}` isn't defined")
    return prefetched.connection


def hook_for_handle(torchx_conn_id: str | None, app_handle: str) -> TorchXHook:
    """A hook for the scheduler and session of ``app_handle`` (the connection, if defined,
    still supplies the AWS settings)."""
    parsed = parse_app_handle(app_handle)
    return TorchXHook(torchx_conn_id, scheduler=parsed.scheduler_backend, session_name=parsed.session_name)
