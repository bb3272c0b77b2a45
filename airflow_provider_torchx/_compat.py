"""What differs between the supported Airflow versions (3.1 to 3.3), kept in one place so the
Airflow layer does not repeat version guards.

- ``AirflowSensorTimeout``, ``AirflowFailException``: the Task SDK's (``airflow.sdk.exceptions``)
  where they exist, else core's (3.1). Tasks must raise the classes their Airflow's task runner
  checks for (core's names are deprecated aliases on later versions).
- ``conf``: the Task SDK's configuration parser where it exists, else core's (3.1).
- ``mask_secret`` / ``redact`` / ``should_hide_value_for_key``: Airflow's secrets masker, public
  in the Task SDK's ``airflow.sdk.log`` and ``airflow.sdk._shared.secrets_masker`` since 3.2;
  in 3.1 in ``airflow.sdk.execution_time.secrets_masker`` (a deprecated alias later).
  ``mask_secret`` also tells the supervisor, synchronously; ``mask_locally`` adds the value to
  this process's masker only (no Task SDK call: what a triggerer's threads may use).
- ``Stats``: Airflow's metrics client as the deployment configured it (StatsD, OpenTelemetry or
  none): the Task SDK's (``airflow.sdk.observability.stats``, 3.2) where it exists, else core's
  ``airflow.stats`` (3.1; 3.3 keeps it only as a deprecated shim). ``stats()`` returns it set up
  also in a process no Airflow component initialized.
- ``connection_form_widgets`` / ``ui_field_behaviour``: the ``torchx`` connection form for
  Airflow 3.1, which reads it only from the hook's (later deprecated) methods. They are derived
  from ``conn-fields`` and ``ui-field-behaviour`` in the provider info, which Airflow >= 3.2
  reads instead (it then never calls the hook's methods), so the form is declared once.
"""

from __future__ import annotations

from typing import Any

from airflow_provider_torchx.provider_info import get_provider_info

try:
    from airflow.sdk import conf
except ImportError:  # Airflow 3.1
    from airflow.configuration import conf  # type: ignore[assignment]
try:
    from airflow.sdk.exceptions import AirflowSensorTimeout
except ImportError:  # Airflow 3.1
    from airflow.exceptions import AirflowSensorTimeout  # type: ignore[no-redef]
try:
    from airflow.sdk.exceptions import AirflowFailException
except ImportError:  # Airflow 3.1
    from airflow.exceptions import AirflowFailException  # type: ignore[no-redef]
try:
    from airflow.sdk.observability.stats import Stats
except ImportError:  # Airflow 3.1
    from airflow.stats import Stats


def stats() -> Any:
    """``Stats``, configured from ``[metrics]`` in a process no Airflow component set it up in
    (the reaper's loop, a script). Airflow >= 3.2 leaves the Task SDK's client a no-op until a
    component (scheduler, triggerer, task runner) calls ``Stats.initialize``, so the metrics of
    such a process would be dropped; 3.1's client configures itself on first use."""
    try:
        from airflow.sdk._shared.observability.metrics import stats as client
        from airflow.sdk.observability.metrics.stats_utils import get_stats_factory
    except ImportError:  # Airflow 3.1
        return Stats
    if getattr(client, "_factory", None) is None and getattr(Stats, "factory", None) is None:
        if hasattr(client, "_factory"):  # Airflow >= 3.3: module-level state
            legacy = conf.getboolean("metrics", "legacy_names_on", fallback=True)
            Stats.initialize(factory=get_stats_factory(), export_legacy_names=legacy)
        else:  # Airflow 3.2: the factory takes the class
            Stats.initialize(factory=get_stats_factory(Stats))  # type: ignore[call-arg]
    return Stats


try:
    from airflow.sdk._shared.secrets_masker import mask_secret as mask_locally
    from airflow.sdk._shared.secrets_masker import redact, should_hide_value_for_key
    from airflow.sdk.log import mask_secret
except ImportError:  # Airflow 3.1
    from airflow.sdk.execution_time.secrets_masker import (  # type: ignore[no-redef]
        _secrets_masker,
        mask_secret,
        redact,
        should_hide_value_for_key,
    )

    def mask_locally(secret: Any, name: str | None = None) -> None:  # type: ignore[misc]
        """Add ``secret`` to this process's masker only."""
        _secrets_masker().add_mask(secret, name)


__all__ = [
    "AirflowFailException",
    "AirflowSensorTimeout",
    "conf",
    "connection_form_widgets",
    "mask_locally",
    "mask_secret",
    "redact",
    "should_hide_value_for_key",
    "stats",
    "ui_field_behaviour",
]


def _connection_type(conn_type: str) -> dict[str, Any]:
    """The provider info's ``connection-types`` entry of ``conn_type``."""
    (entry,) = (c for c in get_provider_info()["connection-types"] if c["connection-type"] == conn_type)
    return entry


def connection_form_widgets(conn_type: str) -> dict[str, Any]:
    """``conn-fields`` of ``conn_type`` as the WTForms fields Airflow 3.1 expects (all optional
    text; a field with choices gets an ``any_of`` validator, the name Airflow 3.1's form service
    stands in for and turns into a choice). WTForms, Flask-AppBuilder and Flask-Babel are
    imported here, when Airflow asks: its connection-form service provides stand-ins for them
    when they are not installed."""
    from flask_appbuilder.fieldwidgets import BS3TextFieldWidget
    from flask_babel import lazy_gettext
    from wtforms import StringField
    from wtforms.validators import Optional, any_of

    return {
        name: StringField(
            lazy_gettext(field["label"]),
            widget=BS3TextFieldWidget(),
            description=field.get("description", ""),
            validators=[Optional(), *([any_of(field["schema"]["enum"])] if "enum" in field["schema"] else [])],
        )
        for name, field in _connection_type(conn_type)["conn-fields"].items()
    }


def ui_field_behaviour(conn_type: str) -> dict[str, Any]:
    """``ui-field-behaviour`` of ``conn_type`` in the spelling of Airflow 3.1's hook method."""
    behaviour = _connection_type(conn_type)["ui-field-behaviour"]
    return {
        "hidden_fields": list(behaviour.get("hidden-fields", [])),
        "relabeling": dict(behaviour.get("relabeling", {})),
        "placeholders": dict(behaviour.get("placeholders", {})),
    }
