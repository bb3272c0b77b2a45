"""Masking secrets in what the core prints (the CLI's ``dryrun`` and ``describe``).

An environment variable is a secret when its name holds one of ``SENSITIVE_KEYWORDS`` (after
lower-casing it and turning each run of non-word characters into ``_``): the rule Airflow's
secrets masker applies to connection extras and variable names, with its default list, so a
value Airflow would hide in a task log is hidden here too. The Airflow layer uses Airflow's own
masker (which also honours ``[core] sensitive_var_conn_names``); this module is for the core,
which never imports Airflow.

Masking is by key (an ``env`` entry's value becomes ``***``) and by value (every other place
the secret appears in the text, e.g. expanded into an argument). Like Airflow, values shorter
than ``MIN_SECRET_LENGTH`` are masked by key only: replacing them everywhere would garble the
output without protecting anything.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from typing import Any

from airflow_provider_torchx.core.specs import AppDef

#: Airflow's default sensitive names (``DEFAULT_SENSITIVE_FIELDS`` of its secrets masker).
SENSITIVE_KEYWORDS = frozenset(
    {
        "access_key",
        "access_token",
        "api_key",
        "apikey",
        "auth_header",
        "authorization",
        "bearer",
        "connection_string",
        "dsn",
        "passphrase",
        "passwd",
        "password",
        "private_key",
        "proxy",
        "proxy_password",
        "proxies",
        "secret",
        "service_account",
        "service_key",
        "token",
        "keyfile_dict",
        "webhook_url",
    }
)
#: Shorter values are masked by key only (Airflow's ``min_length_masked_secret`` default).
MIN_SECRET_LENGTH = 5
MASK = "***"


def is_sensitive_key(name: str) -> bool:
    """Whether a value named ``name`` (an env var, a cfg key) is a secret (see the module
    docstring)."""
    normalized = re.sub(r"\W+", "_", name.strip().lower())
    return any(word in normalized for word in SENSITIVE_KEYWORDS)


def secret_values(app: AppDef) -> set[str]:
    """The values of the sensitive env vars of every role of ``app``."""
    return {v for role in app.roles for k, v in role.env.items() if v and is_sensitive_key(k)}


def mask_env(env: dict[str, str]) -> dict[str, str]:
    """A copy of ``env`` with the values of sensitive names replaced by ``***``."""
    return {k: MASK if v and is_sensitive_key(k) else v for k, v in env.items()}


def mask_tree(value: Any) -> Any:
    """A copy of ``value`` (dataclasses, dicts, lists: an ``AppDef``, a scheduler's request)
    where every ``env`` mapping and every ``{"name": ..., "value": ...}`` pair (a container's
    environment) is masked by key. Other objects are shared, not copied."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = [f.name for f in dataclasses.fields(value) if f.init]
        return dataclasses.replace(value, **{name: _mask_field(name, getattr(value, name)) for name in fields})
    if isinstance(value, dict):
        if isinstance(value.get("name"), str) and "value" in value and is_sensitive_key(value["name"]):
            return {**value, "value": MASK}
        return {k: _mask_field(k, v) for k, v in value.items()}
    if isinstance(value, list):
        return [mask_tree(v) for v in value]
    if isinstance(value, tuple):
        return tuple(mask_tree(v) for v in value)
    return value


def _mask_field(name: object, value: Any) -> Any:
    return mask_env(value) if name == "env" and isinstance(value, dict) else mask_tree(value)


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every occurrence of each secret (of ``MIN_SECRET_LENGTH`` or more
    characters) replaced by ``***``, longest first."""
    for secret in sorted({s for s in secrets if len(s) >= MIN_SECRET_LENGTH}, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text
