"""Running jobs: states, exit codes, macros, fail fast, retries, options, the store."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

from airflow_provider_torchx.core.schedulers.api import Stream
from airflow_provider_torchx.core.schedulers.local import LocalScheduler, create_scheduler
from airflow_provider_torchx.core.specs import AppDef, AppState, RetryPolicy, Role
from tests.core.local.helpers import sh_app, wait_done, wait_running

#: What the replicas printed (a restart's note goes to stderr: ``test_resume.py``).
STDOUT = Stream.STDOUT


def test_success_with_macros_labels_and_roles(sched: LocalScheduler, tmp_path: Path) -> None:
    app = AppDef(
        "hello",
        roles=[
            Role(
                "trainer",
                entrypoint="sh",
                args=["-c", 'echo "id=$APP rep=${replica_id} root=${img_root} rank0=$$${rank0_env}"'],
                env={"APP": "${app_id}"},
                num_replicas=2,
                metadata={"where": "${app_id}"},
            ),
            Role("ps", entrypoint="true"),
        ],
    )
    app_id = sched.submit(app, labels={"team": "ml", "run": "7"})
    assert "/" not in app_id and ".." not in app_id and app_id.startswith("hello-")
    desc = wait_done(sched, app_id)
    assert desc.state == AppState.SUCCEEDED, desc
    assert desc.labels == {"team": "ml", "run": "7"}
    assert [r.name for r in desc.roles] == ["trainer", "ps"] and desc.roles[0].num_replicas == 2
    assert desc.num_restarts == 0 and not desc.cancel_requested
    codes = {(rs.role, r.id): (r.state, r.exit_code) for rs in desc.roles_statuses for r in rs.replicas}
    assert codes == {
        ("trainer", 0): (AppState.SUCCEEDED, 0),
        ("trainer", 1): (AppState.SUCCEEDED, 0),
        ("ps", 0): (AppState.SUCCEEDED, 0),
    }
    for k in (0, 1):
        assert list(sched.log_iter(app_id, "trainer", k)) == [
            f"id={app_id} rep={k} root={os.getcwd()} rank0=localhost\n"
        ]
    native = sched.describe_native(app_id)
    assert native is not None and native.request.app_id == app_id and native.labels == desc.labels
    assert native.request.roles[0].metadata == {"where": "${app_id}"}
    assert native.request.role_params["trainer"][1].env["APP"] == app_id


def test_fail_fast_names_the_failed_replica(sched: LocalScheduler) -> None:
    app_id = sched.submit(sh_app("sleep 60", "sleep 0.2; exit 3"))
    t0 = time.monotonic()
    desc = wait_done(sched, app_id)
    assert time.monotonic() - t0 < 20  # far below the 60 s of the other role
    assert desc.state == AppState.FAILED
    assert "'r1'" in desc.msg and "replica 0" in desc.msg and "code 3" in desc.msg
    states = {rs.role: rs.replicas[0] for rs in desc.roles_statuses}
    assert states["r1"].state == AppState.FAILED and states["r1"].exit_code == 3
    assert states["r0"].state == AppState.CANCELLED


def test_retry_replica_policy_restarts_only_the_failed_replica(sched: LocalScheduler, tmp_path: Path) -> None:
    flag = tmp_path / "failed-once"
    # replica 0 outlives the restart's grace period (2 s) and must not be touched by it
    script = (
        f"if [ ${{replica_id}} = 0 ]; then sleep 3; fi; echo start ${{replica_id}}; "
        f"if [ ${{replica_id}} = 1 ] && [ ! -f {flag} ]; then touch {flag}; exit 1; fi"
    )
    app = sh_app(script, num_replicas=2, max_retries=2, retry_policy=RetryPolicy.REPLICA)
    app_id = sched.submit(app)
    desc = wait_done(sched, app_id)
    assert desc.state == AppState.SUCCEEDED, desc
    assert desc.num_restarts == 1
    assert list(sched.log_iter(app_id, "r0", 0)) == ["start 0\n"]
    assert list(sched.log_iter(app_id, "r0", 1, streams=STDOUT)) == ["start 1\n", "start 1\n"]


def test_retry_application_policy_restarts_everything(sched: LocalScheduler, tmp_path: Path) -> None:
    flag = tmp_path / "failed-once"
    app = sh_app(
        "echo run; sleep 30",
        f"echo run; if [ ! -f {flag} ]; then touch {flag}; sleep 0.3; exit 1; fi; exit 0",
        max_retries=1,
        retry_policy=RetryPolicy.APPLICATION,
    )
    app.roles[0].args = ["-c", "echo run; sleep 1"]
    app_id = sched.submit(app)
    desc = wait_done(sched, app_id)
    assert desc.state == AppState.SUCCEEDED, desc
    assert desc.num_restarts == 1
    assert list(sched.log_iter(app_id, "r0", streams=STDOUT)) == ["run\n", "run\n"]
    assert list(sched.log_iter(app_id, "r1", streams=STDOUT)) == ["run\n", "run\n"]


def test_an_application_restart_starts_without_the_last_attempts_leftovers(
    sched: LocalScheduler, tmp_path: Path
) -> None:
    """What the failed attempt left running (here a daemon in a session of its own, as a
    torchrun agent's store can be) is gone before the job starts again: it would hold the
    attempt's ports and answer the new attempt."""
    flag, daemon = tmp_path / "failed-once", tmp_path / "daemon.pid"
    first = f"touch {flag}; setsid sleep 300 & echo $! > {daemon}; exit 1"
    second = f'if kill -0 "$(cat {daemon})" 2>/dev/null; then echo left; exit 3; fi; echo clean'
    app = sh_app(f"if [ ! -f {flag} ]; then {first}; fi; {second}", max_retries=1, retry_policy=RetryPolicy.APPLICATION)
    app_id = sched.submit(app)
    desc = wait_done(sched, app_id)
    assert desc.state == AppState.SUCCEEDED and desc.num_restarts == 1, desc
    assert list(sched.log_iter(app_id, "r0", streams=STDOUT)) == ["clean\n"]


def test_retry_role_policy_restarts_the_failed_role(sched: LocalScheduler, tmp_path: Path) -> None:
    # r1[0] fails once; r1[1] ignores SIGTERM, so the restart SIGKILLs it after the grace
    # period (2 s); r0 runs longer than that and must not be touched.
    r1 = (
        f"echo run; f={tmp_path}/flag-${{replica_id}}; if [ -f $f ]; then exit 0; fi; touch $f; "
        "if [ ${replica_id} = 0 ]; then sleep 0.3; exit 1; fi; trap '' TERM; sleep 30"
    )
    app = sh_app("echo run; sleep 4", r1, max_retries=1, retry_policy=RetryPolicy.ROLE)
    app.roles[1].num_replicas = 2
    app_id = sched.submit(app)
    desc = wait_done(sched, app_id)
    assert desc.state == AppState.SUCCEEDED, desc
    assert desc.num_restarts == 1
    assert list(sched.log_iter(app_id, "r0")) == ["run\n"]
    assert list(sched.log_iter(app_id, "r1", 0, streams=STDOUT)) == ["run\n", "run\n"]
    assert list(sched.log_iter(app_id, "r1", 1, streams=STDOUT)) == ["run\n", "run\n"]


def test_retries_exhausted_fail_with_count(sched: LocalScheduler) -> None:
    app_id = sched.submit(sh_app("exit 7", max_retries=2, retry_policy=RetryPolicy.REPLICA))
    desc = wait_done(sched, app_id)
    assert desc.state == AppState.FAILED and desc.num_restarts == 2
    assert "code 7" in desc.msg and "after 2 restart(s)" in desc.msg


def test_log_dir_option_moves_only_the_logs(sched: LocalScheduler, tmp_path: Path, state_dir: Path) -> None:
    logs = tmp_path / "logs"
    app_id = sched.submit(sh_app("echo hi"), cfg={"log_dir": str(logs)})
    assert wait_done(sched, app_id).state == AppState.SUCCEEDED
    assert (logs / app_id / "r0" / "0" / "stdout.log").read_text() == "hi\n"
    assert (state_dir / "local" / app_id / "request.json").exists()
    assert list(sched.log_iter(app_id, "r0")) == ["hi\n"]


def test_prepend_cwd_and_extra_paths(mark: str, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    tool = tmp_path / "mytool"
    tool.write_text("#!/bin/sh\necho from-cwd\n")
    tool.chmod(0o755)
    extra = tmp_path / "extra"
    extra.mkdir()
    monkeypatch.chdir(tmp_path)
    sched = create_scheduler("test", extra_paths=[str(extra)])
    app = AppDef("p", roles=[Role("r", entrypoint="mytool")])
    info = sched.submit_dryrun(app, {"prepend_cwd": True})
    path = info.request.role_params["r"][0].env["PATH"].split(os.pathsep)
    assert path[:2] == [str(tmp_path), str(extra)]
    app_id = sched.schedule(info)
    assert wait_done(sched, app_id).state == AppState.SUCCEEDED
    assert list(sched.log_iter(app_id, "r")) == ["from-cwd\n"]


def test_local_dir_runs_in_the_image_directory(dir_sched: LocalScheduler, tmp_path: Path) -> None:
    img = tmp_path / "img"
    img.mkdir()
    (img / "run.sh").write_text("#!/bin/sh\npwd\n")
    (img / "run.sh").chmod(0o755)
    app_id = dir_sched.submit(AppDef("d", roles=[Role("r", image=str(img), entrypoint="run.sh")]))
    assert wait_done(dir_sched, app_id).state == AppState.SUCCEEDED
    assert list(dir_sched.log_iter(app_id, "r")) == [f"{img}\n"]
    assert dir_sched.backend == "local_dir"


def test_wait_for_change_returns_at_the_end_not_at_the_timeout(sched: LocalScheduler) -> None:
    app_id = sched.submit(sh_app("sleep 0.3"))
    t0 = time.monotonic()
    while not sched.describe(app_id).state.is_terminal():  # type: ignore[union-attr]
        sched.wait_for_change(app_id, 60)
    assert time.monotonic() - t0 < 30
    sched.wait_for_change(app_id, 60)  # a finished job: returns at once


def test_store_is_owner_only(sched: LocalScheduler, state_dir: Path) -> None:
    app_id = sched.submit(sh_app("true"))
    wait_done(sched, app_id)
    assert stat.S_IMODE((state_dir / "local").stat().st_mode) == 0o700
    job = state_dir / "local" / app_id
    assert stat.S_IMODE(job.stat().st_mode) == 0o700
    for name in ("request.json", "state.json", "supervisor.json"):
        assert stat.S_IMODE((job / name).stat().st_mode) == 0o600
    assert not [p for p in job.iterdir() if p.name.endswith(".tmp")]


def test_list_filters_on_labels_and_backend(sched: LocalScheduler, dir_sched: LocalScheduler, tmp_path: Path) -> None:
    a = sched.submit(sh_app("true", name="a"), labels={"dag": "d1", "task": "t1"})
    b = sched.submit(sh_app("true", name="b"), labels={"dag": "d1", "task": "t2"})
    c = dir_sched.submit(AppDef("c", roles=[Role("r", image=str(tmp_path), entrypoint="/bin/true")]))
    for s, app_id in ((sched, a), (sched, b), (dir_sched, c)):
        wait_done(s, app_id)
    assert [r.app_id for r in sched.list()] == [a, b]  # oldest first
    assert [r.app_id for r in sched.list(limit=1)] == [b]  # the newest
    assert sched.list(limit=0) == []
    assert (sched.count(), sched.count({}, {"dag": "d1", "task": "t2"}), dir_sched.count()) == (2, 1, 1)
    assert [r.app_id for r in sched.list(labels={"dag": "d1", "task": "t2"})] == [b]
    assert sched.list(labels={"dag": "nope"}) == []
    listed = dir_sched.list()
    assert [(r.app_id, r.name, r.state) for r in listed] == [(c, "c", AppState.SUCCEEDED)]
    # another process (a fresh scheduler instance) sees the same store
    assert {r.app_id for r in create_scheduler("other").list()} == {a, b}


def test_count_counts_live_jobs_without_reading_their_state(sched: LocalScheduler, state_dir: Path) -> None:
    """``count`` matches on backend and labels only: a running job whose ``state.json`` cannot
    be read (a FIFO here, swapped in as an attacker would: made beside, renamed over) is still
    counted, and ``list`` still lists it, refused (its state UNKNOWN)."""
    app_id = sched.submit(sh_app("sleep 30"), labels={"dag": "d1"})
    try:
        wait_running(sched, app_id)
        state = state_dir / "local" / app_id / "state.json"
        fifo = state.with_name(".state.json.fifo")
        os.mkfifo(fifo)
        os.replace(fifo, state)
        fresh = create_scheduler("other")  # nothing cached
        assert (fresh.count(), fresh.count({}, {"dag": "d1"}), fresh.count({}, {"dag": "d2"})) == (1, 1, 0)
        (listed,) = fresh.list()
        assert listed.app_id == app_id and listed.state == AppState.UNKNOWN and listed.refused, listed
        state.unlink()
    finally:
        sched.cancel(app_id)
    wait_done(sched, app_id)


def test_entry_points_build_the_schedulers_and_ignore_unknown_kwargs() -> None:
    from importlib.metadata import entry_points

    eps = {ep.name: ep for ep in entry_points(group="airflow_provider_torchx.schedulers")}
    cwd = eps["local_cwd"].load()("s", unknown_option=1, region="x")
    dirs = eps["local_dir"].load()("s", cache_size=5)
    assert (cwd.backend, dirs.backend) == ("local_cwd", "local_dir")


def test_runner_wait_learns_of_the_end_without_waiting_its_interval(mark: str) -> None:
    from airflow_provider_torchx.core.runner import get_runner

    with get_runner() as runner:
        handle = runner.run(sh_app("echo job=$TORCHX_JOB_ID; sleep 0.3"), "local_cwd")
        t0 = time.monotonic()
        status = runner.wait(handle, wait_interval=120)
        assert status is not None and status.state == AppState.SUCCEEDED
        assert time.monotonic() - t0 < 60  # far below the 120 s interval: woken by the job's end
        assert list(runner.log_lines(handle, "r0")) == [f"job={handle}\n"]
