"""Credentials that change under a running process (a triggerer): an AWS connection edited
between two triggers takes effect for the next one, in the same process, without a restart;
the shared runner is kept while the connection stays as it is. Against a moto server over
HTTP on loopback; the Amazon provider (not installed here) is stood in for by what its hook
does with a connection: a boto3 session of its login, password and region."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from airflow.sdk import BaseHook

from airflow_provider_torchx.core.errors import UnknownQueueError
from airflow_provider_torchx.core.runner import Runner
from airflow_provider_torchx.hooks.torchx import close_runners
from airflow_provider_torchx.triggers.torchx import TorchXJobTrigger
from tests.fixtures.aws import FAKE_CREDS, MotoServer, create_job_queue


class SessionFromConnection(BaseHook):
    """The Amazon provider's ``AwsBaseHook``, in short: a boto3 session of the connection's
    login, password and region (the hook's ``region_name`` wins)."""

    def __init__(self, aws_conn_id: str, region_name: str | None = None) -> None:
        super().__init__()
        self.aws_conn_id = aws_conn_id
        self.region_name = region_name

    def get_session(self) -> Any:
        import boto3

        conn = self.get_connection(self.aws_conn_id)
        region = self.region_name or conn.extra_dejson.get("region_name")
        return boto3.Session(aws_access_key_id=conn.login, aws_secret_access_key=conn.password, region_name=region)


@pytest.fixture
def aws_connection(
    moto_without_docker: MotoServer, monkeypatch: pytest.MonkeyPatch, amazon_provider: Callable[[type], None]
) -> Iterator[Callable[[str, str], None]]:
    """``edit(access_key, region)``: (re)define the AWS connection ``aws_edit`` as the UI
    would, in the environment this process reads connections from."""
    amazon_provider(SessionFromConnection)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_without_docker.url)

    def edit(access_key: str, region: str) -> None:
        conn = {"conn_type": "aws", "login": access_key, "password": "secret-key", "extra": {"region_name": region}}
        monkeypatch.setenv("AIRFLOW_CONN_AWS_EDIT", json.dumps(conn))

    close_runners()
    yield edit
    close_runners()


def runner_of_a_new_trigger() -> Runner:
    """What a trigger deferred by a Batch task does at its start: fetch the AWS connection on
    the loop, then get the shared runner on a pool thread."""
    trigger = TorchXJobTrigger("aws_batch://torchx/edited-west:job", aws_conn_id="aws_edit")
    prefetched = asyncio.run(trigger._aws_connection())
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(trigger._runner, prefetched).result()


def test_an_edited_aws_connection_takes_effect_for_the_next_trigger(aws_connection: Callable[[str, str], None]) -> None:
    creds = {"aws_access_key_id": FAKE_CREDS["AWS_ACCESS_KEY_ID"], "aws_secret_access_key": "x"}
    queue = create_job_queue("edited-west", region_name="us-west-2", **creds)
    aws_connection("AKIDFIRST", "eu-west-1")
    first = runner_of_a_new_trigger()
    assert runner_of_a_new_trigger() is first  # unchanged: one shared runner
    with pytest.raises(UnknownQueueError, match="eu-west-1"):
        first.check_settings("aws_batch", {"queue": queue})
    aws_connection("AKIDSECOND", "us-west-2")  # edited in the UI while triggers run
    second = runner_of_a_new_trigger()
    assert second is not first
    assert "ENABLED" in second.check_settings("aws_batch", {"queue": queue})
    sched: Any = second._scheduler("aws_batch")
    assert sched.aws.session().get_credentials().access_key == "AKIDSECOND"
    assert sched.poller is not first._scheduler("aws_batch").poller  # other credentials, other poller
    assert runner_of_a_new_trigger() is second
