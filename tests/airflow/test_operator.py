"""``TorchXRunOperator`` and ``TorchXJobSensor`` pieces outside a DAG run: argument checks, the
app it builds, identity labels, ``on_kill``, links and the import hot path (adoption on retry:
``test_reattach.py``)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from typing import Any

import pytest
from airflow.exceptions import AirflowFailException
from botocore.exceptions import ClientError

from airflow_provider_torchx.cancels import outside_canceller, task_cancel_reason
from airflow_provider_torchx.core.errors import SchedulerSetupError, UnknownSchedulerError
from airflow_provider_torchx.core.identity import TaskIdentity
from airflow_provider_torchx.core.runner import Runner, get_runner
from airflow_provider_torchx.core.schedulers.api import CancelledBy, DescribeAppResponse
from airflow_provider_torchx.core.specs import AppDef, AppState, Resource, Role
from airflow_provider_torchx.hooks.torchx import close_runners
from airflow_provider_torchx.links.torchx import TorchXConsoleLink, TorchXJobLink, job_links
from airflow_provider_torchx.operators.checks import fail_without_retry
from airflow_provider_torchx.operators.torchx import TorchXRunOperator
from airflow_provider_torchx.sensors.torchx import TorchXJobSensor
from airflow_provider_torchx.watch import task_identity
from tests.airflow.helpers import FakeTI

pytestmark = pytest.mark.airflow_line  # each line's exception classes and the import hot path

SLEEP_APP = AppDef(name="sleeper", roles=[Role(name="s", image="local", entrypoint="sleep", args=["60"])])


def test_exactly_one_of_app_or_component() -> None:
    with pytest.raises(ValueError, match=r"exactly one of app= .* or component="):
        TorchXRunOperator(task_id="t", scheduler="local_cwd")
    with pytest.raises(ValueError, match="exactly one of app="):
        TorchXRunOperator(task_id="t", app=SLEEP_APP, component="utils.echo")
    with pytest.raises(TypeError, match="app: expected an AppDef, got str"):
        TorchXRunOperator(task_id="t", app="utils.echo")  # type: ignore[arg-type]
    for bad in (0, -1, float("nan"), "soon"):
        with pytest.raises(
            ValueError, match=rf"poll_interval: {bad!r} is not allowed: expected a number of seconds > 0"
        ):
            TorchXRunOperator(task_id="t", component="utils.echo", poll_interval=bad)


def test_templated_fields() -> None:
    assert tuple(TorchXRunOperator.template_fields) == ("component_args", "app_name", "env", "cfg")
    assert tuple(TorchXJobSensor.template_fields) == ("app_handle",)


def test_build_app_from_component_with_name_and_env() -> None:
    op = TorchXRunOperator(
        task_id="t",
        component="utils.echo",
        component_args={"msg": "hi", "num_replicas": 3},
        app_name="greeting",
        env={"A": "1"},
    )
    app = op.build_app()
    assert app.name == "greeting"
    assert app.roles[0].num_replicas == 3 and app.roles[0].args == ["hi"]
    assert app.roles[0].env == {"A": "1"}


def test_build_app_copies_the_given_app() -> None:
    op = TorchXRunOperator(task_id="t", app=SLEEP_APP, env={"B": "2"})
    app = op.build_app()
    assert app.roles[0].env == {"B": "2"} and SLEEP_APP.roles[0].env == {}


def test_identity_labels_never_hold_the_try_number() -> None:
    labels = task_identity({"ti": FakeTI(try_number=3, map_index=2)}).labels()  # type: ignore[typeddict-item]
    assert labels == {
        "airflow.dag_id": "dag",
        "airflow.task_id": "task",
        "airflow.run_id": "manual__2024-01-01T00:00:00+00:00",
        "airflow.map_index": "2",
    }


@pytest.mark.parametrize("cancel_on_kill", [True, False])
def test_on_kill_cancels_only_when_asked(local_jobs: tuple[Runner, list[str]], cancel_on_kill: bool) -> None:
    runner, handles = local_jobs
    handle = runner.run(SLEEP_APP, "local_cwd")
    handles.append(handle)
    op = TorchXRunOperator(task_id="t", app=SLEEP_APP, scheduler="local_cwd", cancel_on_kill=cancel_on_kill)
    op.app_handle, op._runner, op._identity = handle, runner, TaskIdentity("adhoc_airflow", "t", "r")
    op.on_kill()
    status = runner.wait(handle, wait_interval=0.2, timeout=2 if not cancel_on_kill else 30, cancel_on_signal=False)
    assert status is not None
    assert (status.state == AppState.CANCELLED) is cancel_on_kill
    if cancel_on_kill:  # a cancel of the task's own making, not one from outside
        desc = runner.describe_app(handle)
        assert desc is not None and desc.cancel_reason == "task adhoc_airflow.t of run r was killed"
        assert desc.cancelled_by == CancelledBy.TASK and outside_canceller(desc) is None


USER, TASK, REAPER = CancelledBy.USER, CancelledBy.TASK, CancelledBy.REAPER


@pytest.mark.parametrize(
    ("state", "requested", "reason", "by", "who"),
    [
        (AppState.CANCELLED, True, "airflow-torchx cancel by alice@box", USER, "airflow-torchx cancel by alice@box"),
        (AppState.CANCELLED, True, None, USER, "a user (who was not recorded)"),
        (AppState.CANCELLED, True, "task d.t of run r timed out (did not end within 5s)", TASK, None),
        (AppState.CANCELLED, True, None, TASK, None),
        (
            AppState.CANCELLED,
            True,
            "task d.t of run r was marked failed",
            REAPER,
            "the orphaned-jobs rule (task d.t of run r was marked failed)",
        ),
        (AppState.CANCELLED, True, None, None, "a cancel request through the scheduler (who asked was not recorded)"),
        # not said: words decide nothing, whatever they read like
        (AppState.CANCELLED, True, "Airflow task d.t: timeout", None, "Airflow task d.t: timeout"),
        (
            AppState.FAILED,
            False,
            "a TerminateJob on AWS Batch outside airflow-torchx: ops",
            None,
            "a TerminateJob on AWS Batch outside airflow-torchx: ops",
        ),
        (AppState.FAILED, False, None, None, None),
        (AppState.SUCCEEDED, True, "airflow-torchx cancel by alice@box", USER, None),
    ],
    ids=[
        "cli",
        "user-unnamed",
        "own-timeout",
        "own-unworded",
        "reaper",
        "unrecorded",
        "unsaid-with-task-words",
        "batch-by-hand",
        "failed",
        "succeeded",
    ],
)
def test_who_cancelled_from_outside(
    state: AppState, requested: bool, reason: str | None, by: CancelledBy | None, who: str | None
) -> None:
    desc = DescribeAppResponse(state=state, cancel_requested=requested, cancel_reason=reason, cancelled_by=by)
    assert outside_canceller(desc) == who


def test_a_tasks_own_cancel_reason_names_the_task_instance() -> None:
    named = task_cancel_reason(TaskIdentity("d", "t", "r", 2), "was killed")
    assert named == "task d.t[2] of run r was killed"
    assert task_cancel_reason(None, "was killed") == "an unlabelled job was killed"


def test_links_point_at_the_job_page_and_a_web_console_only() -> None:
    batch, console = "aws_batch://torchx/q:train-1", "https://console.aws.amazon.com/batch/home#jobs/detail/abc"
    assert job_links(batch, console, "torchx_batch") == [
        (TorchXJobLink(), "/torchx/job?handle=aws_batch%3A%2F%2Ftorchx%2Fq%3Atrain-1&conn_id=torchx_batch"),
        (TorchXConsoleLink(), console),
    ]
    ti = FakeTI()
    for link, url in job_links("local_cwd://torchx/job-1", "file:///var/torchx/job-1", None):
        link.persist({"ti": ti}, url)
    assert ti.xcoms == {
        "_link_TorchXJobLink": "/torchx/job?handle=local_cwd%3A%2F%2Ftorchx%2Fjob-1",
        "_link_TorchXConsoleLink": "",
    }


@pytest.mark.parametrize(
    ("base_url", "absolute"),
    [
        ("https://airflow.example.com", "https://airflow.example.com/torchx/job?handle=h"),
        ("https://airflow.example.com/", "https://airflow.example.com/torchx/job?handle=h"),
        ("http://host:8080/airflow/", "http://host:8080/airflow/torchx/job?handle=h"),  # below a prefix
        ("", "http://localhost:8080/torchx/job?handle=h"),  # Airflow's own fallback
    ],
)
def test_the_task_log_shows_the_job_page_as_a_full_address(
    base_url: str, absolute: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job page's link (same-site, under the base URL's path) becomes, in the task log, a
    full address on ``[api] base_url`` as Airflow's own log URL is; a web console's is kept."""
    from airflow_provider_torchx.links.torchx import absolute_url, job_page_url

    monkeypatch.setenv("AIRFLOW__API__BASE_URL", base_url)
    assert absolute_url(job_page_url("h")) == absolute
    assert absolute_url("https://console.aws.amazon.com/batch/x") == "https://console.aws.amazon.com/batch/x"


def test_no_job_no_links_and_no_xcom_read() -> None:
    """A dry run or a task that failed before submitting: Airflow's task runner asks each link
    at the end; both are empty without reading XCom (a missing XCom logs an error)."""
    op = TorchXRunOperator(task_id="t", app=SLEEP_APP, scheduler="local_cwd")
    assert op.app_handle is None
    for link in op.operator_extra_links:
        assert link.get_link(op, ti_key=None) == ""  # type: ignore[arg-type]  # a key would be read, None fails


def test_operator_import_does_not_load_cloud_or_docker_clients() -> None:
    """In a fresh interpreter; it also checks ``deferrable`` defaults to ``[operators] default_deferrable``."""
    code = (
        "import sys, json\n"
        "import airflow_provider_torchx.operators.torchx as op, airflow_provider_torchx.sensors.torchx as se\n"
        "import airflow_provider_torchx.triggers.torchx, airflow_provider_torchx.hooks.torchx\n"
        "import airflow_provider_torchx.links.torchx, airflow_provider_torchx.plugins.torchx\n"
        "run = op.TorchXRunOperator(task_id='a', component='utils.echo')\n"
        "op.TorchXRunOperator(task_id='c', component='utils.echo', scheduler='local_cwd', cfg={'log_dir': '/l'})\n"
        "op.TorchXRunOperator(task_id='d', component='utils.echo', scheduler='aws_batch', cfg={'queue': 'q'})\n"
        "sense = se.TorchXJobSensor(task_id='b', app_handle='local_cwd://s/x')\n"
        "modules = sorted(sys.modules)  # after the parse-time checks of the operators' arguments\n"
        "print(json.dumps([modules, run.deferrable, sense.deferrable]))\n"
    )
    env = {**os.environ, "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": "True"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    modules, run_deferrable, sensor_deferrable = json.loads(out.strip().splitlines()[-1])
    heavy = [m for m in modules if m.split(".")[0] in ("boto3", "botocore", "docker", "moto")]
    assert heavy == []
    batch = [m for m in modules if m.startswith("airflow_provider_torchx.core.schedulers.aws_batch")]
    # Only the light run options (the parse-time check of the Batch task's cfg), never the scheduler.
    assert batch == [
        "airflow_provider_torchx.core.schedulers.aws_batch",
        "airflow_provider_torchx.core.schedulers.aws_batch.run_options",
    ], batch
    assert "airflow_provider_torchx.core.schedulers.local.scheduler" not in modules
    assert "airflow_provider_torchx.operators.torchx" in modules
    assert "airflow_provider_torchx.plugins.app" not in modules, "every process loads the plugin: its web app waits"
    assert run_deferrable is True and sensor_deferrable is True


def test_parsing_a_dag_file_loads_no_trigger_or_listener() -> None:
    """Importing the operator and sensor modules and building their tasks (what parsing a DAG
    file does) loads none of Airflow's ``airflow.triggers`` or ``airflow.listeners`` beyond what
    Airflow's own base classes load (all of them on 3.1, none on 3.3), nor the provider's
    trigger, watching path or reaper: they load when a task runs or defers. In a fresh
    interpreter."""
    code = (
        "import sys, json\n"
        "from airflow.sdk import BaseOperator, BaseSensorOperator\n"
        "base = set(sys.modules)\n"
        "import airflow_provider_torchx.operators.torchx as op, airflow_provider_torchx.sensors.torchx as se\n"
        "op.TorchXRunOperator(task_id='a', component='utils.echo', scheduler='local_cwd', cfg={'log_dir': '/l'})\n"
        "se.TorchXJobSensor(task_id='b', app_handle='local_cwd://s/x')\n"
        "print(json.dumps(sorted(set(sys.modules) - base)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    added = json.loads(out.strip().splitlines()[-1])
    assert "airflow_provider_torchx.operators.torchx" in added
    loaded = [
        m
        for m in added
        if m.startswith(("airflow.triggers", "airflow.listeners"))
        or m in ("airflow_provider_torchx.triggers.torchx", "airflow_provider_torchx.watch")
        or m.startswith("airflow_provider_torchx.reaper")
    ]
    assert loaded == []


def test_sensor_poke_fails_with_the_reason(local_jobs: tuple[Runner, list[str]]) -> None:
    from airflow.exceptions import AirflowException

    runner, handles = local_jobs
    app = AppDef(name="bad", roles=[Role(name="b", image="local", entrypoint="sh", args=["-c", "echo oops; exit 4"])])
    handle = runner.run(app, "local_cwd")
    handles.append(handle)
    runner.wait(handle, wait_interval=0.2, timeout=30, cancel_on_signal=False)
    sensor = TorchXJobSensor(task_id="s", app_handle=handle, torchx_conn_id="tx_none")
    with pytest.raises(AirflowException, match=r"failed replica b/0, exit code 4(.|\n)*oops"):
        sensor.poke({"ti": FakeTI()})  # type: ignore[typeddict-item]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"component": "utils.echo", "cfg": "colour=blue"}, "unknown option 'colour'"),
        ({"component": "utils.echo", "cfg": {"log_dri": "/tmp"}}, "Did you mean 'log_dir'"),
        ({"component": "utils.echo", "cfg": {"attempt_timeout": 0}}, "attempt_timeout=0 is below its minimum"),
        ({"component": "utils.echo", "cfg": "attempt_timeout=-5"}, "attempt_timeout=-5 is below its minimum"),
        (
            {"component": "utils.echo", "scheduler": "aws_batch", "cfg": {"queue": "q", "attempt_timeout": 30}},
            r"attempt_timeout=30 is below its minimum: it must be an int >= 60",
        ),
        ({"component": "utils.echo", "scheduler": "aws_batch", "cfg": "queue=q,retries=2"}, "unknown option 'retries'"),
        ({"component": "utils.echo", "scheduler": "aws_batch", "cfg": {"check_queue": "maybe"}}, "check_queue"),
        ({"component": "utils.no_such_thing"}, "utils.no_such_thing"),
        ({"component": "utils.ehco"}, "Did you mean utils.echo"),
        ({"component": "utils.echo", "scheduler": "local_cdw"}, "Did you mean 'local_cwd'"),
        (
            {"component": "utils.sh", "component_args": {"num_replicas": 0}},
            r"utils.sh: --num_replicas: 0 is not allowed: it must be an int >= 1",
        ),
        ({"component": "utils.echo", "component_args": ["--num_replicas", "-2"]}, r"--num_replicas: -2 is not allowed"),
        (
            {"component": "dist.spmd", "component_args": {"j": "0x2", "script": "t.py"}},
            r"-j: '0x2' is not NODESxPROCS or PROCS with positive integers",
        ),
        (
            {"component": "utils.echo", "component_args": "--msg hi"},
            r"component_args: '--msg hi' \(str\) is not allowed: give a list of str",
        ),
        ({"component": "utils.echo", "component_args": ["--num_replicas", 2]}, r"component_args: .* \(list\)"),
        ({"app": AppDef(name="bad", roles=[Role(name="r", image="local", entrypoint="")])}, "entrypoint"),
        (
            {"component": "utils.echo", "checkpoint_root": "ckpt/here"},
            r"checkpoint_root: 'ckpt/here' is neither an absolute path nor a URI",
        ),
    ],
)
def test_literal_bad_input_fails_when_the_dag_is_parsed(kwargs: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        TorchXRunOperator(task_id="task", **{"scheduler": "local_cwd", **kwargs})


def test_templated_values_are_left_to_the_task() -> None:
    TorchXRunOperator(task_id="t", component="utils.echo", scheduler="local_cwd", cfg={"log_dir": "{{ ds }}"})
    TorchXRunOperator(task_id="u", component="{{ params.c }}", scheduler="local_cwd", cfg="{{ params.cfg }}")
    # a template may render into a list (render_template_as_native_obj), and a templated value is the task's
    TorchXRunOperator(task_id="v", component="utils.echo", scheduler="local_cwd", component_args="{{ params.args }}")
    TorchXRunOperator(task_id="w", component="utils.echo", component_args={"num_replicas": "{{ params.n }}"})


def test_bad_input_at_run_time_fails_without_retry_and_submits_nothing() -> None:
    """(Templated arguments are only checked when the task runs.)"""
    ti = FakeTI()
    ti.run_id = "bad-input-at-run-time"
    op = TorchXRunOperator(
        task_id="task", scheduler="local_cwd", component="utils.echo", component_args=["--nope", "{{ ds }}"]
    )
    with pytest.raises(AirflowFailException, match="nope") as raised:
        op.execute({"ti": ti})  # type: ignore[arg-type]
    assert raised.value.__cause__ is None and raised.value.__suppress_context__  # one message, not a chain
    assert ti.xcoms == {}
    assert get_runner().list("local_cwd", labels=task_identity({"ti": ti}).labels()) == []  # type: ignore[typeddict-item]


def test_unknown_connection_fails_without_retry() -> None:
    op = TorchXRunOperator(task_id="task", component="utils.echo", torchx_conn_id="no_such_conn")
    with pytest.raises(AirflowFailException, match="connection 'no_such_conn' is not defined"):
        op.execute({"ti": FakeTI()})  # type: ignore[arg-type]


def test_only_errors_a_retry_cannot_fix_skip_the_retries() -> None:
    with pytest.raises(AirflowFailException, match="UnknownSchedulerError: scheduler: unknown"), fail_without_retry():
        raise UnknownSchedulerError("scheduler: unknown scheduler 'x'")
    throttled = ClientError({"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"}}, "SubmitJob")
    for transient in (ConnectionError("connection lost"), throttled):
        with pytest.raises(type(transient)), fail_without_retry():
            raise transient


def test_no_aws_credentials_at_submit_fail_the_task_without_retry(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    for key in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    for key, value in {
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }.items():
        monkeypatch.setenv(key, value)
    close_runners()  # no runner whose clients other tests made with credentials
    op = TorchXRunOperator(
        task_id="t", component="utils.echo", component_args=["--image", "busybox"], scheduler="aws_batch", cfg="queue=q"
    )
    try:
        with pytest.raises(
            AirflowFailException, match=r"^SchedulerSetupError: AWS: no usable credentials .*AWS_PROFILE"
        ):
            op.execute({"ti": FakeTI()})  # type: ignore[arg-type]
    finally:
        close_runners()  # nor leave one without credentials to the next tests
    expired = SchedulerSetupError("AWS: the credentials expired", transient=True)  # a refresh may renew them
    with pytest.raises(SchedulerSetupError), fail_without_retry():
        raise expired


def test_sensor_resume_logs_the_final_state_like_the_operator(capfd: pytest.CaptureFixture[str]) -> None:
    handle = "local_cwd://torchx/done-1"
    sensor = TorchXJobSensor(task_id="s", app_handle=handle, stream_logs=False)
    sensor.execute_complete({}, {"status": "success", "app_handle": handle})  # type: ignore[arg-type]
    out, err = capfd.readouterr()
    assert f"TorchX job {handle} SUCCEEDED" in out + err


def test_sensor_resume_raises_by_event_kind() -> None:
    from airflow.exceptions import AirflowException
    from airflow.sdk.bases.sensor import AirflowSensorTimeout  # the class this Airflow's sensors raise

    handle = "local_cwd://torchx/gone-1"
    sensor = TorchXJobSensor(task_id="s", app_handle=handle, timeout=5, stream_logs=False)
    assert sensor.execute_complete({}, {"status": "success", "app_handle": handle}) == handle  # type: ignore[arg-type]
    with pytest.raises(AirflowSensorTimeout, match="did not end within 5"):
        sensor.execute_complete({}, {"status": "timeout", "app_handle": handle, "message": "m"})  # type: ignore[arg-type]
    failed = {"status": "failed", "app_handle": handle, "message": "it broke", "tail": ["a", "b"]}
    with pytest.raises(AirflowException, match="it broke\nLast 2 log lines:\na\nb"):
        sensor.execute_complete({}, failed)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("gpus", "cfg", "warning"),
    [
        (1, {}, "auto_set_cuda_visible_devices is off: the replicas of 'g' (asking for GPUs) see every GPU"),
        (2, {"auto_set_cuda_visible_devices": True}, "app 'g' requests 2 GPUs but this host has 1; CUDA_VISIBLE"),
    ],
    ids=["shared", "over-ask"],
)
def test_a_gpu_job_seeing_every_gpu_warns_once_in_the_task_log(
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, gpus: int, cfg: dict[str, Any], warning: str
) -> None:
    monkeypatch.setenv("AIRFLOW_TORCHX_LOCAL_GPUS", "0")  # a 1-GPU host, as far as the ledger knows
    app = AppDef("g", roles=[Role("g", image="local", entrypoint="true", resource=Resource(1, gpus, 64))])
    op = TorchXRunOperator(task_id="t", app=app, scheduler="local_cwd", cfg=cfg, poll_interval=0.2, deferrable=False)
    op.execute({"ti": FakeTI(run_id=f"gpu-warning-{gpus}")})  # type: ignore[arg-type]
    out, err = capfd.readouterr()
    assert (out + err).count(warning) == 1, out + err


def test_a_batch_root_not_mounted_into_the_container_fails_the_dry_run_naming_it() -> None:
    """A local path of the submitting host is not in a Batch container: an error naming the
    value, without retry, and nothing is rendered or submitted."""
    ti = FakeTI(run_id="batch-root")
    batch_app = AppDef(
        name="b", roles=[Role(name="s", image="busybox", entrypoint="true", resource=Resource(1, 0, 512))]
    )

    def dry_run(root: str) -> TorchXRunOperator:
        return TorchXRunOperator(
            task_id="task", app=batch_app, scheduler="aws_batch", cfg={"queue": "q"}, dryrun=True, checkpoint_root=root
        )

    with pytest.raises(AirflowFailException, match=r"checkpoint_root: '/tmp/ckpt/dag/batch-root/task' is a local path"):
        dry_run("/tmp/ckpt").execute({"ti": ti})  # type: ignore[arg-type]
    ok = dry_run("s3://b/c")
    request = json.dumps(ok.execute({"ti": ti}))  # type: ignore[arg-type]
    assert "s3://b/c/dag/batch-root/task" in request and "TORCHX_ATTEMPT" in request


def test_a_batch_dry_run_without_a_root_says_the_job_would_get_no_checkpoint_dir(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = AppDef(name="b", roles=[Role(name="s", image="busybox", entrypoint="true", resource=Resource(1, 0, 512))])
    op = TorchXRunOperator(task_id="task", app=app, scheduler="aws_batch", cfg={"queue": "q"}, dryrun=True)
    with caplog.at_level(logging.INFO, logger="airflow_provider_torchx.checkpointing"):
        request = json.dumps(op.execute({"ti": FakeTI(run_id="batch-no-root")}))  # type: ignore[arg-type]
    assert "TORCHX_CHECKPOINT_DIR" not in request
    assert "no default for aws_batch): the job would get no TORCHX_CHECKPOINT_DIR" in caplog.text


def test_the_checkpoint_location_is_an_openlineage_output() -> None:
    from airflow_provider_torchx.lineage import checkpoint_dataset

    s3 = checkpoint_dataset("s3://bucket/ckpt/dag/run/task")
    local = checkpoint_dataset("/var/ckpt/dag/run/task")
    assert (s3.namespace, s3.name) == ("s3://bucket", "ckpt/dag/run/task")
    assert (local.namespace, local.name) == ("file", "/var/ckpt/dag/run/task")
    op = TorchXRunOperator(task_id="t", app=SLEEP_APP, scheduler="local_cwd", outlets=[])
    op.app_handle, op.checkpoint_dir = "local_cwd://torchx/x", "/var/ckpt/dag/run/task"
    assert [(d.namespace, d.name) for d in op.get_openlineage_facets_on_complete(None).outputs] == [
        ("file", op.checkpoint_dir)
    ]


@pytest.mark.parametrize(
    ("try_number", "max_tries", "retries", "first"),
    [
        pytest.param(1, 2, 2, True, id="a run's first try"),
        pytest.param(2, 2, 2, False, id="its retry"),
        pytest.param(4, 5, 2, True, id="the first try after a clear at try 3"),
        pytest.param(5, 5, 2, False, id="a retry after that clear"),
        pytest.param(1, None, 0, True, id="no max_tries known: the first try"),
    ],
)
def test_fresh_start_applies_to_the_first_try_of_a_run_or_a_clear(
    try_number: int, max_tries: int | None, retries: int, first: bool
) -> None:
    from airflow_provider_torchx.checkpointing import first_try_of_run

    ti = FakeTI(try_number=try_number)
    if max_tries is not None:
        ti.max_tries = max_tries  # type: ignore[attr-defined]
    assert first_try_of_run(ti, retries) is first


def test_fresh_start_sets_the_checkpoints_aside_on_a_first_try_only(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A cleared task (first try after the clear) starts over: what its location held is
    renamed beside it, kept, and the log names both; its retry resumes from what it finds."""
    app = AppDef("f", roles=[Role("s", image="local", entrypoint="true")])

    def run(try_number: int) -> None:
        op = TorchXRunOperator(
            task_id="task", app=app, scheduler="local_cwd", checkpoint_root=str(tmp_path), fresh_start=True,
            retries=1, poll_interval=0.2, deferrable=False,
        )  # fmt: skip
        ti = FakeTI(try_number=try_number, run_id="fresh")
        ti.max_tries = 3  # type: ignore[attr-defined]  # cleared at try 2 with retries=1
        op.execute({"ti": ti})  # type: ignore[arg-type]

    location = tmp_path / "dag" / "fresh" / "task"
    location.mkdir(parents=True)
    (location / "step-6.pt").write_bytes(b"w")
    with caplog.at_level(logging.INFO, logger="airflow_provider_torchx.checkpointing"):
        run(try_number=3)
    (moved,) = tmp_path.joinpath("dag", "fresh").glob("task+set-aside-*")
    assert (moved / "step-6.pt").read_bytes() == b"w" and not (location / "step-6.pt").exists()
    assert f"set the checkpoints of this task instance aside: {location} -> {moved} (kept)" in caplog.text
    location.mkdir(exist_ok=True)
    (location / "step-1.pt").write_bytes(b"w")
    run(try_number=4)  # the retry keeps what the first try saved
    assert (location / "step-1.pt").exists() and len(list(tmp_path.joinpath("dag", "fresh").iterdir())) == 2


def test_fresh_start_on_batch_is_refused_naming_where_the_checkpoints_are() -> None:
    app = AppDef(name="b", roles=[Role(name="s", image="busybox", entrypoint="true", resource=Resource(1, 0, 512))])
    op = TorchXRunOperator(
        task_id="task", app=app, scheduler="aws_batch", cfg={"queue": "q"}, checkpoint_root="s3://b/c", fresh_start=True
    )
    with pytest.raises(AirflowFailException, match=r"fresh_start: the checkpoints of a aws_batch job \(s3://b/c/dag/"):
        op.execute({"ti": FakeTI(run_id="batch-fresh")})  # type: ignore[arg-type]
