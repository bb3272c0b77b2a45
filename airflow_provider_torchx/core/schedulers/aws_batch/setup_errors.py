"""AWS configuration and permission errors as one line saying what to set.

botocore raises a different exception for each way a host's AWS setup can be wrong (no
region, no or rejected or expired credentials, a missing permission, an endpoint it cannot
reach). ``setup_error`` turns each into the core's ``SchedulerSetupError``, whose one-line
message names what to set; ``translate_setup_errors`` applies it to the scheduler's public
methods, so every caller (the CLI: exit 3; a task: fails without retry unless ``transient``)
sees the same message. Throttling and lost connections are retried by the clients
(``clients.client_config``) before anything gets here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from airflow_provider_torchx.core.errors import SchedulerSetupError

C = TypeVar("C", bound=type)


@dataclass(frozen=True)
class SetupHints:
    """Where a user of one front end sets what a setup error asks for: the region, the
    credentials, another identity. ``setup_error`` takes them, so each front end's message
    speaks its own terms (``HINTS``: the CLI's and Airflow's; the TorchX plugin has its own)."""

    region: str
    credentials: str
    identity: str


HINTS = SetupHints(
    region="set AWS_DEFAULT_REGION, a profile with a region (AWS_PROFILE), the run option region=, "
    "or region_name in the Airflow connection",
    credentials="set AWS_PROFILE (or the run option profile=), AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
    "or the Airflow connection's aws_conn_id",
    identity="use another profile= / connection",
)

_EXPIRED_CODES = frozenset({"ExpiredToken", "ExpiredTokenException", "RequestExpired", "TokenRefreshRequired"})
_REJECTED_CODES = frozenset(
    {
        "InvalidClientTokenId",
        "UnrecognizedClientException",
        "SignatureDoesNotMatch",
        "AuthFailure",
        "InvalidSignatureException",
    }
)
_DENIED_CODES = frozenset({"AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "UnauthorizedException"})


def is_denied(err: BaseException) -> bool:
    """Whether ``err`` is AWS refusing the call to the identity in use (a missing permission)."""
    import botocore.exceptions as bce

    return isinstance(err, bce.ClientError) and str(err.response.get("Error", {}).get("Code", "")) in _DENIED_CODES


def setup_error(err: BaseException, hints: SetupHints = HINTS) -> SchedulerSetupError | None:
    """The ``SchedulerSetupError`` for a botocore error caused by the host's AWS setup, saying
    what to set in ``hints``' terms; None for any other error."""
    import botocore.exceptions as bce

    if isinstance(err, bce.NoRegionError):
        return SchedulerSetupError(f"AWS: no region is configured: {hints.region}")
    if isinstance(err, bce.ProfileNotFound):
        return SchedulerSetupError(f"AWS: {err}: set AWS_PROFILE or the run option profile= to a configured profile")
    if isinstance(err, bce.NoCredentialsError | bce.PartialCredentialsError | bce.CredentialRetrievalError):
        return SchedulerSetupError(f"AWS: no usable credentials ({err}): {hints.credentials}")
    if isinstance(err, bce.TokenRetrievalError | bce.SSOTokenLoadError | bce.UnauthorizedSSOTokenError):
        return SchedulerSetupError(
            f"AWS: the login expired ({err}): log in again (aws sso login) or {hints.credentials}"
        )
    if isinstance(err, bce.EndpointConnectionError | bce.ConnectTimeoutError | bce.ProxyConnectionError):
        return SchedulerSetupError(
            f"AWS: cannot reach {getattr(err, 'kwargs', {}).get('endpoint_url', 'the endpoint')} (retried): "
            "check the network, AWS_ENDPOINT_URL and the region",
            transient=True,
        )
    if isinstance(err, bce.ClientError):
        error = err.response.get("Error", {})
        code, message = str(error.get("Code", "")), str(error.get("Message", "")).strip()
        operation = getattr(err, "operation_name", "the call")
        if code in _EXPIRED_CODES:
            return SchedulerSetupError(
                f"AWS: the credentials expired ({code} on {operation}): renew them (aws sso login, new session "
                f"credentials) or {hints.credentials}",
                transient=True,
            )
        if code in _REJECTED_CODES:
            return SchedulerSetupError(
                f"AWS: the credentials were rejected ({code} on {operation}): {hints.credentials}"
            )
        if code in _DENIED_CODES:
            return SchedulerSetupError(
                f"AWS: access denied ({code} on {operation}: {message}): grant the identity in use that permission "
                f"(docs/schedulers.md lists what the aws_batch scheduler calls) or {hints.identity}"
            )
    return None


def _raise_translated(err: Exception) -> None:
    """Raise ``setup_error``'s translation of ``err`` (chained), else ``err`` itself."""
    translated = None if isinstance(err, SchedulerSetupError) else setup_error(err)
    if translated is None:
        raise err
    raise translated from err


def _translated(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as err:
            _raise_translated(err)
            raise  # unreachable: for the type checker

    return call


def translated_iter(lines: Iterable[str]) -> Iterator[str]:
    """``lines`` with setup errors raised while iterating translated (``setup_error``)."""
    try:
        yield from lines
    except Exception as err:
        _raise_translated(err)


def translate_setup_errors(*names: str) -> Callable[[C], C]:
    """A class decorator: the methods ``names`` of the class raise ``setup_error``'s
    translation of botocore setup errors (the cause is chained)."""

    def decorate(cls: C) -> C:
        for name in names:
            setattr(cls, name, _translated(getattr(cls, name)))
        return cls

    return decorate
