"""Secrets of a TorchX job kept out of Airflow's logs, XComs and trigger events.

An env var of a role whose name Airflow's secrets masker deems sensitive (its
``should_hide_value_for_key``: ``password``, ``secret``, ``token``, ``api_key``, ... and
``[core] sensitive_var_conn_names``) is registered with that masker (``mask_secret``), so every
later log line, exception and ``redact`` hides it. Values that came from connections and
variables (``{{ conn.x.password }}``, ``{{ var.value.x_token }}``) are registered by Airflow when
they are read. What the provider itself hands to Airflow (the dry run's return value, a trigger
event) goes through ``redact`` first.
"""

from __future__ import annotations

import logging
from typing import Any

from airflow_provider_torchx._compat import mask_secret, redact, should_hide_value_for_key
from airflow_provider_torchx.core.specs import AppDef

__all__ = ["redact", "register_app_secrets", "register_job_secrets"]

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
