"""Secrets of a TorchX job kept out of Airflow's logs, XComs and trigger events.

An env var of a role whose name Airflow's secrets masker deems sensitive (its
``should_hide_value_for_key``: ``password``, ``secret``, ``token``, ``api_key``, ... and
``[core] sensitive_var_conn_names``) is registered with that masker (``mask_secret``), so every
later log line, exception and ``redact`` hides it. Values that came from connections and
variables (``{{ conn.x.password }}``, ``{{ var.value.x_token }}``) are registered by Airflow when
they are read. What the provider itself hands to Airflow (the dry run's return value, a trigger
event, a failure message, the job's log lines through ``MaskedLog``) goes through ``redact``
first, so it is masked whatever the logging configuration (``dag.test()`` logs without
Airflow's masking processor).
"""

from __future__ import annotations

import logging
from typing import Any

from airflow_provider_torchx._compat import mask_secret, redact, should_hide_value_for_key
from airflow_provider_torchx.core.specs import AppDef

__all__ = ["MaskedLog", "redact", "register_app_secrets", "register_job_secrets"]

log = logging.getLogger(__name__)


def register_app_secrets(app: AppDef) -> int:
    """Register the sensitive env values of every role of ``app`` with Airflow's masker;
    return how many values were sensitive."""
    count = 0
    for role in app.roles:
        for key, value in role.env.items():
            if value and should_hide_value_for_key(key):
                mask_secret(value, key)
                count += 1
    return count


def register_job_secrets(describe: Any, app_handle: str) -> None:
    """Register the secrets of the submitted job ``app_handle`` (``describe``: a
    ``Runner.describe``), for a process that did not build it (the triggerer). A job the
    scheduler cannot describe has nothing to register; a failure is logged, not raised."""
    try:
        app = describe(app_handle)
    except Exception as e:  # watching must go on; the worker registered them already
        log.warning("could not read the env of %s to mask its secrets: %s", app_handle, e)
        return
    if app is not None:
        register_app_secrets(app)


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
