"""Secrets in a job's env stay masked in the task log, the XCom return value, the failure
message and the trigger's events (real Airflow, ``dag.test()``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.airflow.dags.torchx_test_dags import SECRET
from tests.fixtures.triggerer import TriggererChannel

pytestmark = [pytest.mark.airflow, pytest.mark.airflow_line]  # each line's secrets masker


def test_the_dry_run_masks_secret_env_values(run_dag: Any) -> None:
    dag_run, out = run_dag("torchx_test_secret_dryrun")
    assert dag_run.state == "success", out[-4000:]
    rendered = dag_run.get_task_instance("dryrun").xcom_pull(task_ids="dryrun")
    assert "Dry run on local_cwd" in out
    # The return value is the request's JSON (XCom hands it back parsed).
    for text in (out, rendered if isinstance(rendered, str) else json.dumps(rendered)):
        assert SECRET not in text
        assert '"WANDB_API_KEY": "***"' in text and "visible-value" in text


@pytest.mark.parametrize("deferrable", [pytest.param(False, id="worker"), pytest.param(True, id="deferred")])
def test_a_failure_that_prints_the_secret_keeps_it_masked(run_dag: Any, deferrable: bool) -> None:
    dag_run, out = run_dag("torchx_test_secret_fail", deferrable=deferrable)
    assert dag_run.state == "failed"
    assert "the key is ***" in out, out[-4000:]  # the replica's line and the failure's last lines
    assert SECRET not in out


NAMES = ["WANDB_API_KEY", "db-password", "GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "HTTPS_PROXY", "PATH", "NCCL_DEBUG"]


@pytest.mark.parametrize("name", NAMES)
def test_the_core_rule_agrees_with_airflows(name: str) -> None:
    from airflow_provider_torchx._compat import should_hide_value_for_key
    from airflow_provider_torchx.core.masking import is_sensitive_key

    assert is_sensitive_key(name) == bool(should_hide_value_for_key(name))


def test_registered_env_secrets_are_redacted() -> None:
    from airflow_provider_torchx.core.specs import AppDef, Role
    from airflow_provider_torchx.masking import MaskedLog, redact, register_app_secrets

    secret = "registered-0123456789"
    app = AppDef("a", roles=[Role("r", entrypoint="true", env={"SERVICE_TOKEN": secret, "PLAIN": "plain-value-1"})])
    assert register_app_secrets(app) == 1
    assert redact(f"x {secret} plain-value-1") == "x *** plain-value-1"
    seen: list[tuple[Any, ...]] = []

    class Sink:
        def info(self, *args: Any) -> None:
            seen.append(args)

    MaskedLog(Sink()).info("%s and %s", secret, 3)
    assert seen == [("%s and %s", "***", 3)]


def test_the_triggerer_reads_the_secrets_of_the_job_it_watches(caplog: pytest.LogCaptureFixture) -> None:
    from airflow_provider_torchx.core.specs import AppDef, Role
    from airflow_provider_torchx.masking import job_secrets

    secret = "from-the-job-record-0123"
    app = AppDef("a", roles=[Role("r", entrypoint="true", env={"HF_TOKEN": secret, "PLAIN": "x-0123456"})])
    assert job_secrets({"local_cwd://s/a-1": app}.get, "local_cwd://s/a-1") == [("HF_TOKEN", secret)]

    def broken(handle: str) -> AppDef:
        raise OSError("store unreadable")

    assert job_secrets(broken, "local_cwd://s/a-2") == []  # watching goes on
    assert "could not read the env of local_cwd://s/a-2" in caplog.text


def test_secrets_registered_from_the_loop_reach_both_maskers(triggerer_channel: TriggererChannel) -> None:
    import asyncio

    from airflow_provider_torchx.masking import amask_secrets, redact

    secret = "registered-on-the-loop-0123"
    asyncio.run(amask_secrets([("HF_TOKEN", secret)]))
    assert redact(f"got {secret}") == "got ***"
    assert [(m.name, m.value) for m in triggerer_channel.sent_of("MaskSecret")] == [("HF_TOKEN", secret)]


def test_a_value_from_a_sensitive_variable_is_masked(run_dag: Any) -> None:
    from airflow.models import Variable

    value = "from-a-variable-0123456789"
    Variable.set("torchx_test_token", value)
    try:
        dag_run, out = run_dag("torchx_test_secret_variable")
    finally:
        Variable.delete("torchx_test_token")
    assert dag_run.state == "success", out[-4000:]
    rendered = dag_run.get_task_instance("dryrun").xcom_pull(task_ids="dryrun")
    for text in (out, rendered if isinstance(rendered, str) else json.dumps(rendered)):
        assert value not in text and '"RUN_SETTING": "***"' in text


def test_a_password_from_a_connection_in_env_is_masked(run_dag: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The way docs/operators.md gives to pass a secret ("Passing secrets"): env from a
    connection, under a sensitive name; the value is in neither the task log nor the XCom."""
    value = "from-a-connection-0123456789"
    monkeypatch.setenv("AIRFLOW_CONN_TORCHX_TEST_HF", json.dumps({"conn_type": "generic", "password": value}))
    dag_run, out = run_dag("torchx_test_secret_connection")
    assert dag_run.state == "success", out[-4000:]
    rendered = dag_run.get_task_instance("dryrun").xcom_pull(task_ids="dryrun")
    for text in (out, rendered if isinstance(rendered, str) else json.dumps(rendered)):
        assert value not in text and '"HF_TOKEN": "***"' in text


def test_a_dry_run_shows_the_service_account_the_connection_named() -> None:
    """Airflow's masker, reading a connection's extra, registers ``cfg.service_account`` (its
    name is on Airflow's sensitive list): the dry run keeps that name and still masks secrets."""
    from airflow_provider_torchx._compat import mask_locally
    from airflow_provider_torchx.masking import redact, redact_request

    cfg = {"queue": "eks-gpu", "service_account": "torchx-trainer-sa", "namespace": "training"}
    mask_locally({"scheduler": "aws_batch", "cfg": cfg})  # as the connection's extra is masked when read
    mask_locally("wandb-0123456789", "WANDB_API_KEY")
    request = '"serviceAccountName": "torchx-trainer-sa", "namespace": "training", "WANDB_API_KEY": "wandb-0123456789"'
    assert redact(request).count("***") == 2  # Airflow's masker alone hides the name
    assert redact_request(request, cfg) == (
        '"serviceAccountName": "torchx-trainer-sa", "namespace": "training", "WANDB_API_KEY": "***"'
    )


def test_an_eks_dry_run_in_a_task_shows_the_service_account(run_dag: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The dry run exists to check the service account: the task log and the XCom show its name
    although the connection's extra, read by Airflow, names it ``service_account``; a secret
    from a connection stays masked."""
    secret = "from-a-connection-0123456789"
    cfg = {"queue": "eks-gpu", "platform": "EKS", "namespace": "training", "service_account": "torchx-trainer-sa"}
    extra = {"scheduler": "aws_batch", "region_name": "us-east-1", "cfg": cfg}
    monkeypatch.setenv("AIRFLOW_CONN_TORCHX_TEST_EKS", json.dumps({"conn_type": "torchx", "extra": extra}))
    monkeypatch.setenv("AIRFLOW_CONN_TORCHX_TEST_HF", json.dumps({"conn_type": "generic", "password": secret}))
    dag_run, out = run_dag("torchx_test_eks_dryrun")
    assert dag_run.state == "success", out[-4000:]
    rendered = dag_run.get_task_instance("dryrun").xcom_pull(task_ids="dryrun")
    for text in (out, rendered if isinstance(rendered, str) else json.dumps(rendered)):
        assert '"serviceAccountName": "torchx-trainer-sa"' in text, text[-3000:]
        assert secret not in text and '"HF_TOKEN"' in text
