"""Masking secrets in what the core prints (the CLI's ``dryrun`` and ``describe``).

An environment variable is a secret when its name holds one of ``SENSITIVE_KEYWORDS`` (after
lower-casing it and turning each run of non-word characters into ``_``): the rule Airflow's
secrets masker applies to connection extras and variable names, with its default list, so a
value Airflow would hide in a task log is hidden here too. The Airflow layer uses Airflow's own
masker (which also honours ``[core] sensitive_var_conn_names``); this module is for the core,
which never imports Airflow.

A role's command (entrypoint and args, also one shell string such as ``sh -c``'s) holds secrets
too: a connection's password templated into ``--password {{ conn.db.password }}``. The core has
no Airflow masker to know it, so ``command_secrets`` finds them by key: the value of a flag or an
assignment whose name ends a word in a sensitive keyword (``--password X``, ``--db-password=X``,
``HF_TOKEN=X``; word ends, not substrings, so ``--tokenizer`` or ``--max_tokens`` are not
secrets) and the password of a URL (``postgres://user:X@host``). A secret passed any other way
(a bare positional argument) is not found.

Masking is by key (an ``env`` entry's value becomes ``***``) and by value (every other place
the secret appears in the text: an argument, the scheduler's request, a log line). Like Airflow, values shorter
than ``MIN_SECRET_LENGTH`` are masked by key only: replacing them everywhere would garble the
output without protecting anything.
"""

from __future__ import annotations

import dataclasses
import itertools
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


#: ``--name VALUE`` (a flag, then its value as the next word), ``NAME=VALUE``, and a URL's
#: password; a value ends at whitespace, a shell operator or its closing quote.
_VALUE = r"""(?P<value>'[^']*'|"[^"]*"|[^\s'";&|]+)"""
_FLAG_THEN_VALUE = re.compile(r"(?<!\S)(?P<key>--?[A-Za-z_][\w.-]*)\s+(?=[^\s-])" + _VALUE)
_ASSIGNMENT = re.compile(r"(?P<key>[A-Za-z_][\w.-]*)=" + _VALUE)
_URL_PASSWORD = re.compile(r"[A-Za-z][\w+.-]*://[^\s:/@]*:(?P<value>[^\s@/]+)@")


def is_sensitive_flag(name: str) -> bool:
    """Whether a command's flag or assignment ``name`` (``--db-password``, ``HF_TOKEN``) names a
    secret: a sensitive keyword ends one of its words (see the module docstring)."""
    words = re.sub(r"\W+", "_", name.strip("-").lower()) + "_"
    return any(f"{word}_" in words for word in SENSITIVE_KEYWORDS)


def command_secrets(command: Iterable[str]) -> set[str]:
    """The secret values in a command's words (see the module docstring), quotes removed: each
    word is searched, and a word that is a sensitive flag makes the next word, unless a flag,
    a secret."""
    words = list(command)
    found = {nxt for word, nxt in itertools.pairwise(words) if _is_flag(word) and is_sensitive_flag(word)}
    found -= {word for word in words if _is_flag(word)}
    for word in words:
        for m in (*_FLAG_THEN_VALUE.finditer(word), *_ASSIGNMENT.finditer(word)):
            if is_sensitive_flag(m["key"]):
                found.add(m["value"])
        found.update(m["value"] for m in _URL_PASSWORD.finditer(word))
    return {value.strip("'\"") for value in found} - {""}


def _is_flag(word: str) -> bool:
    return re.fullmatch(r"--?[A-Za-z_][\w.-]*", word) is not None


def secret_values(app: AppDef) -> set[str]:
    """The secrets of every role of ``app``: the values of its sensitive env vars and the
    secrets of its command (``command_secrets``)."""
    env = {v for role in app.roles for k, v in role.env.items() if v and is_sensitive_key(k)}
    return env.union(*(command_secrets([role.entrypoint, *role.args]) for role in app.roles))


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
