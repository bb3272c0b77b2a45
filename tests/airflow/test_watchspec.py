"""The deferred task's watch as one frozen value (``triggers/watchspec.py``): the trigger's
serialised kwargs are exactly the spec's fields (tested against an exact dict, as the Amazon
provider tests its triggers), what a trigger of the previous release serialised is read back
the same, an unknown argument is refused naming it, and ``for_job`` decides the fields from
what the scheduler declares."""

from __future__ import annotations

import dataclasses
import socket
from typing import Any

import pytest

from airflow_provider_torchx.core.cursors import LogPosition
from airflow_provider_torchx.core.guards import Guards
from airflow_provider_torchx.core.identity import TaskIdentity
from airflow_provider_torchx.core.rates import Rates
from airflow_provider_torchx.core.runner import Runner
from airflow_provider_torchx.core.schedulers.api import SchedulerCapabilities
from airflow_provider_torchx.hooks.torchx import TorchXSettings
from airflow_provider_torchx.triggers.torchx import TorchXJobTrigger
from airflow_provider_torchx.triggers.watchspec import WatchSpec
from tests.core.test_contract import Core

pytestmark = pytest.mark.airflow

IDENTITY = TaskIdentity("dag", "task", "run-1", 2)
SETTINGS = TorchXSettings("batchlike", aws_conn_id="aws_prod", region_name="eu-west-1")
GUARDS = Guards(600.0, 8.0, since=99.0, max_cost=50.0, rates=Rates(gpu_hour=2.5, vcpu_hour=0.05))


class AwsLike(Core):
    """A scheduler that takes an AWS session and has ids of its own."""

    capabilities = SchedulerCapabilities(aws_session=True)

    def native_id(self, app_id: str) -> str | None:
        return f"native-{app_id}"


class HostBound(Core):
    """A scheduler whose jobs are watched from their host only."""

    capabilities = SchedulerCapabilities(host_bound=True)


def trigger_for(scheduler: str, **kwargs: Any) -> TorchXJobTrigger:
    factories = {"batchlike": AwsLike, "hostlike": HostBound}
    runner = Runner("torchx", {name: lambda session, name=name: factories[name](name, session) for name in factories})
    return TorchXJobTrigger.for_job(
        f"{scheduler}://torchx/app-1",
        runner,
        SETTINGS,
        poll_interval=5.0,
        stream_logs=True,
        position=LogPosition(seq=3, cursors={"trainer/0": '{"skip": 4}'}),
        identity=IDENTITY.labels(),
        deadline=1000.0,
        started_at=100.0,
        **kwargs,
    )


def test_a_triggers_serialised_kwargs_are_exactly_its_specs_fields() -> None:
    reason = "moved to batch_ondemand: it did not start within start_timeout=600s"  # a capacity ladder's
    trigger = trigger_for("batchlike", cancel_on_kill=True, guards=GUARDS, start_timeout_reason=reason)
    assert trigger.serialize() == (
        "airflow_provider_torchx.triggers.torchx.TorchXJobTrigger",
        {
            "app_handle": "batchlike://torchx/app-1",
            "aws_conn_id": "aws_prod",
            "region_name": "eu-west-1",
            "poll_interval": 5.0,
            "stream_logs": True,
            "log_cursors": {"trainer/0": '{"skip": 4}'},
            "cursor_seq": 3,
            "identity": {
                "airflow.dag_id": "dag",
                "airflow.task_id": "task",
                "airflow.run_id": "run-1",
                "airflow.map_index": "2",
            },
            "deadline": 1000.0,
            "host": None,
            "started_at": 100.0,
            "cancel_on_kill": True,
            "native_id": "native-app-1",
            "start_timeout": 600.0,
            "max_gpu_hours": 8.0,
            "max_cost": 50.0,
            "rates": {"gpu_hour": 2.5, "vcpu_hour": 0.05, "memory_gb_hour": 0.0},
            "start_timeout_reason": reason,
        },
    )


def test_a_watch_until_started_is_serialised_only_when_set_and_rebuilds_the_same() -> None:
    """``until_started`` (a capacity ladder's task that does not wait for completion) is a key
    of the kwargs only when set: every other trigger's kwargs stay those of the exact dict above."""
    _, plain = trigger_for("batchlike").serialize()
    assert "until_started" not in plain
    path, kwargs = trigger_for("batchlike", until_started=True).serialize()
    assert kwargs == plain | {"until_started": True}
    again = TorchXJobTrigger(**kwargs)
    assert again.serialize() == (path, kwargs) and again.until_started is True


def test_a_host_bound_job_carries_its_host_and_no_aws_settings_nor_guards_unset() -> None:
    _, kwargs = trigger_for("hostlike").serialize()
    assert kwargs["host"] == socket.gethostname()
    unset = ("aws_conn_id", "region_name", "native_id", "start_timeout", "max_gpu_hours", "max_cost", "rates")
    assert {key: kwargs[key] for key in unset} == dict.fromkeys(unset)
    assert kwargs["cancel_on_kill"] is False


def test_what_a_trigger_serialised_rebuilds_the_same_trigger_and_watch() -> None:
    path, kwargs = trigger_for("batchlike", guards=GUARDS).serialize()
    again = TorchXJobTrigger(**kwargs)
    assert again.serialize() == (path, kwargs)
    assert again.spec == WatchSpec(**kwargs)
    assert again.spec.position() == LogPosition(seq=3, cursors={"trainer/0": '{"skip": 4}'})
    assert again.spec.task_identity() == IDENTITY
    assert again.spec.guards() == dataclasses.replace(GUARDS, since=100.0), "the guards date from the task's start"
    read = (again.app_handle, again.native_id, again.identity)
    assert read == (kwargs["app_handle"], "native-app-1", kwargs["identity"]), "the spec's fields read as attributes"


def test_an_unknown_argument_is_refused_naming_it() -> None:
    with pytest.raises(TypeError, match=r"TorchXJobTrigger: unknown argument\(s\) 'max_gpu_hour'; known: aws_conn_id"):
        TorchXJobTrigger("local_cwd://torchx/app-3", max_gpu_hour=1.0)


def test_the_spec_is_frozen_and_its_kwargs_are_copies() -> None:
    trigger = trigger_for("batchlike")
    with pytest.raises(dataclasses.FrozenInstanceError):
        trigger.spec.poll_interval = 1.0  # type: ignore[misc]
    _, kwargs = trigger.serialize()
    kwargs["log_cursors"]["trainer/0"] = "moved"
    assert trigger.serialize()[1]["log_cursors"] == {"trainer/0": '{"skip": 4}'}
