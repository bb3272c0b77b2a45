"""Bad input: a clear ValueError naming the field, nothing started, nothing left on disk."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_torchx.core.errors import InvalidRunConfigError, InvalidSpecError
from airflow_provider_torchx.core.schedulers.local import LocalScheduler
from airflow_provider_torchx.core.specs import AppDef, Role
from tests.core.local.conftest import marked_processes, no_jobs_on_disk


def check_rejected(sched: LocalScheduler, app: AppDef, match: str, state_dir: Path, mark: str, **cfg: object) -> None:
    with pytest.raises(ValueError, match=match):
        sched.submit(app, cfg=cfg or None)  # type: ignore[arg-type]
    assert no_jobs_on_disk(state_dir)
    assert marked_processes(mark) == []


def test_local_dir_image_must_be_an_existing_absolute_directory(
    dir_sched: LocalScheduler, tmp_path: Path, state_dir: Path, mark: str
) -> None:
    for image, match in (
        ("relative/dir", "role.image: 'relative/dir' is not an absolute path"),
        (str(tmp_path / "missing"), "does not exist"),
        ("", "is not an absolute path"),
    ):
        app = AppDef("a", roles=[Role("r", image=image, entrypoint="/bin/true")])
        check_rejected(dir_sched, app, match, state_dir, mark)


def test_missing_entrypoints(
    sched: LocalScheduler, dir_sched: LocalScheduler, tmp_path: Path, state_dir: Path, mark: str
) -> None:
    check_rejected(
        sched,
        AppDef("a", roles=[Role("r", entrypoint="no-such-program-xyz")]),
        r"roles\[0\].entrypoint",
        state_dir,
        mark,
    )
    check_rejected(
        sched, AppDef("a", roles=[Role("r", entrypoint="./missing.sh")]), "not an executable file", state_dir, mark
    )
    check_rejected(sched, AppDef("a", roles=[Role("r", entrypoint="")]), "entrypoint", state_dir, mark)
    app = AppDef("a", roles=[Role("r", image=str(tmp_path), entrypoint="run.sh")])
    check_rejected(dir_sched, app, str(tmp_path / "run.sh"), state_dir, mark)


def test_names_that_would_escape_the_store(sched: LocalScheduler, state_dir: Path, mark: str) -> None:
    check_rejected(sched, AppDef("../x", roles=[Role("r", entrypoint="true")]), "app.name", state_dir, mark)
    check_rejected(sched, AppDef("a", roles=[Role("../x", entrypoint="true")]), r"roles\[0\].name", state_dir, mark)
    check_rejected(sched, AppDef("a", roles=[Role("..", entrypoint="true")]), r"roles\[0\].name", state_dir, mark)
    assert not (state_dir.parent / "x").exists()


def test_bad_cfg(sched: LocalScheduler, state_dir: Path, mark: str) -> None:
    app = AppDef("a", roles=[Role("r", entrypoint="true")])
    with pytest.raises(InvalidRunConfigError, match="log_dirr"):
        sched.submit(app, cfg={"log_dirr": "/tmp"})
    with pytest.raises(InvalidRunConfigError, match="prepend_cwd"):
        sched.submit(app, cfg={"prepend_cwd": "maybe"})
    for value, shown in ((0, "0"), ("-3", "-3")):
        with pytest.raises(
            InvalidRunConfigError, match=f"attempt_timeout={shown} is below its minimum: it must be an int >= 1"
        ):
            sched.submit(app, cfg={"attempt_timeout": value})
    assert no_jobs_on_disk(state_dir)


def test_scheduling_a_dryrun_twice_is_refused(sched: LocalScheduler) -> None:
    info = sched.submit_dryrun(AppDef("a", roles=[Role("r", entrypoint="true")]))
    sched.schedule(info)
    with pytest.raises(ValueError, match="already scheduled"):
        sched.schedule(info)


def test_errors_are_value_errors() -> None:
    assert issubclass(InvalidSpecError, ValueError)


def test_an_app_id_longer_than_a_file_name_names_no_job(sched: LocalScheduler) -> None:
    """Asked by id (the core's API, not a handle), a longer id is an unknown job, not the file
    system's ``File name too long``."""
    from airflow_provider_torchx.core.errors import UnknownAppError

    long_id = "a" * 256
    assert sched.describe(long_id) is None
    with pytest.raises(UnknownAppError, match="at most 255 characters"):
        sched.job_dir(long_id)
    with pytest.raises(UnknownAppError):
        sched.read_log(long_id, "r0")
