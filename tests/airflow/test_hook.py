"""The ``torchx`` connection: provider metadata, ``TorchXHook`` parsing, merging and
``test_connection`` (local, and AWS Batch against the moto server)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from airflow import __version__ as airflow_version
from airflow.exceptions import AirflowException, AirflowNotFoundException
from packaging.version import Version

from airflow_provider_torchx.core.errors import InvalidRunConfigError
from airflow_provider_torchx.core.specs import AppState, AppStatus, ReplicaStatus, RoleStatus
from airflow_provider_torchx.hooks.torchx import TorchXHook, TorchXSettings
from airflow_provider_torchx.provider_info import get_provider_info, installed_schedulers
from airflow_provider_torchx.watch import progress_line

pytestmark = pytest.mark.airflow_line  # the connection form: hook methods on 3.1, provider info later


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
    assert set(conn_type["conn-fields"]) == {
        "scheduler",
        "cfg",
        "session_name",
        "aws_conn_id",
        "region_name",
        "checkpoint_root",
        "rates",
    }
    # the watch pool's size is a declared setting, its default the one the watch path uses
    from airflow_provider_torchx.watch import DEFAULT_WATCH_THREADS

    option = info["config"]["torchx"]["options"]["watch_threads"]
    assert option["type"] == "integer" and int(option["default"]) == DEFAULT_WATCH_THREADS


def test_providers_manager_registers_the_connection_type() -> None:
    from airflow.providers_manager import ProvidersManager

    manager = ProvidersManager()
    try:
        from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime

        hooks = ProvidersManagerTaskRuntime().hooks
    except ImportError:  # Airflow 3.1: hooks are still core's ProvidersManager's
        hooks = manager.hooks
    hook_info = hooks["torchx"]
    assert hook_info is not None and hook_info.connection_testable
    assert hook_info.hook_class_name == "airflow_provider_torchx.hooks.torchx.TorchXHook"
    assert "airflow-provider-torchx" in manager.providers


def test_connection_form_shows_the_declared_fields() -> None:
    """What a fresh API server sends the UI for the connection form (``/ui/connections/hook_meta``;
    Airflow 3.1 builds it from the hook's methods, later versions from the provider info). In a
    subprocess: Airflow builds it once per process and other tests have already loaded the hooks."""
    script = (
        "import json\n"
        "from airflow.api_fastapi.core_api.services.ui.connections import HookMetaService\n"
        "(meta,) = [m for m in HookMetaService.hook_meta_data() if m.connection_type == 'torchx']\n"
        "print(json.dumps(meta.model_dump(mode='json')))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    meta = json.loads(proc.stdout.strip().splitlines()[-1])
    declared = get_provider_info()["connection-types"][0]
    shown = {
        name: (f["schema"]["title"], f["description"], f["schema"]["type"]) for name, f in meta["extra_fields"].items()
    }
    assert shown == {
        name: (f["label"], f["description"], f["schema"]["type"]) for name, f in declared["conn-fields"].items()
    }
    hidden = {name for name, f in meta["standard_fields"].items() if f and f["hidden"]}
    assert hidden == {"url_schema" if n == "schema" else n for n in declared["ui-field-behaviour"]["hidden-fields"]}
    # the scheduler is a choice of the installed ones; every other field suggests a value
    assert meta["extra_fields"]["scheduler"]["schema"]["enum"] == installed_schedulers()
    assert {"local_cwd", "local_dir", "aws_batch"} <= set(installed_schedulers())
    placeholders = declared["ui-field-behaviour"]["placeholders"]
    assert set(placeholders) == set(declared["conn-fields"])
    if Version(airflow_version) >= Version("3.2"):  # 3.1 shows the hook's placeholders instead
        examples = {n: f["schema"]["examples"] for n, f in meta["extra_fields"].items() if n != "scheduler"}
        assert examples == {n: [v] for n, v in placeholders.items() if n != "scheduler"}


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
    set_conn(monkeypatch, "tx_g", {"scheduler": "lsf"})
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
    assert not ok and "queue 'torchx-disabled' is DISABLED: AWS Batch runs no jobs from it" in message


def test_progress_line_says_why_a_job_waits() -> None:
    reps = [ReplicaStatus(id=k, state=AppState.PENDING, role="w") for k in (0, 1)]
    waiting = AppStatus(
        AppState.PENDING, msg="waiting for 4 GPUs, 2 free, held by a (0,1)", roles=[RoleStatus("w", reps)]
    )
    assert progress_line("h", waiting, 3) == (
        "h PENDING: replicas 0 running, 0 done, 2 pending; elapsed 3s; waiting for 4 GPUs, 2 free, held by a (0,1)"
    )
    assert progress_line("h", AppStatus(AppState.FAILED, msg="boom"), 3).endswith("elapsed 3s")


def test_progress_line_says_what_a_live_job_used_so_far_and_its_cost_where_priced() -> None:
    """Two GPUs running for half an hour at $3 a GPU-hour (the rates the job carries, which the
    runner priced its usage at): 1 GPU-h and $3 so far."""
    from airflow_provider_torchx.core.rates import Rates
    from airflow_provider_torchx.core.specs import Resource, Role
    from airflow_provider_torchx.core.usage import Attempt, compute_usage

    so_far = compute_usage(0.0, None, [Role("w", resource=Resource(1, 2, 64))], [Attempt("w", 0, 1, 0.0, None)])
    priced = dataclasses.replace(so_far, rates=Rates(gpu_hour=3.0))
    running = AppStatus(
        AppState.RUNNING, roles=[RoleStatus("w", [ReplicaStatus(0, AppState.RUNNING, "w")])], usage_so_far=so_far
    )
    assert progress_line("h", dataclasses.replace(running, usage_so_far=priced), 1800, now=1800.0) == (
        "h RUNNING: replicas 1 running, 0 done, 0 pending; elapsed 1800s; 1.0000 GPU-h, $3.00 so far"
    )
    assert progress_line("h", running, 1800, now=1800.0).endswith("; elapsed 1800s; 1.0000 GPU-h so far")
    assert progress_line("h", running, 1800).endswith("; elapsed 1800s")  # no time given: nothing counted


def test_checkpoint_root_operator_over_connection_over_config_over_the_schedulers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from airflow_provider_torchx.checkpointing import configured_root
    from airflow_provider_torchx.core.errors import InvalidRunConfigError
    from airflow_provider_torchx.core.runner import get_runner

    monkeypatch.setenv("AIRFLOW_TORCHX_STATE_DIR", str(tmp_path / "state"))
    hook, runner = TorchXHook("ckpt_conn", scheduler="local_cwd"), get_runner()
    assert configured_root(None, hook, runner, "local_cwd") == str(tmp_path / "state" / "checkpoints")
    assert configured_root(None, hook, runner, "aws_batch") is None
    monkeypatch.setenv("AIRFLOW__TORCHX__CHECKPOINT_ROOT", "s3://cfg/root")
    assert configured_root(None, hook, runner, "aws_batch") == "s3://cfg/root"
    set_conn(monkeypatch, "ckpt_conn", {"scheduler": "local_cwd", "checkpoint_root": "/conn/root/"})
    hook = TorchXHook("ckpt_conn", scheduler="local_cwd")
    assert configured_root(None, hook, runner, "local_cwd") == "/conn/root"
    assert configured_root("/op/root", hook, runner, "local_cwd") == "/op/root"
    set_conn(monkeypatch, "ckpt_conn", {"scheduler": "local_cwd", "checkpoint_root": "relative"})
    with pytest.raises(InvalidRunConfigError, match=r"connection 'ckpt_conn' extra checkpoint_root: 'relative'"):
        configured_root(None, TorchXHook("ckpt_conn", scheduler="local_cwd"), runner, "local_cwd")


def test_rates_from_the_connection_over_the_config_and_bad_ones_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The connection's extra ``rates`` wins over ``[torchx] rates``; neither: unpriced. A bad
    rate is refused when the settings are read (before any submit), naming where it was."""
    from airflow_provider_torchx.core.errors import InvalidRunConfigError
    from airflow_provider_torchx.core.rates import Rates

    set_conn(monkeypatch, "priced", {"scheduler": "local_cwd"})
    assert TorchXHook("priced").settings.rates is None
    monkeypatch.setenv("AIRFLOW__TORCHX__RATES", '{"gpu_hour": 1.5}')
    assert TorchXHook("priced").settings.rates == Rates(gpu_hour=1.5)
    set_conn(monkeypatch, "priced", {"scheduler": "local_cwd", "rates": {"gpu_hour": 4, "vcpu_hour": 0.1}})
    assert TorchXHook("priced").settings.rates == Rates(gpu_hour=4.0, vcpu_hour=0.1)
    set_conn(monkeypatch, "priced", {"scheduler": "local_cwd", "rates": {"gpu_hour": -4}})
    with pytest.raises(
        InvalidRunConfigError, match=r"connection 'priced' extra rates: rate gpu_hour=-4 is not allowed"
    ):
        _ = TorchXHook("priced").settings
    set_conn(monkeypatch, "priced", {"scheduler": "local_cwd"})
    monkeypatch.setenv("AIRFLOW__TORCHX__RATES", '{"gpu": 1}')
    with pytest.raises(InvalidRunConfigError, match=r"\[torchx\] rates: unknown rate 'gpu'; allowed: gpu_hour"):
        _ = TorchXHook("priced").settings
