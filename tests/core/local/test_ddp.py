"""Real PyTorch on the local scheduler: two 2-node DDP jobs (``dist.spmd -j 2x2``, the
example's training script) started at the same moment both succeed: each job rendezvouses on
a port of its own. Needs ``scripts/torch-venv.sh`` (fails without it)."""

from __future__ import annotations

import re

import pytest

from airflow_provider_torchx.core.components.dist import spmd
from airflow_provider_torchx.core.schedulers.local import LocalScheduler
from airflow_provider_torchx.core.specs import AppState
from tests.core.local.helpers import wait_done
from tests.fixtures.torch import DDP_SCRIPT, nodes_stderr, torch_job_env

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("torch_venv")]


def test_two_multi_node_ddp_jobs_at_once_both_succeed(sched: LocalScheduler) -> None:
    app = spmd("--steps", "2", script=DDP_SCRIPT, j="2x2", env=torch_job_env())
    infos = [sched.submit_dryrun(app, {}) for _ in range(2)]
    app_ids = [sched.schedule(info) for info in infos]
    ports = set()
    for app_id in app_ids:
        desc = wait_done(sched, app_id, timeout=240)
        logs = "\n".join(line for k in (0, 1) for line in sched.log_iter(app_id, "ddp_train", k))
        assert desc.state == AppState.SUCCEEDED, (desc.msg, nodes_stderr(sched.job_dir(app_id)), logs[-3000:])
        for r in range(4):
            assert len(re.findall(rf"^rank {r} of 4: all_reduce sum 6$", logs, re.MULTILINE)) == 1, logs[-3000:]
        native = sched.describe_native(app_id)
        assert native is not None
        ports |= {p.env["TORCHX_PORT_C10D"] for p in native.request.role_params["ddp_train"]}
    assert len(ports) == 2, ports
