"""The ``sbatch`` script a dry run renders (offline: no cluster)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from airflow_provider_torchx.core.errors import InvalidRunConfigError, InvalidSpecError
from airflow_provider_torchx.core.schedulers.slurm import record
from airflow_provider_torchx.core.schedulers.slurm.render import parse_comment
from airflow_provider_torchx.core.schedulers.slurm.scheduler import SlurmScheduler
from airflow_provider_torchx.core.specs import AppDef, BindMount, Resource, Role, VolumeMount, macros


def _dryrun(app: AppDef, **cfg: object) -> str:
    info = SlurmScheduler("s").submit_dryrun(app, {"job_dir": "/shared/jobs", **cfg}, labels={"airflow.dag_id": "d"})
    return str(info.request)


def _two_roles() -> AppDef:
    return AppDef(
        name="ddp",
        roles=[
            Role(name="master", entrypoint="python", args=["-m", "x"], num_replicas=1, resource=Resource(4, 0, 1000)),
            Role(name="worker", entrypoint="python", num_replicas=3, resource=Resource(8, 2, 64000)),
        ],
    )


def test_each_role_is_a_heterogeneous_component_with_its_resources() -> None:
    text = _dryrun(
        _two_roles(), partition="gpu", time="1-00:00", account="a", qos="q", constraint="h100", exclusive=True
    )
    header = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    common = ["--partition=gpu", "--account=a", "--qos=q", "--time=1-00:00", "--constraint=h100", "--exclusive"]
    master = ["--nodes=1", "--ntasks-per-node=1", "--cpus-per-task=4", "--mem=1000M", *common]
    worker = ["--nodes=3", "--ntasks-per-node=1", "--cpus-per-task=8", "--mem=64000M", "--gpus-per-node=2", *common]
    assert header == [f"#SBATCH {o}" for o in master] + ["#SBATCH hetjob"] + [f"#SBATCH {o}" for o in worker]
    assert "srun --het-group=0 --nodes=1 --ntasks-per-node=1 --kill-on-bad-exit=1" in text
    assert "srun --het-group=1 --nodes=3 --ntasks-per-node=1 --kill-on-bad-exit=1" in text


def test_one_role_is_a_plain_job() -> None:
    app = AppDef(name="one", roles=[Role(name="r", entrypoint="echo", resource=Resource(1, 0, 10))])
    text = _dryrun(app)
    assert "hetjob" not in text and "--het-group" not in text


def test_job_options_and_identity_go_on_sbatch_s_command_line() -> None:
    info = SlurmScheduler("s").submit_dryrun(
        _two_roles(),
        {"job_dir": "/shared/jobs/", "comment": "nightly", "mail-user": "a@b.c", "mail-type": "END,FAIL"},
        labels={"airflow.dag_id": "d"},
    )
    args = info.request.args
    comment = next(a for a in args if a.startswith("--comment="))
    assert parse_comment(comment.split("=", 1)[1]) == {
        "airflow-torchx": 1,
        "app": "ddp",
        "labels": {"airflow.dag_id": "d"},
        "comment": "nightly",
    }
    assert [a for a in args if not a.startswith("--comment=")] == [
        "--export=NONE",
        "--job-name=ddp",
        "--chdir=/shared/jobs",
        "--output=/shared/jobs/slurm-%j.out",
        "--mail-user=a@b.c",
        "--mail-type=END,FAIL",
    ]


def test_every_replica_gets_our_env() -> None:
    role = Role(
        name="w",
        entrypoint="echo",
        num_replicas=2,
        resource=Resource(1, 0, 10),
        port_map={"c10d": 29500},
    )
    text = _dryrun(AppDef(name="m", roles=[role]))
    for line in (
        "export TORCHX_REPLICA_ID=$SLURM_PROCID",
        "export TORCHX_ROLE_NAME=w",
        "export TORCHX_ROLE_IDX=0",
        "export TORCHX_PORT_C10D=$(( 20000 + (SLURM_JOB_ID * 1 + 0) % 20000 ))",
        "export TORCHX_RANK0_HOST=$(scontrol show node",
        'export TORCHELASTIC_ERROR_FILE="$R/error.json" PET_LOG_DIR="$R/ranks"',
    ):
        assert line in text


def test_the_replica_runs_its_command_one_word_per_argument_with_the_macros_expanded(tmp_path: Path) -> None:
    role = Role(
        name="w",
        entrypoint="printf",
        args=["%s|", f"{macros.app_id}-{macros.replica_id}", "a b", "it's", "$HOME", "$${ID}"],
        env={"ID": f"r{macros.replica_id}"},
        resource=Resource(1, 0, 10),
    )
    text = _dryrun(AppDef(name="m", roles=[role]))
    step = text.split("sh -c ", 1)[1].rsplit(" &\npids=", 1)[0]
    env = {
        "TORCHX_SLURM_JOB_DIR": str(tmp_path),
        "TORCHX_SLURM_JOB_ID": "42",
        "SLURM_PROCID": "1",
        "PATH": "/usr/bin:/bin",
    }
    subprocess.run(["sh", "-c", f"sh -c {step}"], env=env, check=True)
    assert (tmp_path / "w" / "1" / "stdout.log").read_text() == "42-1|a b|it's|$HOME|${ID}|"
    assert (tmp_path / "w" / "1" / "exit").read_text().split()[0] == "0"


def test_a_requeued_run_s_replica_is_the_next_attempt_and_keeps_the_previous_run_s_end(tmp_path: Path) -> None:
    role = Role(name="w", entrypoint="sh", args=["-c", "echo $TORCHX_ATTEMPT"], resource=Resource(1, 0, 10))
    role.env["TORCHX_ATTEMPT"] = "2"  # the task's earlier jobs made two attempts
    info = SlurmScheduler("s").submit_dryrun(AppDef(name="m", roles=[role]), {"job_dir": str(tmp_path)})
    step = info.request.script.split("sh -c ", 1)[1].rsplit(" &\npids=", 1)[0]
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "job.json").write_text(json.dumps({"name": "m", "roles": info.request.roles}))
    for run in ("0", "1"):  # as the batch script exports them, from SLURM_RESTART_COUNT
        env = {"TORCHX_SLURM_JOB_DIR": str(tmp_path / "42"), "TORCHX_SLURM_RUN": run, "SLURM_PROCID": "0"}
        subprocess.run(["sh", "-c", f"sh -c {step}"], env={**env, "PATH": "/usr/bin:/bin"}, check=True)
    replica = tmp_path / "42" / "w" / "0"
    assert (replica / "stdout.log").read_text() == "2\n3\n"
    rec = record.read("42", str(tmp_path / "42"))
    assert rec is not None and rec.run == 1
    assert (rec.exits[("w", 0)].exit_code, rec.exits[("w", 0)].run) == (0, 1)
    [earlier] = rec.earlier[("w", 0)]
    assert earlier.end is not None and (earlier.end.exit_code, earlier.end.run) == (0, 0)
    assert earlier.started is not None and earlier.end.at <= rec.starts[("w", 0)]


@pytest.mark.parametrize(
    ("mount", "accepted"),
    [
        (BindMount("/shared/data", "/shared/data"), True),
        (BindMount("/shared/data", "/data"), False),
        (VolumeMount("fs-1234", "/data"), False),
    ],
)
def test_mounts_slurm_can_honour(mount: object, accepted: bool) -> None:
    app = AppDef(name="m", roles=[Role(name="r", entrypoint="echo", resource=Resource(1, 0, 10), mounts=[mount])])  # type: ignore[list-item]
    if accepted:
        _dryrun(app)
    else:
        with pytest.raises(
            InvalidSpecError, match=r"roles\[0\]\.mounts\[0\]: role 'r': .* cannot be honoured on Slurm"
        ):
            _dryrun(app)


def test_an_absolute_image_is_where_the_replica_runs_another_is_ignored() -> None:
    in_dir = _dryrun(
        AppDef(name="m", roles=[Role(name="r", image="/opt/code", entrypoint="echo", resource=Resource(1, 0, 10))])
    )
    assert "cd /opt/code || exit 127" in in_dir
    named = _dryrun(
        AppDef(name="m", roles=[Role(name="r", image="ghcr.io/x:1", entrypoint="echo", resource=Resource(1, 0, 10))])
    )
    assert "cd " not in named


@pytest.mark.parametrize(
    ("cfg", "says"),
    [
        ({"job_dir": "jobs"}, "cfg: job_dir='jobs' is not an absolute path"),
        ({"job_dir": "/j", "time": "1h"}, "cfg: time='1h' is not a Slurm time limit; use minutes, MM:SS"),
        ({"job_dir": "/j", "mail-type": "END,SOMETIMES"}, "cfg: mail-type='END,SOMETIMES' has 'SOMETIMES'"),
        ({"job_dir": "/j", "attempt_timeout": 0}, "attempt_timeout"),
        ({"job_dir": "/j", "max_gpu_hours": -1}, "cfg: max_gpu_hours: -1.0 is not allowed"),
        ({}, "job_dir"),
    ],
)
def test_bad_run_options_are_refused_offline(cfg: dict[str, str], says: str) -> None:
    with pytest.raises(InvalidRunConfigError) as err:
        SlurmScheduler("s").submit_dryrun(_two_roles(), cfg)
    assert says in str(err.value)


def test_the_record_keeps_the_roles() -> None:
    info = SlurmScheduler("s").submit_dryrun(_two_roles(), {"job_dir": "/j"})
    assert json.loads(json.dumps(info.request.roles))[1] == {
        "name": "worker",
        "num_replicas": 3,
        "entrypoint": "python",
        "args": [],
        "env": {},
        "resource": {"cpu": 8, "gpu": 2, "memMB": 64000},
    }


def _times(**cfg: object) -> list[str]:
    """The ``--time`` of each component of the two-role job (2 GPUs on each of 3 nodes: 6 GPUs)."""
    return [line for line in _dryrun(_two_roles(), **cfg).splitlines() if line.startswith("#SBATCH --time")]


@pytest.mark.parametrize(
    ("cfg", "time"),
    [
        ({}, None),
        ({"time": "30"}, "30"),
        ({"attempt_timeout": 90}, "2"),  # whole minutes, rounded up, as Slurm counts them
        ({"attempt_timeout": 600, "time": "5"}, "5"),  # time is shorter: it wins
        ({"attempt_timeout": 120, "time": "1:00:00"}, "2"),  # the guard is shorter: it wins
        ({"max_gpu_hours": 1}, "10"),  # 1 GPU-hour over 6 GPUs
        ({"max_gpu_hours": 1, "attempt_timeout": 300}, "5"),
        ({"max_gpu_hours": 1, "time": "1-00:00"}, "10"),
    ],
)
def test_the_job_s_time_limit_is_the_shortest_of_time_and_the_guards(cfg: dict[str, object], time: str | None) -> None:
    assert _times(**cfg) == ([] if time is None else [f"#SBATCH --time={time}"] * 2)
