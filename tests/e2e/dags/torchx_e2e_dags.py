"""DAGs for the live-deployment tests (``tests/e2e``), copied into the deployment's DAGs folder.

Each job is ``utils.sh`` with ``num_replicas`` replicas; replica ``k`` prints ``r<k> line <i>``
for ``i`` in ``1..lines``, ``pause`` seconds apart, then (when ``gate`` names a file) waits for
that file to exist, then exits 0. The tests pick ``lines``, ``pause`` and ``gate`` per run
through the DAG run's conf (``params``).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_provider_torchx.operators.torchx import TorchXRunOperator
from airflow_provider_torchx.sensors.torchx import TorchXJobSensor

START = datetime(2024, 1, 1)
PARAMS = {"lines": 6, "pause": 1, "replicas": 2, "gate": ""}
LINES_SCRIPT = (
    'for i in $(seq 1 {{ params.lines }}); do echo "r${replica_id} line $i"; sleep {{ params.pause }}; done; '
    'while [ -n "{{ params.gate }}" ] && [ ! -e "{{ params.gate }}" ]; do sleep 0.2; done'
)


def lines_args(image: str | None = None) -> dict[str, object]:
    """``utils.sh`` arguments of the lines job (templated by the operator)."""
    args: dict[str, object] = {"args": [LINES_SCRIPT], "num_replicas": "{{ params.replicas }}", "memMB": 256}
    if image:
        args["image"] = image
    return args


with DAG(dag_id="torchx_e2e_deferred", schedule=None, start_date=START, catchup=False, params=PARAMS):
    TorchXRunOperator(
        task_id="job",
        component="utils.sh",
        component_args=lines_args(),
        scheduler="local_cwd",
        deferrable=True,
        poll_interval=1,
    )

with DAG(dag_id="torchx_e2e_worker", schedule=None, start_date=START, catchup=False, params=PARAMS):
    TorchXRunOperator(
        task_id="job",
        component="utils.sh",
        component_args=lines_args(),
        scheduler="local_cwd",
        deferrable=False,
        poll_interval=1,
        retries=1,
        retry_delay=timedelta(seconds=1),
    )

with DAG(dag_id="torchx_e2e_batch", schedule=None, start_date=START, catchup=False, params=PARAMS):
    TorchXRunOperator(
        task_id="job",
        torchx_conn_id="torchx_batch",
        component="utils.sh",
        component_args=lines_args(image="busybox:local"),
        deferrable=True,
        poll_interval=1,
    )

with DAG(dag_id="torchx_e2e_ddp", schedule=None, start_date=START, catchup=False):
    # The example's DDP script on 2 x 2 ranks with the test venv's torchrun (tests/fixtures/torch.py).
    TorchXRunOperator(
        task_id="job",
        component="dist.spmd",
        component_args={"script": os.environ.get("TORCHX_TEST_DDP_SCRIPT", "ddp_train.py"), "j": "2x2"},
        env={"PATH": os.path.join(os.environ.get("TORCHX_TEST_TORCH_VENV", ""), "bin") + ":" + os.environ["PATH"]},
        scheduler="local_cwd",
        deferrable=True,
        poll_interval=1,
    )

# The orphaned-jobs tests (test_live_orphans.py): long jobs (a job that outlives its task is seen
# running), retries=0. Deferred tasks, one per way a user ends a task while it waits, and one
# (kept) left alone through a triggerer restart; three marked right after deferral (a run of
# their own); worker-mode tasks whose task process (oom) or task process and supervisor (lost)
# the test kills; a deferred task whose DAG run is marked failed.
ORPHAN_PARAMS = {**PARAMS, "lines": 600, "replicas": 1}
ORPHAN_DAGS = {
    "torchx_e2e_orphans": (True, ("marked_failed", "marked_success", "kept")),
    "torchx_e2e_orphans_early": (True, ("early_1", "early_2", "early_3")),
    "torchx_e2e_orphans_worker": (False, ("oom", "lost")),
    "torchx_e2e_orphans_run": (True, ("job",)),
}
for orphan_dag_id, (orphan_deferrable, orphan_tasks) in ORPHAN_DAGS.items():
    with DAG(dag_id=orphan_dag_id, schedule=None, start_date=START, catchup=False, params=ORPHAN_PARAMS):
        for orphan_task in orphan_tasks:
            TorchXRunOperator(
                task_id=orphan_task,
                component="utils.sh",
                component_args=lines_args(),
                scheduler="local_cwd",
                deferrable=orphan_deferrable,
                poll_interval=1,
                retries=0,
            )

# The Slurm tests (test_live_slurm.py; the connection torchx_e2e_slurm exists in their deployment
# only): a deferred Slurm task beside a deferred local one (every line once in each log); a
# deferred Slurm task the test marks failed, and a worker-mode one (retries=1) whose task process
# the test SIGKILLs, whose retry adopts the running job (both wait at the run's gate).
with DAG(dag_id="torchx_e2e_slurm", schedule=None, start_date=START, catchup=False, params=PARAMS):
    TorchXRunOperator(
        task_id="slurm",
        torchx_conn_id="torchx_e2e_slurm",
        component="utils.sh",
        component_args=lines_args(),
        deferrable=True,
        poll_interval=1,
    )
    TorchXRunOperator(
        task_id="local",
        component="utils.sh",
        component_args=lines_args(),
        scheduler="local_cwd",
        deferrable=True,
        poll_interval=1,
    )

with DAG(dag_id="torchx_e2e_slurm_ends", schedule=None, start_date=START, catchup=False, params=PARAMS):
    for slurm_task, slurm_deferrable in (("marked", True), ("retried", False)):
        TorchXRunOperator(
            task_id=slurm_task,
            torchx_conn_id="torchx_e2e_slurm",
            component="utils.sh",
            component_args=lines_args(),
            deferrable=slurm_deferrable,
            poll_interval=1,
            retries=0 if slurm_deferrable else 1,
            retry_delay=timedelta(seconds=1),
        )

# The capacity ladder's live test (test_live_slurm.py; the connections torchx_e2e_box and
# torchx_e2e_ladder_slurm, a 2-GPU host as the ledger counts, exist in that deployment only): "hold"
# submits a local job holding both GPUs until the file params.hold exists, and returns at once;
# then a deferred ladder task whose job asks for both cannot start on the box and moves to
# Slurm. Both rungs checkpoint under params.ckpt, a path the Slurm nodes share with this host.
with DAG(
    dag_id="torchx_e2e_slurm_ladder",
    schedule=None,
    start_date=START,
    catchup=False,
    params={**PARAMS, "ckpt": "", "hold": ""},
):
    hold = TorchXRunOperator(
        task_id="hold",
        component="utils.sh",
        component_args={
            "args": ['while [ ! -e "{{ params.hold }}" ]; do sleep 0.2; done'],
            "gpu": 2,
            "memMB": 64,
        },
        scheduler="local_cwd",
        cfg={"auto_set_cuda_visible_devices": True},
        wait_for_completion=False,  # the ledger hands the GPUs out in submission order: this job first
    )
    ladder = TorchXRunOperator(
        task_id="ladder",
        torchx_conn_id=["torchx_e2e_box", "torchx_e2e_ladder_slurm"],
        component="utils.sh",
        component_args={
            **lines_args(),
            "gpu": 2,
        },
        deferrable=True,
        poll_interval=1,
    )
    # The same ladder in a task that does not wait: it moves its job like the one above, returns
    # the handle of the rung it landed on, and the sensor follows the job there.
    handover = TorchXRunOperator(
        task_id="handover",
        torchx_conn_id=["torchx_e2e_box", "torchx_e2e_ladder_slurm"],
        component="utils.sh",
        component_args={**lines_args(), "gpu": 2},
        deferrable=True,
        poll_interval=1,
        wait_for_completion=False,
    )
    sense = TorchXJobSensor(
        task_id="sense",
        app_handle="{{ ti.xcom_pull(task_ids='handover') }}",
        torchx_conn_id="torchx_e2e_ladder_slurm",
        deferrable=True,
        poke_interval=1,
        stream_logs=True,
    )
    hold >> [ladder, handover]
    handover >> sense

# The capacity ladder's live test on AWS Batch (test_live_batch.py; the connections
# torchx_e2e_batch_box and torchx_e2e_ladder_batch exist in that deployment only, a 4-GPU host as
# the ledger counts, 2 of them held by the test): the deferred task's job asks for 3 GPUs, cannot
# start on the box, and moves to the moto server's queue after the box's start_timeout. Both rungs
# checkpoint under one s3:// root; the job prints where and its attempt.
with DAG(dag_id="torchx_e2e_batch_ladder", schedule=None, start_date=START, catchup=False):
    TorchXRunOperator(
        task_id="ladder",
        torchx_conn_id=["torchx_e2e_batch_box", "torchx_e2e_ladder_batch"],
        component="utils.sh",
        component_args={
            # 10 s on: an event within seconds of the deferral gets the try failed (apache/airflow#72716).
            "args": ['echo "ckpt=$TORCHX_CHECKPOINT_DIR attempt=$TORCHX_ATTEMPT"; sleep 10'],
            "image": "busybox:local",  # the Batch rung's; the box runs in its own directory
            "gpu": 3,
            "memMB": 64,
        },
        checkpoint_root="s3://torchx-e2e/ckpt",
        deferrable=True,
        poll_interval=1,
    )
