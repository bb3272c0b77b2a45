"""``core/checkpoints.py``: a task instance's checkpoint location and its attempt numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_torchx.core import checkpoints
from airflow_provider_torchx.core.errors import InvalidRunConfigError
from airflow_provider_torchx.core.identity import TaskIdentity
from airflow_provider_torchx.core.schedulers.api import DescribeAppResponse
from airflow_provider_torchx.core.schedulers.local.supervisor import ATTEMPT_ENV
from airflow_provider_torchx.core.specs import AppDef, BindMount, Role, VolumeMount

TI = TaskIdentity("train", "fit", "manual__2026-01-01T00:00:00+00:00", -1)


def test_location_is_root_dag_run_task() -> None:
    assert checkpoints.checkpoint_dir("/ckpt", TI) == "/ckpt/train/manual__2026-01-01T00%3A00%3A00%2B00%3A00/fit"
    assert checkpoints.checkpoint_dir("s3://b/p", TI._replace(map_index=3)).startswith("s3://b/p/train/")
    assert checkpoints.checkpoint_dir("s3://b/p", TI._replace(map_index=3)).endswith("/fit/3")


def test_location_is_the_same_for_every_try() -> None:
    """Built from the identity only: there is no try number to vary."""
    assert checkpoints.checkpoint_dir("/r", TI) == checkpoints.checkpoint_dir("/r", TaskIdentity(*TI))


@pytest.mark.parametrize(
    "other",
    [
        TI._replace(run_id="manual__2026-01-02T00:00:00+00:00"),
        TI._replace(task_id="eval"),
        TI._replace(dag_id="train2"),
        TI._replace(map_index=0),
        TI._replace(map_index=1),
    ],
)
def test_location_differs_per_run_task_dag_and_map_index(other: TaskIdentity) -> None:
    assert checkpoints.checkpoint_dir("/r", other) != checkpoints.checkpoint_dir("/r", TI)


def test_no_part_climbs_out_of_the_root_or_into_another() -> None:
    odd = TaskIdentity("..", "a/b", ".", 2)
    location = checkpoints.checkpoint_dir("/r", odd)
    assert location == "/r/%2E%2E/%2E/a%2Fb/2"
    assert checkpoints.checkpoint_dir("/r", TaskIdentity("d", "a/b", "r")) != checkpoints.checkpoint_dir(
        "/r", TaskIdentity("d", "a", "r/b")
    )


@pytest.mark.parametrize("root", ["relative/dir", "~/ckpt", "", "  ", "s3:/bucket", "bucket/key"])
def test_a_root_neither_absolute_nor_a_uri_is_an_error_naming_it(root: str) -> None:
    with pytest.raises(InvalidRunConfigError, match="checkpoint_root") as err:
        checkpoints.check_root(root, "checkpoint_root")
    assert repr(root) in str(err.value)


def test_root_precedence_operator_connection_config_default() -> None:
    op, conn, cfg = ("op", "/op"), ("conn", "/conn"), ("cfg", "s3://b/cfg/")
    assert checkpoints.resolve_root([op, conn, cfg], "/default") == "/op"
    assert checkpoints.resolve_root([("op", None), conn, cfg], "/default") == "/conn"
    assert checkpoints.resolve_root([("op", None), ("conn", ""), cfg], "/default") == "s3://b/cfg"
    assert checkpoints.resolve_root([("op", None), ("conn", None), ("cfg", None)], "/default") == "/default"
    assert checkpoints.resolve_root([("op", None)], None) is None
    with pytest.raises(InvalidRunConfigError, match=r"conn: 'rel'"):
        checkpoints.resolve_root([("op", None), ("conn", "rel")], "/default")


def test_attempt_offset_counts_earlier_jobs_attempts_and_tries() -> None:
    assert checkpoints.attempt_offset(1, []) == 0
    assert checkpoints.attempt_offset(2, [1]) == 1  # one earlier job, no restart
    assert checkpoints.attempt_offset(2, [3]) == 3  # that job restarted twice
    assert checkpoints.attempt_offset(3, []) == 2  # the earlier jobs are gone: the tries still count


def test_attempt_in_container_adds_batch_attempts() -> None:
    assert checkpoints.attempt_in_container({}) == 0
    assert checkpoints.attempt_in_container({"TORCHX_ATTEMPT": "2"}) == 2
    assert checkpoints.attempt_in_container({"TORCHX_ATTEMPT": "2", "AWS_BATCH_JOB_ATTEMPT": "1"}) == 2
    assert checkpoints.attempt_in_container({"TORCHX_ATTEMPT": "2", "AWS_BATCH_JOB_ATTEMPT": "3"}) == 4


def test_the_supervisor_spells_the_attempt_variable_the_same() -> None:
    assert ATTEMPT_ENV == checkpoints.ATTEMPT_ENV


def _app(*mounts: object) -> AppDef:
    return AppDef("a", roles=[Role("r", image="img", entrypoint="x", mounts=list(mounts))])  # type: ignore[arg-type]


def test_batch_location_must_be_a_uri_or_mounted() -> None:
    checkpoints.check_batch_location("s3://b/p/d", _app())
    checkpoints.check_batch_location("/mnt/efs/ckpt/d", _app(VolumeMount("fs-1", "/mnt/efs")))
    checkpoints.check_batch_location("/mnt/host/d", _app(BindMount("/data", "/mnt/host/")))
    with pytest.raises(InvalidRunConfigError, match=r"'/tmp/ckpt/d' is a local path that role 'r' does not mount"):
        checkpoints.check_batch_location("/tmp/ckpt/d", _app(VolumeMount("fs-1", "/mnt/efs")))
    with pytest.raises(InvalidRunConfigError, match="/mnt/efs2/d"):
        checkpoints.check_batch_location("/mnt/efs2/d", _app(VolumeMount("fs-1", "/mnt/efs")))


def test_place_sets_the_env_of_every_role_and_creates_a_local_dir(tmp_path: Path) -> None:
    app = AppDef("a", roles=[Role("r", image="i", entrypoint="x"), Role("s", image="i", entrypoint="y")])
    location = str(tmp_path / "root" / "d")
    checkpoints.place(app, location, 2, host_bound=True)
    assert Path(location).is_dir()
    assert [r.env for r in app.roles] == [{"TORCHX_CHECKPOINT_DIR": location, "TORCHX_ATTEMPT": "2"}] * 2
    assert DescribeAppResponse(roles=app.roles).checkpoint_dir == location
    bare = AppDef("a", roles=[Role("r", image="i", entrypoint="x")])
    checkpoints.place(bare, None, 0, host_bound=False)
    assert bare.roles[0].env == {"TORCHX_ATTEMPT": "0"}
    assert DescribeAppResponse(roles=bare.roles).checkpoint_dir is None


def test_place_on_a_remote_scheduler_checks_the_mount_and_creates_nothing(tmp_path: Path) -> None:
    location = str(tmp_path / "d")
    with pytest.raises(InvalidRunConfigError, match="does not mount"):
        checkpoints.place(_app(), location, 0, host_bound=False)
    assert not Path(location).exists()


def test_local_size_and_remove(tmp_path: Path) -> None:
    d = tmp_path / "d"
    (d / "sub").mkdir(parents=True)
    (d / "sub" / "ckpt.pt").write_bytes(b"x" * 10000)
    assert checkpoints.local_size(str(d)) >= 10000
    checkpoints.remove_local("s3://b/k")  # never touched
    checkpoints.remove_local(str(d))
    assert not d.exists() and checkpoints.local_size(str(d)) == 0
