"""The core's errors in TorchX's terms, for the ``aws_batch`` TorchX plugin.

TorchX's ``torchx run`` prints two kinds of errors as one line (and a few lines of advice)
instead of a traceback: ``InvalidRunConfigException`` (a run option) and
``ComponentValidationException`` (the app). ``torchx_terms`` turns the core's errors into those,
with the core's message (which names the field, the bad value and what is allowed), an AWS
setup error re-worded for a TorchX user (``-cfg region=``, or the environment for a subcommand
without run options; not an Airflow connection), and no chained traceback. The other
subcommands print them as one line too (``cli.py``: ``USER_ERRORS``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from torchx import specs as tx
from torchx.specs.finder import ComponentValidationException

from airflow_provider_torchx.core.errors import (
    ComponentError,
    InvalidRunConfigError,
    InvalidSpecError,
    MalformedAppHandleError,
    SchedulerSetupError,
    UnknownAppError,
)
from airflow_provider_torchx.core.schedulers.aws_batch.setup_errors import SetupHints, setup_error

#: Where a TorchX user sets what an AWS setup error asks for.
TORCHX_HINTS = SetupHints(
    region="set AWS_DEFAULT_REGION, a profile with a region (AWS_PROFILE) or -cfg region=",
    credentials="set AWS_PROFILE (or -cfg profile=), or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
    identity="use another -cfg profile=",
)
#: The same, for a subcommand without run options (``status``, ``log``, ``cancel``...).
TORCHX_ENV_HINTS = SetupHints(
    region="set AWS_DEFAULT_REGION or a profile with a region (AWS_PROFILE)",
    credentials="set AWS_PROFILE, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
    identity="use another AWS_PROFILE",
)

#: The errors the plugin raises for the user: bad input or an unusable AWS setup, each with a
#: message that says what to change (the CLI prints them as one line: ``cli.py``).
USER_ERRORS: tuple[type[Exception], ...] = (
    tx.InvalidRunConfigException,
    ComponentValidationException,
    SchedulerSetupError,
    InvalidRunConfigError,
    InvalidSpecError,
    ComponentError,
    MalformedAppHandleError,
    UnknownAppError,
)


def setup_message(err: SchedulerSetupError, hints: SetupHints = TORCHX_HINTS) -> str:
    """``err``'s message in TorchX's terms: the botocore error it was made from, translated
    with ``hints``; else its own message."""
    again = setup_error(err.__cause__, hints) if err.__cause__ is not None else None
    return str(again or err)


def torchx_error(
    err: Exception, cfg: Mapping[str, Any] | None = None, hints: SetupHints = TORCHX_HINTS
) -> Exception | None:
    """The TorchX exception for one of the core's errors (``cfg``: a run's options, which
    TorchX's message shows; None outside a run; ``hints``: where the user sets what an AWS
    setup error asks for); None for any other error."""
    if isinstance(err, SchedulerSetupError):  # before InvalidRunConfigError: UnknownQueueError is both
        if cfg is None:  # not a run: no run options to show
            return SchedulerSetupError(setup_message(err, hints), transient=err.transient)
        return tx.InvalidRunConfigException(setup_message(err).rstrip("."), "", _given(cfg))
    if isinstance(err, InvalidRunConfigError):
        return tx.InvalidRunConfigException(str(err).rstrip("."), "", _given(cfg))
    if isinstance(err, InvalidSpecError | ComponentError):
        return ComponentValidationException(str(err))
    return None


def _given(cfg: Mapping[str, Any] | None) -> dict[str, Any]:
    """The run options set in ``cfg``, as TorchX's message shows them (unset ones left out)."""
    return {key: value for key, value in (cfg or {}).items() if value is not None}


@contextmanager
def torchx_terms(cfg: Mapping[str, Any] | None = None, hints: SetupHints = TORCHX_HINTS) -> Iterator[None]:
    """Raise the core's errors inside the block as ``torchx_error``'s, without the chained
    traceback."""
    try:
        yield
    except Exception as err:
        translated = torchx_error(err, cfg, hints)
        if translated is None:
            raise
        raise translated from None


def torchx_terms_iter(lines: Iterable[str], hints: SetupHints = TORCHX_HINTS) -> Iterator[str]:
    """``lines`` with the core's errors raised while iterating in TorchX's terms."""
    with torchx_terms(hints=hints):
        yield from lines
