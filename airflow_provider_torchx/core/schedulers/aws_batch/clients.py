"""The AWS side of an ``AWSBatchScheduler``: its boto3 session (region, profile), its Batch,
CloudWatch Logs, EC2 and Docker clients, the key naming the credentials they sign with, and the
process-wide status poller and CloudWatch budget shared under that key (docs/architecture.md,
"AWS calls").

Clients made here retry in botocore (``client_config``); an injected client keeps the retry
configuration its maker gave it, so no call is retried twice. Every CloudWatch Logs attempt, a
retry too, counts against the budget (``logs.count_attempts``). boto3 and docker are imported
only when a client is first made.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from airflow_provider_torchx.core import workspace
from airflow_provider_torchx.core.errors import InvalidRunConfigError
from airflow_provider_torchx.core.runopts import CfgVal
from airflow_provider_torchx.core.schedulers.aws_batch.logs import LogBudget, count_attempts, shared_log_budget
from airflow_provider_torchx.core.schedulers.aws_batch.poller import StatusPoller, shared_poller

#: Attempts per call of the clients made here, the first one included.
MAX_ATTEMPTS = 5


def client_config() -> Any:
    """The botocore ``Config`` of the clients made here: the ``standard`` retry mode (throttling,
    5xx and lost connections retried with jittered exponential back-off, ``MAX_ATTEMPTS``
    attempts, within the client's retry quota, so that an outage does not multiply the calls).
    Not ``adaptive``: its client-side rate limiter would put the caller's thread (a watch
    pool's) to sleep before sending and rate CloudWatch calls a second time, over the budget."""
    from botocore.config import Config

    return Config(retries={"mode": "standard", "total_max_attempts": MAX_ATTEMPTS})


def all_items(client: Any, operation: str, key: str, **kwargs: Any) -> list[dict[str, Any]]:
    """Every ``key`` entry of every page of ``operation`` (boto3's paginator for it)."""
    return [item for page in client.get_paginator(operation).paginate(**kwargs) for item in page.get(key, [])]


class AWSClients:
    """The clients of one scheduler, each injected or made on first use (once, under a lock).

    Clients are made from ``session``, else from ``session_factory()``, else from a boto3
    session of ``region``/``profile`` over boto3's default chain. ``session_key`` names the
    credentials ``session_factory``'s sessions carry (the hook: a fingerprint of the AWS
    connection); without one, an injected session or Batch client is its own key, else boto3's
    default chain is (``credentials_key``).
    """

    def __init__(
        self,
        *,
        client: Any | None = None,
        log_client: Any | None = None,
        ec2_client: Any | None = None,
        docker_client: Any | None = None,
        session: Any | None = None,
        session_factory: Callable[[], Any] | None = None,
        region: str | None = None,
        profile: str | None = None,
        session_key: str | None = None,
    ) -> None:
        self._region, self._profile = region, profile
        self._client = client
        self._log_client = log_client
        self._ec2_client = ec2_client
        self._docker_client = docker_client
        self._session = session
        self._session_factory = session_factory
        injected = session if session is not None else client
        if session_key is None and injected is not None and session_factory is None:
            session_key = f"instance:{id(injected)}"  # its own credentials, whatever they are
        self._session_key = session_key
        self._held_poller: tuple[str, StatusPoller | None] = ("", None)
        self._counting = False
        self._lock = threading.Lock()

    def session(self) -> Any:
        """The boto3 session clients are made from (built on first use)."""
        if self._session is None and self._session_factory is not None:
            self._session = self._session_factory()
        if self._session is None:
            import boto3

            self._session = boto3.session.Session(region_name=self._region, profile_name=self._profile)
        return self._session

    def use_location(self, cfg: Mapping[str, CfgVal] | None) -> None:
        """Take the run options ``region``/``profile`` for the clients when none was made yet;
        once AWS is in use they must agree with it."""
        region, profile = (cfg or {}).get("region"), (cfg or {}).get("profile")
        if not region and not profile:
            return
        with self._lock:
            if self._session is None and self._session_factory is None and self._client is None:
                self._region = str(region) if region else self._region
                self._profile = str(profile) if profile else self._profile
                return
        if region and region != self.region():
            raise InvalidRunConfigError(
                f"cfg: region={region!r}, but this scheduler already uses {self.region()} (from its connection, "
                "AWS_DEFAULT_REGION or the profile): give the same region, or set it there instead"
            )
        used = self.session().profile_name if self._session is not None else None
        if profile and profile != used:
            raise InvalidRunConfigError(
                f"cfg: profile={profile!r}, but this scheduler already uses the profile {used!r} "
                "(from its connection or AWS_PROFILE): give the same profile, or set it there instead"
            )

    def _made(self, attr: str, make: Callable[[], Any]) -> Any:
        """The client held in ``attr`` (injected, or ``make()``-d on first use, once)."""
        with self._lock:
            if getattr(self, attr) is None:
                setattr(self, attr, make())
            return getattr(self, attr)

    def _aws(self, service: str) -> Callable[[], Any]:
        return lambda: self.session().client(service, config=client_config())

    @property
    def made(self) -> bool:
        """Whether the Batch client exists (injected or made): asking for it then cannot block."""
        return self._client is not None

    @property
    def client(self) -> Any:
        """The Batch client."""
        return self._made("_client", self._aws("batch"))

    @property
    def log_client(self) -> Any:
        """The CloudWatch Logs client, each of its attempts counted against ``log_budget``."""
        client = self._made("_log_client", self._aws("logs"))
        if not self._counting:
            self._counting = True
            count_attempts(client, lambda: self.log_budget)
        return client

    @property
    def ec2_client(self) -> Any:
        """The EC2 client (``DescribeInstanceTypes`` for the queue check)."""
        return self._made("_ec2_client", self._aws("ec2"))

    @property
    def docker_client(self) -> Any:
        """The Docker client (workspace builds and pushes)."""
        return self._made("_docker_client", workspace.docker_client)

    @property
    def credentials_key(self) -> str:
        """Which credentials the clients sign with, as far as their maker says:
        ``session_key``, else the injected session or client itself, else boto3's default
        chain (with the profile). Never read from boto's credential objects, so refreshing
        credentials (an assumed role's) keep their key."""
        return self._session_key or f"default-chain:{self._profile or ''}"

    @property
    def poller(self) -> StatusPoller:
        """The process-wide status poller for the Batch client's account/region/endpoint and
        credentials (``shared_poller``), held until the registry forgets it or the credentials
        key changes: a watcher reads it on every look."""
        key, held = self._held_poller
        if held is None or held.forgotten or key != self.credentials_key:
            key = self.credentials_key
            held = shared_poller(self.client, key)
            self._held_poller = (key, held)
        return held

    @property
    def log_budget(self) -> LogBudget:
        """The process-wide CloudWatch budget of the Logs client's account/region/endpoint and
        credentials (``shared_log_budget``)."""
        return shared_log_budget(self.log_client, self.credentials_key)

    def region(self) -> str:
        """The Batch client's region."""
        return str(self.client.meta.region_name)
