"""The ``slurm`` scheduler on a real cluster (``scripts/slurm.sh``): submit, describe, logs,
cancel, failures, Slurm's own check of a dry run, and a job Slurm forgot."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from airflow_provider_torchx.core.clock import Clock
from airflow_provider_torchx.core.errors import InvalidRunConfigError, JobWontFitError, SchedulerSetupError
from airflow_provider_torchx.core.runner import Runner
from airflow_provider_torchx.core.schedulers.api import CancelledBy, Stream
from airflow_provider_torchx.core.schedulers.slurm import record, status
from airflow_provider_torchx.core.schedulers.slurm.commands import SlurmCommands
from airflow_provider_torchx.core.schedulers.slurm.record import JobIndex
from airflow_provider_torchx.core.schedulers.slurm.scheduler import SlurmScheduler
from airflow_provider_torchx.core.specs import AppDef, AppState, Resource, Role
from tests.core.slurm.conftest import wait_for

pytestmark = pytest.mark.slurm

SMALL = Resource(cpu=1, gpu=0, memMB=100)


def _app(cmd: str, replicas: int = 1, name: str = "t", **role: object) -> AppDef:
    return AppDef(
        name=name,
        roles=[Role(name="trainer", entrypoint="sh", args=["-c", cmd], num_replicas=replicas, resource=SMALL, **role)],
    )  # type: ignore[arg-type]


def _labels(job_dir: Path) -> dict[str, str]:
    """Identity labels of the test's jobs (its own run id: other tests' jobs stay in squeue)."""
    return {
        "airflow.dag_id": "d",
        "airflow.task_id": "t",
        "airflow.run_id": job_dir.parent.name,
        "airflow.map_index": "-1",
    }


def _submit(sched: SlurmScheduler, app: AppDef, job_dir: Path, **cfg: object) -> str:
    return sched.submit(app, {"job_dir": str(job_dir), **cfg}, labels=_labels(job_dir))


def _all_lines(sched: SlurmScheduler, app_id: str, k: int = 0, streams: Stream | None = None) -> list[str]:
    """Every line of a terminal job's replica through the cursors, a few lines per read."""
    out, cursor = [], None
    while True:
        chunk = sched.read_log(app_id, "trainer", k, cursor=cursor, streams=streams, max_lines=2)
        out += chunk.lines
        cursor = chunk.cursor
        if chunk.eof:
            return out


def test_echo_job_end_to_end(slurm: SlurmScheduler, job_dir: Path) -> None:
    app = _app("for i in 1 2 3 4 5; do echo out$i; done; echo oops >&2")
    info = slurm.submit_dryrun(app, {"job_dir": str(job_dir)}, labels=_labels(job_dir))
    app_id = slurm.schedule(info)
    native = slurm.describe_native(app_id)
    assert native is not None and (native.request.args, native.request.script) == (
        info.request.args,
        info.request.script,
    )
    desc = wait_for(slurm, app_id)
    assert desc.state == AppState.SUCCEEDED, desc.msg
    assert desc.labels == _labels(job_dir)
    assert [r.replicas[0].exit_code for r in desc.roles_statuses] == [0]
    assert desc.usage is not None and [(a.role, a.replica, a.exit_code) for a in desc.usage.attempts] == [
        ("trainer", 0, 0)
    ]
    assert desc.usage.queue_wait_s is not None and desc.usage.roles[0].vcpu_hours is not None
    assert _all_lines(slurm, app_id, streams=Stream.STDOUT) == [f"out{i}\n" for i in range(1, 6)]
    assert _all_lines(slurm, app_id, streams=Stream.STDERR) == ["oops\n"]
    assert sorted(_all_lines(slurm, app_id)) == sorted([f"out{i}\n" for i in range(1, 6)] + ["oops\n"])
    listed = slurm.list(labels=_labels(job_dir))
    assert [(a.app_id, a.state) for a in listed] == [(app_id, AppState.SUCCEEDED)]


def test_two_node_job_one_replica_per_node_with_rank0_host(slurm: SlurmScheduler, job_dir: Path) -> None:
    runner = Runner("s", {"slurm": lambda session, **kw: slurm})
    handle = runner.run(
        _app("echo $TORCHX_REPLICA_ID $TORCHX_RANK0_HOST $TORCHX_PORT_C10D $TORCHX_JOB_ID", 2, port_map={"c10d": 1}),
        "slurm",
        {"job_dir": str(job_dir)},
    )
    app_id = handle.rsplit("/", 1)[1]
    desc = wait_for(slurm, app_id)
    assert desc.state == AppState.SUCCEEDED, desc.msg
    assert sorted(r.hostname for r in desc.roles_statuses[0].replicas) == ["n1", "n2"]
    rows = [_all_lines(slurm, app_id, k)[0].split() for k in (0, 1)]
    assert [row[0] for row in rows] == ["0", "1"]
    assert {row[1] for row in rows} == {"localhost"}  # n1's NodeAddr in the test cluster
    assert rows[0][2] == rows[1][2] and rows[0][2].isdigit()
    assert {row[3] for row in rows} == {handle}


def test_a_replica_gets_the_role_s_env_and_none_of_the_submitting_process_s(
    slurm: SlurmScheduler, job_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_WAREHOUSE", "postgres://etl:hunter2@db/warehouse")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "hunter2-aws")
    cmd = (
        'echo "conn=${AIRFLOW_CONN_WAREHOUSE:-unset} aws=${AWS_SECRET_ACCESS_KEY:-unset} mine=$MINE"; '
        'echo "leaked=$(env | grep -c hunter2)"; command -v date >/dev/null && echo path=ok'
    )
    app_id = _submit(slurm, _app(cmd, env={"MINE": "role's own"}), job_dir)
    desc = wait_for(slurm, app_id)
    assert desc.state == AppState.SUCCEEDED, desc.msg
    assert _all_lines(slurm, app_id, streams=Stream.STDOUT) == [
        "conn=unset aws=unset mine=role's own\n",
        "leaked=0\n",
        "path=ok\n",
    ]


def test_failing_rank_is_the_failure_with_its_exit_code(slurm: SlurmScheduler, job_dir: Path) -> None:
    app_id = _submit(slurm, _app('if [ "$TORCHX_REPLICA_ID" = 1 ]; then exit 3; fi; sleep 30', 2), job_dir)
    desc = wait_for(slurm, app_id)
    assert desc.state == AppState.FAILED
    assert desc.msg.startswith("trainer[1] exited with 3")
    reps = desc.roles_statuses[0].replicas
    assert (reps[1].state, reps[1].exit_code) == (AppState.FAILED, 3)
    assert (reps[0].state, reps[0].msg) == (AppState.CANCELLED, "stopped after trainer[1] failed")


def test_cancel_records_who_and_leaves_nothing_in_squeue(slurm: SlurmScheduler, job_dir: Path) -> None:
    app_id = _submit(slurm, _app("sleep 60"), job_dir)
    wait_for(slurm, app_id, done="running")
    slurm.cancel(app_id, reason="airflow-torchx cancel by alice", by=CancelledBy.USER)
    desc = wait_for(slurm, app_id)
    assert (desc.state, desc.cancelled_by, desc.cancel_reason) == (
        AppState.CANCELLED,
        CancelledBy.USER,
        "airflow-torchx cancel by alice",
    )
    assert desc.msg == "cancelled by user: airflow-torchx cancel by alice"
    live = [
        e
        for app, e in status.index_jobs(slurm.commands.squeue()).items()
        if app == app_id and status.slurm_state(e) in ("PENDING", "RUNNING", "COMPLETING")
    ]
    assert live == []


def test_sbatch_test_only_accepts_a_dry_run(slurm: SlurmScheduler, job_dir: Path) -> None:
    app = AppDef(
        name="ddp",
        roles=[
            Role(name="a", entrypoint="echo", num_replicas=1, resource=Resource(cpu=1, gpu=2, memMB=500)),
            Role(name="b", entrypoint="echo", num_replicas=1, resource=Resource(cpu=2, gpu=1, memMB=500)),
        ],
    )
    info = slurm.submit_dryrun(app, {"job_dir": str(job_dir), "partition": "debug", "time": "0:10:00"})
    answer = slurm.test_only(info)
    assert answer.startswith("sbatch: Job ") and "to start at" in answer
    assert [a for a in slurm.list() if a.name == "ddp"] == []
    assert list(job_dir.iterdir()) == []


def test_describes_an_ended_job_after_slurm_forgot_it(slurm: SlurmScheduler, job_dir: Path) -> None:
    # Rank 1 fails a second after rank 0 ended: srun --kill-on-bad-exit would stop a rank 0 still running.
    script = 'echo "rank $TORCHX_REPLICA_ID"; [ "$TORCHX_REPLICA_ID" = 0 ] || sleep 1; exit $TORCHX_REPLICA_ID'
    app_id = _submit(slurm, _app(script, 2), job_dir)
    assert wait_for(slurm, app_id).state == AppState.FAILED
    deadline = time.monotonic() + 90  # slurmctld purges ended jobs once a minute (MinJobAge is 2 s)
    while app_id in status.index_jobs(slurm.commands.squeue()):
        assert time.monotonic() < deadline, "slurmctld did not forget the job"
        time.sleep(1)
    desc = slurm.describe(app_id)
    assert desc is not None
    assert (desc.state, desc.msg.split(" on ")[0]) == (AppState.FAILED, "trainer[1] exited with 1")
    assert [(r.id, r.state, r.exit_code) for r in desc.roles_statuses[0].replicas] == [
        (0, AppState.SUCCEEDED, 0),
        (1, AppState.FAILED, 1),
    ]
    assert _all_lines(slurm, app_id, 1) == ["rank 1\n"]
    fresh = SlurmScheduler("other", index=slurm.index)  # another process of this host
    assert fresh.describe(app_id) == desc
    assert [a.app_id for a in fresh.list(labels=_labels(job_dir))] == [app_id]


def test_one_squeue_call_per_round_for_every_watched_job(slurm: SlurmScheduler, job_dir: Path) -> None:
    ids = [_submit(slurm, _app("true"), job_dir) for _ in range(4)]
    for app_id in ids:
        wait_for(slurm, app_id)
    before = slurm.commands.by_command.copy()
    futures = [slurm.describe_future_as(app_id, lambda d: d.state if d else None) for app_id in ids]
    assert [f.result(timeout=30) for f in futures] == [AppState.SUCCEEDED] * 4
    calls = slurm.commands.by_command - before
    # One round answers every look it finds waiting: one squeue, or two when the first look
    # starts a round before the others arrive (they wait for the next); never one per job. One
    # sacct a round too for those the controller forgot meanwhile (MinJobAge is 2 s).
    assert calls["squeue"] <= 2 and calls["sacct"] <= calls["squeue"], calls
    assert sum(calls.values()) == calls["squeue"] + calls["sacct"], calls


def test_missing_commands_are_a_setup_error_of_one_line(tmp_path: Path) -> None:
    sched = SlurmScheduler("t", commands=SlurmCommands(env={"PATH": str(tmp_path)}))
    with pytest.raises(SchedulerSetupError) as err:
        sched.describe("1")
    assert "squeue is not installed" in str(err.value) and "\n" not in str(err.value)


def test_unreachable_controller_is_a_setup_error_and_submits_nothing(
    slurm_cluster: str, tmp_path: Path, job_dir: Path
) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        "\n".join(
            "SlurmctldPort=1" if line.startswith("SlurmctldPort=") else line
            for line in Path(slurm_cluster).read_text().splitlines()
        )
    )
    import os

    sched = SlurmScheduler("t", commands=SlurmCommands(env={**os.environ, "SLURM_CONF": str(conf)}))
    with pytest.raises(SchedulerSetupError) as err:
        sched.submit(_app("true"), {"job_dir": str(job_dir)})
    assert "cannot be reached" in str(err.value) and "\n" not in str(err.value)
    assert list(job_dir.iterdir()) == []


def test_an_unreadable_record_is_described_from_slurm_alone(slurm: SlurmScheduler, job_dir: Path) -> None:
    app_id = _submit(slurm, _app("sleep 60"), job_dir)
    (job_dir / app_id / "job.json").write_text(json.dumps({"not": "a record"}))
    desc = slurm.describe(app_id)
    assert desc is not None and desc.labels == _labels(job_dir)
    slurm.cancel(app_id)


@pytest.mark.parametrize(
    ("cfg", "resource", "replicas", "error", "says"),
    [
        (
            {"partition": "gpu"},
            SMALL,
            1,
            InvalidRunConfigError,
            "partition='gpu' does not exist on this Slurm cluster; its partitions: debug",
        ),
        (
            {},
            Resource(cpu=1, gpu=3, memMB=100),
            1,
            JobWontFitError,
            "with 1 CPUs, 100 MB, 3 GPUs each; partition 'debug' has 0 such node(s) of 2 (at most 2 GPUs",
        ),
        (
            {},
            SMALL,
            3,
            JobWontFitError,
            "role 'trainer' needs 3 node(s) with 1 CPUs, 100 MB each; partition 'debug' has 2 such node(s) of 2",
        ),
        (
            {},
            Resource(cpu=1, gpu=0, memMB=4000),
            1,
            JobWontFitError,
            "partition 'debug' has 0 such node(s) of 2 (at most 2 GPUs, 2 CPUs and 2000 MB per node)",
        ),
        (
            {"time": "2:00:00"},
            SMALL,
            1,
            JobWontFitError,
            "cfg: time='2:00:00' exceeds partition 'debug''s MaxTime 01:00:00",
        ),
    ],
)
def test_preflight_refuses_before_submitting(
    slurm: SlurmScheduler, job_dir: Path, cfg: dict[str, str], resource: Resource, replicas: int, error: type, says: str
) -> None:
    before = set(status.index_jobs(slurm.commands.squeue()))
    app = AppDef(name="big", roles=[Role(name="trainer", entrypoint="true", num_replicas=replicas, resource=resource)])
    with pytest.raises(error) as err:
        slurm.submit(app, {"job_dir": str(job_dir / "new"), **cfg})
    assert says in str(err.value)
    assert set(status.index_jobs(slurm.commands.squeue())) - before == set()
    assert list(job_dir.iterdir()) == []  # not even the job directory was made


def test_check_settings_names_the_partition(slurm: SlurmScheduler, job_dir: Path) -> None:
    assert slurm.check_settings({"job_dir": str(job_dir)}).startswith("Slurm partition 'debug' is UP")
    with pytest.raises(InvalidRunConfigError, match="its partitions: debug"):
        slurm.check_settings({"job_dir": str(job_dir), "partition": "nope"})


def test_a_job_dir_that_cannot_be_written_submits_nothing(slurm: SlurmScheduler, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    before = set(status.index_jobs(slurm.commands.squeue()))
    with pytest.raises(InvalidRunConfigError, match=r"cfg: job_dir='.*/file/jobs' cannot be made"):
        slurm.submit(_app("true"), {"job_dir": str(blocker / "jobs")})
    assert set(status.index_jobs(slurm.commands.squeue())) - before == set()


def test_reading_a_live_job_s_logs_shares_one_squeue_snapshot(
    slurm_cluster: str, tmp_path: Path, job_dir: Path
) -> None:
    frozen = Clock(monotonic=lambda: 0.0)  # the snapshot never ages
    sched = SlurmScheduler("t", index=JobIndex(tmp_path / "index"), clock=frozen)
    try:
        app_id = _submit(sched, _app("echo first; sleep 60"), job_dir)
        lines: list[str] = []
        cursor = None
        while not lines:
            chunk = sched.read_log(app_id, "trainer", 0, cursor=cursor)
            assert not chunk.eof
            lines, cursor = lines + chunk.lines, chunk.cursor
        before = sched.commands.calls
        for _ in range(20):
            chunk = sched.read_log(app_id, "trainer", 0, cursor=cursor)
            assert (chunk.lines, chunk.eof) == ([], False)
        assert lines == ["first\n"] and sched.commands.calls == before
    finally:
        sched.cancel(app_id)
        sched.close()


def test_a_job_waiting_for_nodes_says_slurm_s_reason(slurm: SlurmScheduler, job_dir: Path) -> None:
    hog = _submit(slurm, _app("sleep 60", 2), job_dir, exclusive=True)
    wait_for(slurm, hog, done="running")
    waiting = _submit(slurm, _app("true"), job_dir)
    deadline = time.monotonic() + 30  # Slurm sets a reason at its next scheduling pass
    while (desc := slurm.describe(waiting)) is not None and desc.msg == "pending in Slurm (PENDING)":
        assert time.monotonic() < deadline, "Slurm gave no reason"
        time.sleep(0.2)
    assert desc is not None and (desc.state, desc.msg) == (AppState.PENDING, "pending in Slurm (PENDING): Resources")
    assert slurm.wait_reason(waiting) == "Slurm's reason: Resources"
    assert slurm.wait_reason(hog) == ""


def test_a_two_node_dist_spmd_dry_run_is_accepted_and_meets_at_rank0(slurm: SlurmScheduler, job_dir: Path) -> None:
    runner = Runner("s", {"slurm": lambda session, **kw: slurm})
    info = runner.dryrun_component(
        "dist.spmd",
        ["--script", "train.py", "-j", "2x2", "--gpu", "2", "--memMB", "1000"],
        "slurm",
        {"job_dir": str(job_dir)},
    )
    script = info.request.script
    header = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert header == [
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --cpus-per-task=1",
        "#SBATCH --mem=1000M",
        "#SBATCH --gpus-per-node=2",
    ]
    assert "--rdzv_endpoint $TORCHX_RANK0_HOST:${TORCHX_PORT_C10D:-29500}" in script
    assert "export TORCHX_PORT_C10D=$(( 20000 + (SLURM_JOB_ID * 1 + 0) % 20000 ))" in script
    assert slurm.test_only(info).startswith("sbatch: Job ")


def _release(sched: SlurmScheduler, app_id: str) -> None:
    """Start a requeued job soon: Slurm holds one until ``BeginTime`` (about two minutes). Once
    its previous run is cleaned up (``scontrol`` says COMPLETING until then, ``squeue`` PENDING
    already), and not within the second its credential was revoked: a run started then is
    killed ("Job credential revoked"), hence two seconds on."""
    deadline = time.monotonic() + 30
    while "JobState=COMPLETING" in sched.commands.run(["scontrol", "show", "job", "-o", app_id]).stdout:
        assert time.monotonic() < deadline, "the job's previous run was not cleaned up"
        time.sleep(0.2)
    sched.commands.run(["scontrol", "update", f"JobId={app_id}", "StartTime=now+2"])


def test_a_requeued_job_s_replicas_see_the_next_attempt_and_it_ends_with_its_second_run(
    slurm: SlurmScheduler, job_dir: Path
) -> None:
    # Run 0: replica 0 ends at once (its end is on record), replica 1 runs on until the requeue.
    # Run 1: both end a moment after they start.
    cmd = (
        'echo "attempt=$TORCHX_ATTEMPT"; '
        'if [ "$TORCHX_ATTEMPT" = 0 ]; then [ "$TORCHX_REPLICA_ID" = 0 ] && exit 0; sleep 60; fi; '
        'sleep 1; echo "done=$TORCHX_ATTEMPT"'
    )
    app_id = _submit(slurm, _app(cmd, 2), job_dir)
    deadline = time.monotonic() + 30
    while (desc := wait_for(slurm, app_id, done="running")).roles_statuses[0].replicas[0].exit_code != 0:
        assert time.monotonic() < deadline, "replica 0 did not end"
        time.sleep(0.2)
    slurm.commands.run(["scontrol", "requeue", app_id])
    desc = slurm.describe(app_id)
    deadline = time.monotonic() + 30  # the first run's processes end within KillWait
    while desc is not None and not (desc.state == AppState.PENDING and desc.num_restarts == 1):
        assert time.monotonic() < deadline, f"the job was not requeued: {desc.state.name} {desc.msg}"
        time.sleep(0.2)
        desc = slurm.describe(app_id)
    assert desc is not None
    # Requeued, not yet run again: replica 0's end on record is the first run's, not this one's.
    assert [(r.id, r.state, r.exit_code) for r in desc.roles_statuses[0].replicas] == [
        (0, AppState.PENDING, None),
        (1, AppState.PENDING, None),
    ]
    assert slurm.read_log(app_id, "trainer", 0).eof is False
    _release(slurm, app_id)
    desc = wait_for(slurm, app_id)
    assert (desc.state, desc.num_restarts) == (AppState.SUCCEEDED, 1), desc.msg
    for k in (0, 1):
        assert _all_lines(slurm, app_id, k, streams=Stream.STDOUT) == ["attempt=0\n", "attempt=1\n", "done=1\n"]
    assert desc.usage is not None
    attempts = sorted(desc.usage.attempts, key=lambda a: (a.replica, a.number))
    assert [(a.replica, a.number) for a in attempts] == [(0, 1), (0, 2), (1, 1), (1, 2)]
    assert [a.exit_code for a in attempts if a.number == 2 or a.replica == 0] == [0, 0, 0]
    assert all(a.started is not None and a.ended is not None for a in attempts)
    # Once Slurm forgets it, the record alone says the same: the second run's end.
    forgotten = status.describe(app_id, record.read(app_id, str(job_dir / app_id)), None)
    assert forgotten is not None
    assert (forgotten.state, forgotten.num_restarts) == (AppState.SUCCEEDED, 1)


def test_attempt_timeout_is_the_job_s_time_limit_in_slurm(slurm: SlurmScheduler, job_dir: Path) -> None:
    app_id = _submit(slurm, _app("sleep 60"), job_dir, attempt_timeout=90)
    entry = status.index_jobs(slurm.commands.squeue())[app_id]
    assert entry["time_limit"] == 2  # minutes: Slurm stops the run past them, TIMEOUT
    shorter = _submit(slurm, _app("sleep 60"), job_dir, attempt_timeout=600, time="1")
    assert status.index_jobs(slurm.commands.squeue())[shorter]["time_limit"] == 1
    capped = _submit(slurm, _app("sleep 60"), job_dir, attempt_timeout=7200)  # over the partition's MaxTime
    assert status.index_jobs(slurm.commands.squeue())[capped]["time_limit"] == 60


def test_sacct_keeps_an_ended_job_where_the_cluster_runs_accounting(slurm: SlurmScheduler, job_dir: Path) -> None:
    config = slurm.commands.run(["scontrol", "show", "config"]).stdout
    accounting = "accounting_storage/slurmdbd" in config  # scripts/slurm.sh: TORCHX_SLURM_ACCOUNTING=1
    app_id = _submit(slurm, _app("sleep 60"), job_dir)
    wait_for(slurm, app_id, done="running")
    slurm.commands.scancel(app_id)  # outside airflow-torchx: no cancel on record
    assert wait_for(slurm, app_id).state == AppState.CANCELLED
    kept = slurm.commands.sacct([app_id])
    if not accounting:
        assert (kept, slurm.commands.accounting) == (None, False)
        return
    assert kept is not None
    entry = status.index_jobs(status.sacct_entry(job) for job in kept)[app_id]
    desc = status.describe(app_id, None, entry)  # as once the controller forgot the job
    assert desc is not None and (desc.state, desc.labels) == (AppState.CANCELLED, _labels(job_dir))
    assert slurm.commands.sacct(["999999"]) == []


def test_prune_removes_only_ended_jobs_older_than_the_limit_in_the_states_asked(
    slurm: SlurmScheduler, job_dir: Path
) -> None:
    ok, bad = _submit(slurm, _app("true"), job_dir), _submit(slurm, _app("exit 3"), job_dir)
    running = _submit(slurm, _app("sleep 60"), job_dir)
    assert (wait_for(slurm, ok).state, wait_for(slurm, bad).state) == (AppState.SUCCEEDED, AppState.FAILED)
    wait_for(slurm, running, done="running")

    def own(pruned: list[tuple[str, int]]) -> list[tuple[str, int]]:
        """This test's jobs of a prune (it takes every ended job of ours that this host saw)."""
        return [(app_id, size) for app_id, size in pruned if app_id in (ok, bad, running)]

    assert own(slurm.prune(3600)) == []  # ended less than an hour ago
    dry = own(slurm.prune(0, states=["failed"], dry_run=True))
    assert [app_id for app_id, _ in dry] == [bad] and dry[0][1] > 0
    assert (job_dir / bad).is_dir() and slurm.index.get(bad) == str(job_dir / bad)
    assert own(slurm.prune(0, states=["FAILED"])) == dry
    assert not (job_dir / bad).exists() and slurm.index.get(bad) is None
    assert [app_id for app_id, _ in own(slurm.prune(0))] == [ok]
    left = {p.name for p in job_dir.iterdir()}  # the batch outputs of the pruned jobs go too
    assert running in left and not left & {ok, bad, f"slurm-{ok}.out", f"slurm-{bad}.out"}
    assert slurm.index.get(ok) is None and slurm.index.get(running) == str(job_dir / running)


def test_checkpoint_uses_name_each_recorded_job_s_location(slurm: SlurmScheduler, job_dir: Path) -> None:
    location = str(job_dir.parent / "ckpt" / "d" / "r" / "t")
    env = {"TORCHX_CHECKPOINT_DIR": location}
    done = _submit(slurm, _app("true", env=env), job_dir)
    live = _submit(slurm, _app("sleep 60", env=env), job_dir)
    _submit(slurm, _app("true"), job_dir)  # names none
    ended = wait_for(slurm, done)
    wait_for(slurm, live, done="running")
    uses = slurm.checkpoint_uses()
    assert list(uses) == [location]
    by_job = {u.app_id: u for u in uses[location]}
    assert set(by_job) == {done, live}
    assert (by_job[done].ended, by_job[done].ended_at) == (True, ended.ended)
    assert (by_job[live].ended, by_job[live].ended_at) == (False, None)
    assert by_job[live].identity is not None and by_job[live].identity.run_id == job_dir.parent.name


def test_a_host_that_never_submitted_to_slurm_prunes_without_asking_slurm(tmp_path: Path) -> None:
    sched = SlurmScheduler("t", commands=SlurmCommands(env={"PATH": str(tmp_path)}), index=JobIndex(tmp_path / "i"))
    assert sched.capabilities.prune
    assert (sched.prune(0), sched.checkpoint_uses()) == ([], {})
    assert not sched.commands.by_command
