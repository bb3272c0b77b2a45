"""What the TorchX UI sends is masked as the task log is, whoever asks (``docs/ui.md``).

The secrets are the ones a task's log hides: the job's own sensitive env values (from its
record, the names Airflow's masker deems sensitive), every connection's password and sensitive
extra values, the values of variables with sensitive names (connections and variables of the
metadata database and of ``AIRFLOW_CONN_*``/``AIRFLOW_VAR_*`` environment variables, read again
every ``REFRESH_S`` seconds) and whatever this process registered with Airflow's masker: the
connections the UI looks up in any secrets backend (``TorchXHook.get_connection``; in the
api-server Airflow's masker keeps them in this process, no Task SDK call is involved). Other
secrets backends cannot be enumerated: a connection only there that the UI never looks up is
not known here. Every string of an answer (log lines, names, labels, messages, errors) goes
through ``mask``; a value shorter than ``MIN_SECRET_LENGTH`` is not replaced (as Airflow does).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterable
from typing import Any

from airflow_provider_torchx._compat import redact, should_hide_value_for_key
from airflow_provider_torchx.core.masking import MASK, MIN_SECRET_LENGTH

#: How long the connections' and variables' secrets are reused before being read again.
REFRESH_S = 30.0

_lock = threading.Lock()
_cached: tuple[float, frozenset[str]] = (-REFRESH_S, frozenset())


def _sensitive_values(data: Any, key: str | None = None) -> Iterable[str]:
    """The values under sensitive keys of a parsed JSON document (a connection's extra)."""
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _sensitive_values(v, str(k))
    elif isinstance(data, list):
        for v in data:
            yield from _sensitive_values(v, key)
    elif data is not None and key is not None and should_hide_value_for_key(key):
        yield str(data)


def _connection_secrets(conn: Any) -> Iterable[str]:
    """A connection's password and the values under sensitive keys of its extra."""
    if conn.password:
        yield conn.password
    with contextlib.suppress(ValueError):  # an extra that is not JSON has no keys to judge by
        yield from _sensitive_values(json.loads(conn.extra or "{}"))


def _env_secrets() -> Iterable[str]:
    """The secrets of the connections and sensitive-named variables defined in
    ``AIRFLOW_CONN_*``/``AIRFLOW_VAR_*`` environment variables, parsed as Airflow's
    environment backend parses them (a malformed one has nothing to mask)."""
    from airflow.secrets.environment_variables import CONN_ENV_PREFIX, VAR_ENV_PREFIX, EnvironmentVariablesBackend

    backend = EnvironmentVariablesBackend()
    for name, value in os.environ.items():
        if name.startswith(CONN_ENV_PREFIX) and value:
            with contextlib.suppress(Exception):
                yield from _connection_secrets(backend.get_connection(name[len(CONN_ENV_PREFIX) :].lower()))
        elif name.startswith(VAR_ENV_PREFIX) and value and should_hide_value_for_key(name[len(VAR_ENV_PREFIX) :]):
            yield value


def _read_airflow_secrets() -> frozenset[str]:
    from airflow.models import Connection, Variable
    from airflow.utils.session import create_session
    from sqlalchemy import select

    found: set[str] = set(_env_secrets())
    with create_session() as session:
        for conn in session.scalars(select(Connection)):
            found.update(_connection_secrets(conn))
        for var in session.scalars(select(Variable)):
            value = var.get_val()
            if value and should_hide_value_for_key(var.key):
                found.add(str(value))
    return frozenset(found)


def airflow_secrets() -> frozenset[str]:
    """The connections' and variables' secrets (cached for ``REFRESH_S``)."""
    global _cached
    with _lock:
        at, values = _cached
        if time.monotonic() - at < REFRESH_S:
            return values
        values = _read_airflow_secrets()
        _cached = (time.monotonic(), values)
        return values


def job_secrets(roles: Iterable[Any]) -> set[str]:
    """The values of the sensitive env vars of ``roles`` (a job's ``Role`` records)."""
    return {v for role in roles for k, v in role.env.items() if v and should_hide_value_for_key(k)}


class Masker:
    """Replaces the given secrets (and Airflow's) in the strings of an answer."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        wanted = {s for s in (*secrets, *airflow_secrets()) if len(s) >= MIN_SECRET_LENGTH}
        self._secrets = sorted(wanted, key=len, reverse=True)

    def text(self, value: str) -> str:
        for secret in self._secrets:
            if secret in value:
                value = value.replace(secret, MASK)
        return str(redact(value))

    def lines(self, lines: list[str]) -> list[str]:
        """``lines`` (no newlines inside) masked in one pass over their joined text."""
        if not lines:
            return lines
        return self.text("\n".join(lines)).split("\n")

    def tree(self, value: Any) -> Any:
        """A copy of a JSON-like value with every string masked."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {k: self.tree(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.tree(v) for v in value]
        return value
