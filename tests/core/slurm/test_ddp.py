"""A real two-node DDP job on the Slurm cluster (``scripts/slurm.sh``): ``dist.spmd`` runs one
``torchrun`` per node (PyTorch CPU, gloo, from ``scripts/torch-venv.sh``) meeting at rank 0's
host on the job's own port. Fails without the cluster or PyTorch."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from airflow_provider_torchx.core.components.dist import spmd
from airflow_provider_torchx.core.schedulers.slurm.scheduler import SlurmScheduler
from airflow_provider_torchx.core.specs import AppState
from tests.core.slurm.conftest import wait_for
from tests.fixtures.torch import DDP_SCRIPT, nodes_stderr, torch_job_env

pytestmark = [pytest.mark.slurm, pytest.mark.torch, pytest.mark.usefixtures("torch_venv")]


def test_a_two_node_ddp_job_runs_one_torchrun_per_node(slurm: SlurmScheduler, job_dir: Path) -> None:
    app = spmd("--steps", "2", script=DDP_SCRIPT, j="2x1", memMB=500, env=torch_job_env())
    app_id = slurm.submit(app, {"job_dir": str(job_dir)})
    desc = wait_for(slurm, app_id, limit=180)  # a bound on a hang: PyTorch loads slowly on a busy host
    logs = "".join(line for k in (0, 1) for line in slurm.log_iter(app_id, "ddp_train", k))
    assert desc.state == AppState.SUCCEEDED, (desc.msg, nodes_stderr(job_dir / app_id), logs[-3000:])
    assert sorted(r.hostname for r in desc.roles_statuses[0].replicas) == ["n1", "n2"]
    for rank in (0, 1):
        assert len(re.findall(rf"^rank {rank} of 2: all_reduce sum 1$", logs, re.MULTILINE)) == 1, logs[-3000:]
        assert re.search(rf"^rank {rank} step 1 loss ", logs, re.MULTILINE), logs[-3000:]
