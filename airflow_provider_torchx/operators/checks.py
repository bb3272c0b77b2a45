"""What a TorchX task checks before it runs, how it fails on errors a retry cannot fix, and
what its dry run returns.

``check_literal_arguments`` runs in the operator's ``__init__``, so a DAG whose literal
(non-templated) arguments are wrong fails to import, naming the problem: an unknown component
or scheduler, ``component_args`` that are neither a list of str nor a dict, an unknown,
mistyped or disallowed argument of a builtin component (``num_replicas=0``, ``-j 0x2``: its
``Annotated`` checks), an invalid ``app=``, an
unknown, mistyped or too small run option of a scheduler that declares its run options for
these checks (entry point group ``airflow_provider_torchx.run_options``: the builtin
schedulers do).
DAG parsing is a hot path: nothing here imports a scheduler backend or calls a cloud API
(a component name is resolved among the builtins and the entry points' names; run options come
from the light function a scheduler names; a ``file.py:fn`` component is left to the task,
which loads it).

``fail_without_retry`` turns the errors that cannot change on a retry (unknown component,
scheduler or connection, bad run option, invalid spec, missing queue, no AWS credentials or
region, access denied: ``SchedulerSetupError`` unless ``transient``) into
``TorchXConfigRefused`` (an ``AirflowFailException`` of kind ``config``): the task fails at
once, with one message and no chained exception. Transient errors (throttling, a lost
connection) pass through and are retried.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from importlib import metadata
from typing import TYPE_CHECKING, Any

from airflow.exceptions import AirflowNotFoundException

from airflow_provider_torchx.core.errors import (
    ComponentError,
    InvalidRunConfigError,
    InvalidSpecError,
    MalformedAppHandleError,
    SchedulerSetupError,
    UnknownSchedulerError,
)
from airflow_provider_torchx.core.failures import FailureKind
from airflow_provider_torchx.core.runner import RUN_OPTIONS_ENTRY_POINT_GROUP, SCHEDULER_ENTRY_POINT_GROUP
from airflow_provider_torchx.core.runopts import did_you_mean, runopts
from airflow_provider_torchx.core.specs import AppDef, validate_app
from airflow_provider_torchx.failures import TorchXConfigRefused

# The component resolver (and its ``argparse``) loads when a component is checked: a DAG of
# ``app=`` tasks does not pay for it.
if TYPE_CHECKING:
    from airflow_provider_torchx.core.components import Component

#: Errors a retry cannot fix: the task fails without retries.
CONFIG_ERRORS: tuple[type[Exception], ...] = (
    ComponentError,
    InvalidRunConfigError,
    InvalidSpecError,
    MalformedAppHandleError,
    UnknownSchedulerError,
    AirflowNotFoundException,
)


def is_literal(value: Any) -> bool:
    """Whether ``value`` is a string Airflow will not template (no Jinja markers)."""
    return isinstance(value, str) and "{{" not in value and "{%" not in value


@functools.cache
def _entry_points() -> tuple[metadata.EntryPoint, ...]:
    """Every entry point, read once per process: reading them scans every installed
    distribution (tens of milliseconds, too much for each task of a DAG)."""
    return tuple(ep for dist in metadata.distributions() for ep in dist.entry_points)


@functools.cache
def _entry_point_names(group: str) -> frozenset[str]:
    """The names registered in entry-point ``group`` (nothing is loaded)."""
    return frozenset(ep.name for ep in _entry_points() if ep.group == group)


@functools.cache
def _builtin_components() -> dict[str, Component]:
    """The builtin components, made once per process (each keeps its parsed signature)."""
    from airflow_provider_torchx.core.components import builtin_components

    return builtin_components()


def _builtin_component_names() -> frozenset[str]:
    return frozenset(_builtin_components())


def check_component(name: str) -> None:
    """An unknown component name raises the resolver's ``ComponentError`` (with the closest
    names). A builtin or a name under an entry point passes without loading anything; only an
    unknown name is looked up in full (loading the entry points), to say so and why."""
    from airflow_provider_torchx.core.components import COMPONENT_ENTRY_POINT_GROUP, get_component

    registered = _entry_point_names(COMPONENT_ENTRY_POINT_GROUP)
    if name in _builtin_component_names() or any(name == ep or name.startswith(ep + ".") for ep in registered):
        return
    get_component(name)


def check_component_args(name: str, args: Any) -> None:
    """Unknown names (with the closest ones) and mistyped literal values in ``component_args``
    of a builtin component raise its ``ComponentError``; templated values, missing arguments
    (a connection may give defaults) and other components (loading them costs) are left to the
    task."""
    component = _builtin_components().get(name)
    if component is not None and isinstance(args, list | Mapping):
        component.check_args(args, lambda value: isinstance(value, str) and not is_literal(value))


def check_scheduler(name: str) -> None:
    """An unknown scheduler name raises ``UnknownSchedulerError`` with the closest names (the
    registered names are read without loading any scheduler)."""
    known = sorted(_entry_point_names(SCHEDULER_ENTRY_POINT_GROUP))
    if name not in known:
        raise UnknownSchedulerError(
            f"scheduler: unknown scheduler {name!r}; known: {', '.join(known)}.{did_you_mean(name, known)}"
        )


@functools.cache
def declared_run_opts(scheduler: str) -> runopts | None:
    """The run options ``scheduler`` declares for parse-time checks (its entry point in
    ``RUN_OPTIONS_ENTRY_POINT_GROUP``, loaded once per process: a light module, never the
    scheduler's); None when it declares none."""
    for ep in _entry_points():
        if ep.group == RUN_OPTIONS_ENTRY_POINT_GROUP and ep.name == scheduler:
            opts: runopts = ep.load()()
            return opts
    return None


def check_cfg(scheduler: str, cfg: Mapping[str, Any] | str) -> None:
    """Unknown keys (with the closest names) and mistyped or too small literal values of ``cfg``
    raise ``InvalidRunConfigError`` for a scheduler that declares its run options
    (``declared_run_opts``); templated values are left alone."""
    opts = declared_run_opts(scheduler)
    if opts is None:
        return
    if isinstance(cfg, str):
        if is_literal(cfg) and cfg.strip():
            opts.cfg_from_str(cfg)
        return
    opts.check({k: v for k, v in cfg.items() if not isinstance(v, str) or is_literal(v)})


def check_literal_arguments(
    *,
    app: AppDef | None,
    component: str | None,
    scheduler: str | None,
    cfg: Mapping[str, Any] | str | None,
    component_args: Any = None,
) -> None:
    """Check what can be checked cheaply when the DAG is parsed (see the module docstring);
    raise the core's ``ValueError`` naming the field."""
    if app is not None:
        validate_app(app)
    if component_args is not None and not (isinstance(component_args, str) and not is_literal(component_args)):
        from airflow_provider_torchx.core.components import check_args_form

        check_args_form(component_args)  # a template may render into a list (native rendering)
    if component is not None and is_literal(component) and ":" not in component:
        check_component(component)
        check_component_args(component, component_args)
    if scheduler is not None and is_literal(scheduler):
        check_scheduler(scheduler)
        if cfg is not None:
            check_cfg(scheduler, cfg)


def short_message(error: BaseException, component: str | None = None) -> str:
    """``error``'s message without a component's synopsis (its first line), pointing to where
    the component's arguments are."""
    text = str(error)
    head, sep, _ = text.partition("\nusage:")
    if sep and component:
        head += f"\n(`airflow-torchx builtins {component}` prints the component's arguments)"
    return head


@contextmanager
def fail_without_retry(component: str | None = None) -> Iterator[None]:
    """Re-raise ``CONFIG_ERRORS`` as ``TorchXConfigRefused`` (an ``AirflowFailException`` of
    kind ``config``: one message, no chained exception); let every other exception through."""
    config = FailureKind.CONFIG
    try:
        yield
    except CONFIG_ERRORS as e:
        message = f"{type(e).__name__}: {short_message(e, component)}"
        raise TorchXConfigRefused(message, kind=config, why=type(e).__name__) from None
    except SchedulerSetupError as e:  # no credentials or region, access denied: not a retry's to fix
        if e.transient:
            raise
        raise TorchXConfigRefused(f"{type(e).__name__}: {e}", kind=config, why=type(e).__name__) from None


def request_dict(text: str) -> dict[str, Any]:
    """A dry run's rendered request (``str(AppDryRunInfo)``, secrets redacted) as a dict, what
    the task returns to XCom: the scheduler's JSON rendering parsed, else ``{"request": text}``."""
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    return parsed if isinstance(parsed, dict) else {"request": text}
