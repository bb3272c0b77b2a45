"""Secrets of a TorchX job kept out of Airflow's logs, XComs and trigger events.

An env var of a role whose name Airflow's secrets masker deems sensitive (its
``should_hide_value_for_key``: ``password``, ``secret``, ``token``, ``api_key``, ... and
``[core] sensitive_var_conn_names``) is registered with that masker (``mask_secret``), so every
later log line, exception and ``redact`` hides it. Values that came from connections and
variables (``{{ conn.x.password }}``, ``{{ var.value.x_token }}``) are registered by Airflow when
they are read. What the provider itself hands to Airflow (the dry run's return value, a trigger
event, a failure message, the job's log lines through ``MaskedLog``) goes through ``redact``
first, so it is masked whatever the logging configuration (``dag.test()`` logs without
Airflow's masking processor). A resumed task did not build its app: it registers the job's
secrets (``job_secrets``, ``register_secrets``) before logging the job's last lines.

In a triggerer the rule is stricter (docs/architecture.md, "In the triggerer"): no
synchronous Task SDK call from a trigger or a thread it starts, since the trigger runner's
channel to its supervisor is shared by every trigger of the process. A trigger reads its job's
secrets on a pool thread (``job_secrets``, a plain store read) and registers them on the loop
(``amask_secrets``): in this process's masker, which ``redact`` and ``MaskedLog`` use, and,
with the async ``asend``, in the supervisor's, which masks the task log (the runner sends its
log lines unmasked; the supervisor redacts them).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from airflow_provider_torchx._compat import mask_locally, mask_secret, redact, should_hide_value_for_key
from airflow_provider_torchx.core.specs import AppDef

__all__ = [
    "MaskedLog",
    "amask_secrets",
    "app_secrets",
    "job_secrets",
    "redact",
    "redact_request",
    "register_app_secrets",
    "register_secrets",
]

log = logging.getLogger(__name__)


def app_secrets(app: AppDef) -> list[tuple[str, str]]:
    """``(name, value)`` of every sensitive env value of every role of ``app``."""
    return [
        (key, value)
        for role in app.roles
        for key, value in role.env.items()
        if value and should_hide_value_for_key(key)
    ]


def register_app_secrets(app: AppDef) -> int:
    """Register the sensitive env values of every role of ``app`` with Airflow's masker (a
    task process: ``mask_secret`` also tells its supervisor); return how many there were."""
    return register_secrets(app_secrets(app))


def register_secrets(secrets: Sequence[tuple[str, str]]) -> int:
    """Register ``secrets`` (``(name, value)``) with Airflow's masker from a task process;
    return how many there were."""
    for key, value in secrets:
        mask_secret(value, key)
    return len(secrets)


def redact_request(text: str, cfg: Mapping[str, Any]) -> str:
    """``redact(text)`` for a dry run's request, keeping the run options whose name Airflow's
    masker deems sensitive: they name things, not secrets (``service_account``: the Kubernetes
    service account, the one value an EKS dry run exists to check), but the masker, having read
    the connection's extra, would show them as ``***`` wherever they appear. Secrets in ``text``
    (a role's env, a templated password) stay masked."""
    names = {str(v) for k, v in cfg.items() if isinstance(v, str) and v and should_hide_value_for_key(k)}
    kept = {value: f"\x00kept-{n}\x00" for n, value in enumerate(sorted(names, key=len, reverse=True))}
    for value, mark in kept.items():
        text = text.replace(value, mark)
    text = str(redact(text))
    for value, mark in kept.items():
        text = text.replace(mark, value)
    return text


def job_secrets(describe: Callable[[str], AppDef | None], app_handle: str) -> list[tuple[str, str]]:
    """The secrets of the submitted job ``app_handle`` (``describe``: a ``Runner.describe``),
    for a process that did not build it (the triggerer); blocking, but no Task SDK call. A job
    the scheduler cannot describe has none; a failure is logged, not raised."""
    try:
        app = describe(app_handle)
    except Exception as e:  # watching must go on; the worker registered them already
        log.warning("could not read the env of %s to mask its secrets: %s", app_handle, e)
        return []
    return app_secrets(app) if app is not None else []


async def amask_secrets(secrets: Sequence[tuple[str, str]]) -> None:
    """Register ``secrets`` (``(name, value)``) from a triggerer's event loop: in this process's
    masker, then in the supervisor's with a ``MaskSecret`` sent with ``asend`` (never the
    synchronous ``send``). Without an async channel (``dag.test()`` runs the trigger in the
    task's own process, which masks what it logs) the local masker is all there is. A message
    the supervisor refuses is logged; watching goes on."""
    for key, value in secrets:
        mask_locally(value, key)
    from airflow.sdk.execution_time import task_runner

    asend = getattr(getattr(task_runner, "SUPERVISOR_COMMS", None), "asend", None)
    if asend is None or not secrets:
        return
    from airflow.sdk.execution_time.comms import MaskSecret

    for key, value in secrets:
        try:
            await asend(MaskSecret(value=value, name=key))
        except Exception as e:
            log.warning("could not register the secret %s with the triggerer's supervisor: %s", key, e)


class MaskedLog:
    """A logger whose logging methods pass their arguments through ``redact`` first; every
    other attribute is the wrapped logger's."""

    _METHODS = frozenset({"debug", "info", "warning", "error", "exception", "critical", "log"})

    def __init__(self, log: Any) -> None:
        self._log = log

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._log, name)
        if name not in self._METHODS:
            return attr

        def masked(*args: Any, **kwargs: Any) -> Any:
            return attr(*redact(list(args)), **kwargs)

        return masked
