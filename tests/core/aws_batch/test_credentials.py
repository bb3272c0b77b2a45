"""Expiring credentials (an assumed role's, as the Amazon provider's session factory makes
them): the Batch scheduler's clients refresh them as they expire, while the shared status
poller, keyed on what the scheduler's maker says of its credentials and never on boto's own
credential objects, stays the same one with what it learnt. Against a moto server over HTTP on
loopback."""

from __future__ import annotations

import datetime
from typing import Any

import boto3
import botocore.session
import pytest
from botocore.credentials import CredentialProvider, RefreshableCredentials

from airflow_provider_torchx.core.schedulers.aws_batch import create_scheduler
from tests.fixtures.aws import FAKE_CREDS, REGION, MotoServer, create_job_queue


class Issued(CredentialProvider):  # type: ignore[misc]
    """Credentials that expire two seconds after they were issued and are issued again on
    refresh, each time with a new access key (``issued`` lists them)."""

    METHOD = "test-rotation"

    def __init__(self) -> None:
        super().__init__()
        self.issued: list[str] = []

    def _issue(self) -> dict[str, str]:
        self.issued.append(f"AKIDROTATED{len(self.issued)}")
        expiry = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=2)
        return {"access_key": self.issued[-1], "secret_key": "s", "token": "t", "expiry_time": expiry.isoformat()}

    def load(self) -> RefreshableCredentials:
        return RefreshableCredentials.create_from_metadata(self._issue(), self._issue, self.METHOD)


def test_expiring_credentials_are_refreshed_under_one_poller(
    moto_without_docker: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_without_docker.url)
    creds = {"aws_access_key_id": FAKE_CREDS["AWS_ACCESS_KEY_ID"], "aws_secret_access_key": "x"}
    queue = create_job_queue("rotating-creds", region_name=REGION, **creds)
    provider = Issued()

    def session() -> Any:
        core = botocore.session.Session()
        core.get_component("credential_provider").insert_before("env", provider)
        return boto3.Session(botocore_session=core, region_name=REGION)

    sched = create_scheduler("rotation", session_factory=session, session_key="aws_role:fingerprint")
    poller = sched.poller
    poller.remember(f"{queue}:job", "job-id-1")
    for _ in range(3):
        assert "ENABLED" in sched.check_settings({"queue": queue})
    assert len(provider.issued) >= 3, provider.issued  # expired and issued again between the calls
    assert sched.poller is poller and sched.poller.job_id(f"{queue}:job") == "job-id-1"
    sched.close()
