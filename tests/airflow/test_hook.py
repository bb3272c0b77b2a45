"""The ``torchx`` connection: provider metadata, ``TorchXHook`` parsing, merging and
``test_connection`` (local, and AWS Batch against the moto server)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from airflow.exceptions import AirflowException, AirflowNotFoundException

from airflow_provider_torchx.core.errors import InvalidRunConfigError
from airflow_provider_torchx.hooks.torchx import TorchXHook, TorchXSettings
from airflow_provider_torchx.provider_info import get_provider_info


def set_conn(monkeypatch: pytest.MonkeyPatch, conn_id: str, extra: dict[str, Any]) -> None:
    """Define a ``torchx`` connection through the environment (Airflow's JSON form)."""
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "torchx", "extra": extra}))


def test_provider_info_matches_airflows_schema() -> None:
    import airflow
    import jsonschema

    schema = json.loads((Path(airflow.__file__).parent / "provider_info.schema.json").read_text())
    info = get_provider_info()
    jsonschema.validate(info, schema)
    assert info["package-name"] == "airflow-provider-torchx"
    (conn_type,) = info["connection-types"]
    assert conn_type["connection-type"] == "torchx"
    assert set(conn_type["conn-fields"]) == {"scheduler", "cfg", "session_name", "aws_conn_id", "region_name"}


def test_providers_manager_registers_the_connection_type() -> None:
    from airflow.providers_manager import ProvidersManager
    from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime

    hook_info = ProvidersManagerTaskRuntime().hooks["torchx"]
    assert hook_info is not None and hook_info.connection_testable
    assert hook_info.hook_class_name == "airflow_provider_torchx.hooks.torchx.TorchXHook"
    manager = ProvidersManager()
    assert "airflow-provider-torchx" in manager.providers
    assert "extra__torchx__scheduler" in manager.connection_form_widgets
    assert "password" in manager.field_behaviours["torchx"]["hidden_fields"]


def test_settings_from_connection_with_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    set_conn(
        monkeypatch,
        "tx_a",
        {"scheduler": "aws_batch", "cfg": "queue=q1,priority=3", "session_name": "s1", "region_name": "eu-west-1"},
    )
    assert TorchXHook("tx_a").settings == TorchXSettings(
        scheduler="aws_batch", cfg="queue=q1,priority=3", session_name="s1", region_name="eu-west-1"
    )
    hook = TorchXHook("tx_a", scheduler="local_cwd", session_name="s2")
    assert (hook.settings.scheduler, hook.settings.session_name, hook.settings.region_name) == (
        "local_cwd",
        "s2",
        "eu-west-1",
    )


def test_ui_prefixed_extras_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    set_conn(monkeypatch, "tx_b", {"extra__torchx__scheduler": "local_cwd", "extra__torchx__session_name": ""})
    assert TorchXHook("tx_b").settings == TorchXSettings(scheduler="local_cwd")


def test_cfg_string_and_dict_merge_operator_over_connection(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    set_conn(monkeypatch, "tx_c", {"scheduler": "local_cwd", "cfg": f"log_dir={tmp_path},prepend_cwd=true"})
    hook = TorchXHook("tx_c")
    assert hook.resolve_cfg() == {"log_dir": str(tmp_path), "prepend_cwd": True}
    assert hook.resolve_cfg("prepend_cwd=false") == {"log_dir": str(tmp_path), "prepend_cwd": False}
    assert hook.resolve_cfg({"log_dir": "/elsewhere"}) == {"log_dir": "/elsewhere", "prepend_cwd": True}


def test_cfg_as_json_object(monkeypatch: pytest.MonkeyPatch) -> None:
    set_conn(monkeypatch, "tx_d", {"scheduler": "local_cwd", "cfg": {"prepend_cwd": True}})
    assert TorchXHook("tx_d").resolve_cfg() == {"prepend_cwd": True}


def test_bad_cfg_names_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    set_conn(monkeypatch, "tx_e", {"scheduler": "local_cwd", "cfg": "colour=blue"})
    with pytest.raises(InvalidRunConfigError, match="colour"):
        TorchXHook("tx_e").resolve_cfg()
    ok, message = TorchXHook("tx_e").test_connection()
    assert not ok and "colour" in message


def test_no_connection_needs_a_scheduler() -> None:
    assert TorchXHook("tx_missing", scheduler="local_cwd").settings == TorchXSettings(scheduler="local_cwd")
    assert TorchXHook(None, scheduler="local_cwd").settings.scheduler == "local_cwd"
    with pytest.raises(AirflowNotFoundException, match="'tx_missing' is not defined and no scheduler was given"):
        TorchXHook("tx_missing").settings  # noqa: B018


def test_connection_without_scheduler(monkeypatch: pytest.MonkeyPatch) -> None:
    set_conn(monkeypatch, "tx_f", {"cfg": "queue=q"})
    with pytest.raises(AirflowException, match="names no scheduler"):
        TorchXHook("tx_f").settings  # noqa: B018


def test_unknown_scheduler_fails_test_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    set_conn(monkeypatch, "tx_g", {"scheduler": "slurm"})
    ok, message = TorchXHook("tx_g").test_connection()
    assert not ok and "UnknownSchedulerError" in message and "local_cwd" in message


def test_local_test_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    set_conn(monkeypatch, "tx_h", {"scheduler": "local_cwd"})
    ok, message = TorchXHook("tx_h").test_connection()
    assert ok, message


def test_runner_is_shared_per_settings() -> None:
    a = TorchXHook(None, scheduler="local_cwd", session_name="shared").get_runner()
    b = TorchXHook(None, scheduler="local_cwd", session_name="shared").get_conn()
    c = TorchXHook(None, scheduler="local_cwd", session_name="other").get_runner()
    assert a is b and a is not c
    assert c.session_name == "other"


@pytest.mark.docker
def test_batch_test_connection_checks_the_queue(
    monkeypatch: pytest.MonkeyPatch, aws_env: str, batch_queue: str
) -> None:
    import boto3

    set_conn(monkeypatch, "tx_batch_ok", {"scheduler": "aws_batch", "cfg": f"queue={batch_queue}"})
    ok, message = TorchXHook("tx_batch_ok").test_connection()
    assert ok, message
    assert "ENABLED" in message

    set_conn(monkeypatch, "tx_batch_missing", {"scheduler": "aws_batch", "cfg": "queue=no-such-queue"})
    ok, message = TorchXHook("tx_batch_missing").test_connection()
    assert not ok and "'no-such-queue' does not exist" in message

    batch = boto3.client("batch")
    env_arn = batch.describe_job_queues(jobQueues=[batch_queue])["jobQueues"][0]["computeEnvironmentOrder"]
    batch.create_job_queue(
        jobQueueName="torchx-disabled", state="DISABLED", priority=1, computeEnvironmentOrder=env_arn
    )
    set_conn(monkeypatch, "tx_batch_disabled", {"scheduler": "aws_batch", "cfg": "queue=torchx-disabled"})
    ok, message = TorchXHook("tx_batch_disabled").test_connection()
    assert not ok and "is DISABLED; it must be ENABLED" in message
