"""DAGs used only by the tests (copied into the test DAGs folder next to the examples)."""

from __future__ import annotations

import os
import sys
from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_provider_torchx.core.specs import AppDef, Role, macros
from airflow_provider_torchx.operators.torchx import TorchXRunOperator
from tests.fixtures import standin_torchrun

START = datetime(2024, 1, 1)


def sh_role(name: str, num_replicas: int, script: str) -> Role:
    return Role(name=name, image="local", entrypoint="sh", args=["-c", script], num_replicas=num_replicas)


#: Where a test puts the file that lets the replicas of ``torchx_test_lines`` write their last
#: line (unset: they do not wait); ``tests/airflow/test_dags.py`` creates it once the task has
#: logged a RUNNING progress line, so a loaded machine cannot end the job before any look.
LINES_GATE_ENV = "TORCHX_TEST_LINES_GATE"
#: Seconds a replica waits for the gate before writing its last line anyway.
LINES_GATE_WAIT = 60
WAIT_FOR_GATE = (
    f'if [ $i = 6 ] && [ -n "${LINES_GATE_ENV}" ]; then n=0; '
    f'while [ ! -e "${LINES_GATE_ENV}" ] && [ $n -lt {LINES_GATE_WAIT * 10} ]; do sleep 0.1; n=$((n+1)); done; fi'
)

#: Two roles of two replicas; each writes 6 numbered lines over ~1 s (several polls), the last
#: one only once the gate (``LINES_GATE_ENV``) opens.
LINES = AppDef(
    name="lines",
    roles=[
        sh_role(
            role,
            2,
            f"for i in 1 2 3 4 5 6; do {WAIT_FOR_GATE}; echo {role} {macros.replica_id} line $i; sleep 0.15; done",
        )
        for role in ("trainer", "reader")
    ],
)

with DAG(dag_id="torchx_test_lines", schedule=None, start_date=START, catchup=False):
    TorchXRunOperator(task_id="lines", app=LINES, scheduler="local_cwd", poll_interval=0.3)

with DAG(dag_id="torchx_test_fail", schedule=None, start_date=START, catchup=False):
    TorchXRunOperator(
        task_id="fail",
        component="utils.sh",
        component_args=["for i in $(seq 1 25); do echo out $i; done; exit 3"],
        scheduler="local_cwd",
        poll_interval=0.3,
    )

with DAG(dag_id="torchx_test_timeout", schedule=None, start_date=START, catchup=False):
    TorchXRunOperator(
        task_id="slow",
        component="utils.sh",
        component_args=["echo sleeping; sleep 60"],
        scheduler="local_cwd",
        poll_interval=0.3,
        timeout=2,
    )

#: A 2-rank job under the torchrun stand-in (``tests/fixtures/standin_torchrun.py``): rank 1 raises.
ROOT_CAUSE = AppDef(
    name="ddp",
    roles=[Role(name="trainer", image="local", entrypoint=sys.executable, args=[standin_torchrun.__file__, "2", "1"])],
)

with DAG(dag_id="torchx_test_root_cause", schedule=None, start_date=START, catchup=False):
    TorchXRunOperator(task_id="train", app=ROOT_CAUSE, scheduler="local_cwd", poll_interval=0.3)

with DAG(dag_id="torchx_test_config_error", schedule=None, start_date=START, catchup=False):
    TorchXRunOperator(
        task_id="misspelled",
        component="utils.echo",
        component_args=["--mgs", "{{ ds }}"],  # templated: checked when the task runs; a retry cannot fix it
        scheduler="local_cwd",
        retries=2,
        retry_delay=timedelta(0),
    )

#: A secret in a sensitive env var (Airflow's rule: the name holds ``api_key``).
SECRET = "wandb-0123456789-secret"

with DAG(dag_id="torchx_test_secret_dryrun", schedule=None, start_date=START, catchup=False):
    TorchXRunOperator(
        task_id="dryrun",
        component="utils.sh",
        component_args=["echo key $WANDB_API_KEY"],
        env={"WANDB_API_KEY": SECRET, "PLAIN_SETTING": "visible-value"},
        scheduler="local_cwd",
        dryrun=True,
    )

with DAG(dag_id="torchx_test_secret_fail", schedule=None, start_date=START, catchup=False):
    TorchXRunOperator(
        task_id="leak",
        component="utils.sh",
        component_args=["echo the key is $WANDB_API_KEY; exit 3"],
        env={"WANDB_API_KEY": SECRET},
        scheduler="local_cwd",
        poll_interval=0.3,
    )

with DAG(dag_id="torchx_test_secret_variable", schedule=None, start_date=START, catchup=False):
    TorchXRunOperator(
        task_id="dryrun",
        component="utils.sh",
        component_args=["echo hi"],
        env={"RUN_SETTING": "{{ var.value.torchx_test_token }}"},  # a plain name, a sensitive variable
        scheduler="local_cwd",
        dryrun=True,
    )

with DAG(dag_id="torchx_test_secret_connection", schedule=None, start_date=START, catchup=False):
    TorchXRunOperator(  # the way docs/operators.md gives to pass a secret: env from a connection
        task_id="dryrun",
        component="utils.sh",
        component_args=["python train.py"],
        env={"HF_TOKEN": "{{ conn.torchx_test_hf.password }}"},
        scheduler="local_cwd",
        dryrun=True,
    )

with DAG(dag_id="torchx_test_eks_dryrun", schedule=None, start_date=START, catchup=False):
    TorchXRunOperator(  # docs/schedulers.md's EKS dry run through a connection (its cfg names a service account)
        task_id="dryrun",
        torchx_conn_id="torchx_test_eks",
        component="utils.sh",
        component_args=["python train.py"],
        env={"HF_TOKEN": "{{ conn.torchx_test_hf.password }}"},
        dryrun=True,
    )

#: A job cancelled from outside its task, by the CLI, which the job itself runs.
CLI = os.path.join(os.path.dirname(sys.executable), "airflow-torchx")
CANCELS_ITSELF = f'echo cancelling; "{CLI}" cancel "$TORCHX_JOB_ID"; sleep 60'

with DAG(dag_id="torchx_test_outside_cancel", schedule=None, start_date=START, catchup=False):
    for task_id, deferrable, retry in (("worker", False, False), ("deferred", True, False), ("retried", False, True)):
        TorchXRunOperator(
            task_id=task_id,
            component="utils.sh",
            component_args=[CANCELS_ITSELF],
            scheduler="local_cwd",
            poll_interval=0.3,
            deferrable=deferrable,
            retry_after_outside_cancel=retry,
            retries=1,
            retry_delay=timedelta(0),
        )

#: Attempts 0 (the first job) and 1 (its local restart) each leave a checkpoint and fail; the
#: task's retry (attempt 2) must find the last one in the same place.
RESUMES = (
    'D="$TORCHX_CHECKPOINT_DIR"; A="$TORCHX_ATTEMPT"; echo "dir=$D attempt=$A"; '
    'if [ "$A" -lt 2 ]; then mkdir -p "$D"; echo $((A + 1)) > "$D/step"; exit 3; fi; '
    'echo "resumed from step $(cat "$D/step")"'
)

with DAG(dag_id="torchx_test_resume", schedule=None, start_date=START, catchup=False):
    TorchXRunOperator(
        task_id="resume",
        app=AppDef(
            name="resume", roles=[Role(name="sh", image="local", entrypoint="sh", args=["-c", RESUMES], max_retries=1)]
        ),
        scheduler="local_cwd",
        poll_interval=0.3,
        retries=1,
        retry_delay=timedelta(0),
    )
