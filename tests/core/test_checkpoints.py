"""``core/checkpoints.py``: a task instance's checkpoint location and its attempt numbers."""

from __future__ import annotations

import os
import stat
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
    checkpoints.check_mounted_location("s3://b/p/d", _app())
    checkpoints.check_mounted_location("/mnt/efs/ckpt/d", _app(VolumeMount("fs-1", "/mnt/efs")))
    checkpoints.check_mounted_location("/mnt/host/d", _app(BindMount("/data", "/mnt/host/")))
    with pytest.raises(InvalidRunConfigError, match=r"'/tmp/ckpt/d' is a local path that role 'r' does not mount"):
        checkpoints.check_mounted_location("/tmp/ckpt/d", _app(VolumeMount("fs-1", "/mnt/efs")))
    with pytest.raises(InvalidRunConfigError, match="/mnt/efs2/d"):
        checkpoints.check_mounted_location("/mnt/efs2/d", _app(VolumeMount("fs-1", "/mnt/efs")))


def test_place_sets_the_env_of_every_role_and_creates_the_parents_only(tmp_path: Path) -> None:
    """The directories above the location are created owner-only, whatever the umask; the
    location itself is left for the job to create when it first saves (none for a job that
    never checkpoints); a root that exists keeps its mode."""
    app = AppDef("a", roles=[Role("r", image="i", entrypoint="x"), Role("s", image="i", entrypoint="y")])
    (tmp_path / "root").mkdir(mode=0o755)
    location = checkpoints.checkpoint_dir(str(tmp_path / "root"), TI)
    old = os.umask(0o022)
    try:
        checkpoints.place(app, location, 2, host_paths=True)
    finally:
        os.umask(old)
    assert not Path(location).exists() and Path(location).parent.is_dir()
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (Path(location).parent, Path(location).parent.parent)}
    assert modes == {"train": 0o700, Path(location).parent.name: 0o700}
    assert stat.S_IMODE((tmp_path / "root").stat().st_mode) == 0o755
    assert [r.env for r in app.roles] == [{"TORCHX_CHECKPOINT_DIR": location, "TORCHX_ATTEMPT": "2"}] * 2
    assert DescribeAppResponse(roles=app.roles).checkpoint_dir == location
    bare = AppDef("a", roles=[Role("r", image="i", entrypoint="x")])
    checkpoints.place(bare, None, 0, host_paths=False)
    assert bare.roles[0].env == {"TORCHX_ATTEMPT": "0"}
    assert DescribeAppResponse(roles=bare.roles).checkpoint_dir is None


def test_a_run_id_of_200_colons_gets_a_location_the_job_can_create(tmp_path: Path) -> None:
    """Legal in Airflow, 600 bytes encoded: the part keeps a readable prefix and a hash, stays
    inside the root and under a file name's limit, and the directories can be made."""
    long = TI._replace(run_id=":" * 200)
    location = checkpoints.checkpoint_dir(str(tmp_path), long)
    parts = Path(location).relative_to(tmp_path).parts
    assert parts[0] == "train" and parts[2] == "fit" and len(parts) == 3
    assert parts[1].startswith("%3A%3A") and "+" in parts[1] and len(parts[1].encode()) <= checkpoints.MAX_PART
    assert "%" not in parts[1].split("+")[0][-2:], "never half an escape"
    Path(location).mkdir(parents=True)
    assert checkpoints.checkpoint_dir(str(tmp_path), long) == location, "the same for every try"


def test_long_ids_that_differ_only_at_the_end_get_different_locations() -> None:
    a, b = TI._replace(run_id="r" * 300 + "a"), TI._replace(run_id="r" * 300 + "b")
    assert checkpoints.checkpoint_dir("/r", a) != checkpoints.checkpoint_dir("/r", b)
    assert checkpoints.checkpoint_dir("/r", TI._replace(task_id="t" * 255)).endswith("/" + "t" * 255), "kept whole"


def test_place_on_a_remote_scheduler_checks_the_mount_and_creates_nothing(tmp_path: Path) -> None:
    location = str(tmp_path / "d")
    with pytest.raises(InvalidRunConfigError, match="does not mount"):
        checkpoints.place(_app(), location, 0, host_paths=False)
    assert not Path(location).exists()


def test_set_aside_renames_the_location_beside_it_and_keeps_it(tmp_path: Path) -> None:
    location = tmp_path / "dag" / "run" / "task"
    location.mkdir(parents=True)
    (location / "step-6.pt").write_bytes(b"w")
    moved = checkpoints.set_aside(str(location), 86400.5)
    assert moved == f"{location}+set-aside-19700102T000000.500000Z"
    assert not location.exists() and (Path(moved) / "step-6.pt").read_bytes() == b"w"
    assert checkpoints.set_aside(str(location), 86401.0) is None, "nothing there: nothing to do"
    with pytest.raises(InvalidRunConfigError, match=r"'s3://b/ck/d/r/t' is not a local path"):
        checkpoints.set_aside("s3://b/ck/d/r/t", 0.0)
