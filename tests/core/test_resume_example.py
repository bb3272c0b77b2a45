"""The resume protocol of ``example_dags/scripts/ddp_resume.py`` with a stand-in for PyTorch: a
real DDP run with a reclaim costs two ``import torch`` per rank, far more than CI can give it
(benchmarks/README.md, "Resume after a reclaim"), so this runs the example's own checkpoint
helpers in a plain Python job of 2 replicas on the local scheduler, SIGKILLs a replica from
outside after step 2 of 5, and checks that the restarted attempt resumes from step 2
(``TORCHX_ATTEMPT`` 0, then 1) and finishes at step 5."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_torchx.core import checkpoints
from airflow_provider_torchx.core.schedulers.api import Stream
from airflow_provider_torchx.core.schedulers.local import LocalScheduler, create_cwd_scheduler
from airflow_provider_torchx.core.specs import AppDef, AppState, RetryPolicy, Role
from tests.core.local.helpers import wait_done
from tests.fixtures.airflow import REPO

SCRIPTS = REPO / "example_dags" / "scripts"
sys.path.insert(0, str(SCRIPTS))
import ddp_resume  # noqa: E402 - the example's helpers, standard library only

#: A rank of the stand-in: the example's checkpoint protocol around a step counter.
STAND_IN = """
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
from ddp_resume import attempt_number, newest_checkpoint, save_checkpoint
rank, directory = int(sys.argv[2]), os.environ["TORCHX_CHECKPOINT_DIR"]
attempt = attempt_number(os.environ)
newest = newest_checkpoint(directory)
start = json.load(open(newest[1]))["step"] if newest else 0
print(f"rank {rank} attempt {attempt}: resumed from step {start}", flush=True)
# Every rank has read before any saves (DDP's first all-reduce orders it so in the example).
os.makedirs(directory, exist_ok=True)  # the job creates its location (docs/checkpoints.md)
open(os.path.join(directory, f"read-{attempt}-{rank}"), "w").close()
while not all(os.path.exists(os.path.join(directory, f"read-{attempt}-{r}")) for r in (0, 1)):
    time.sleep(0.01)
for step in range(start + 1, 6):
    if rank == 0:
        def write(path, step=step):
            with open(path, "w") as f:
                json.dump({"step": step}, f)
        save_checkpoint(directory, step, write, keep=2)
    print(f"rank {rank} step {step}", flush=True)
    if attempt == 0 and step == 2:
        with open(os.path.join(directory, f"at-2-{rank}"), "w") as f:
            f.write(str(os.getpid()))
        time.sleep(60)  # killed here
print(f"rank {rank} finished at step 5", flush=True)
"""


@pytest.fixture
def sched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalScheduler]:
    monkeypatch.setenv("AIRFLOW_TORCHX_STATE_DIR", str(tmp_path / "state"))
    with create_cwd_scheduler("test", cancel_grace_period=2.0) as s:
        yield s


def test_the_restarted_attempt_resumes_from_the_newest_checkpoint(sched: LocalScheduler, tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(STAND_IN)
    role = Role(
        "trainer",
        image="local",
        entrypoint=sys.executable,
        args=[str(script), str(SCRIPTS), "${replica_id}"],
        num_replicas=2,
        max_retries=1,
        retry_policy=RetryPolicy.APPLICATION,
    )
    app = AppDef("resume", roles=[role])
    location = str(tmp_path / "ckpt")
    checkpoints.place(app, location, 0, host_paths=True)
    app_id = sched.submit(app)
    deadline = time.monotonic() + 30
    while not all(os.path.exists(os.path.join(location, f"at-2-{k}")) for k in (0, 1)):
        assert time.monotonic() < deadline, "the ranks never reached step 2"
        time.sleep(0.02)
    os.kill(int(Path(location, "at-2-0").read_text()), signal.SIGKILL)  # replica 0, from outside
    desc = wait_done(sched, app_id)
    assert desc.state == AppState.SUCCEEDED and desc.num_restarts == 1, desc
    for k in (0, 1):
        lines = [line.rstrip("\n") for line in sched.log_iter(app_id, "trainer", k, streams=Stream.STDOUT)]
        assert lines == [
            f"rank {k} attempt 0: resumed from step 0",
            f"rank {k} step 1",
            f"rank {k} step 2",
            f"rank {k} attempt 1: resumed from step 2",
            f"rank {k} step 3",
            f"rank {k} step 4",
            f"rank {k} step 5",
            f"rank {k} finished at step 5",
        ]
    assert [step for step, _ in ddp_resume.checkpoints(location)] == [4, 5]  # the newest two kept


def test_the_examples_helpers(tmp_path: Path) -> None:
    assert ddp_resume.newest_checkpoint(str(tmp_path / "none")) is None
    for step in (1, 2, 10):
        ddp_resume.save_checkpoint(str(tmp_path), step, lambda p: Path(p).write_text("x"), keep=2)
    (tmp_path / "step-00000099.pt.partial-1").write_text("half")  # never taken for a checkpoint
    assert ddp_resume.newest_checkpoint(str(tmp_path)) == (10, str(tmp_path / "step-00000010.pt"))
    assert [s for s, _ in ddp_resume.checkpoints(str(tmp_path))] == [2, 10]
    assert ddp_resume.attempt_number({}) == 0
    assert ddp_resume.attempt_number({"TORCHX_ATTEMPT": "1", "AWS_BATCH_JOB_ATTEMPT": "2"}) == 2
    env = {"TORCHX_ATTEMPT": "3", "AWS_BATCH_JOB_ATTEMPT": "4"}
    assert ddp_resume.attempt_number(env) == checkpoints.attempt_in_container(env)
