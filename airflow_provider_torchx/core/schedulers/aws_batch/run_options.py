"""The run options of ``aws_batch``, declared apart from the scheduler so that a DAG's literal
cfg is checked when the DAG is parsed (entry point group ``airflow_provider_torchx.run_options``)
without importing the scheduler, boto3 or docker: this module imports only the core's
``runopts``."""

from __future__ import annotations

import getpass

from airflow_provider_torchx.core.runopts import runopts

#: The shortest ``timeout.attemptDurationSeconds`` AWS Batch takes.
MIN_ATTEMPT_TIMEOUT = 60


def run_opts() -> runopts:
    """The run options of ``aws_batch``."""
    opts = runopts()
    opts.add("queue", str, "Queue to schedule job in (name or ARN).", required=True)
    opts.add("region", str, "AWS region (default: AWS_DEFAULT_REGION, the profile's or the connection's).")
    opts.add("profile", str, "AWS profile of ~/.aws/config (default: AWS_PROFILE or boto3's default chain).")
    opts.add("user", str, "The username to tag the job with.", default=getpass.getuser())
    opts.add(
        "image_repo",
        str,
        "(remote jobs) the image repository to push workspace images to, must have push access. "
        "Ex: example.com/your/container",
    )
    opts.add("privileged", bool, "Run the containers privileged (docker run --privileged).", default=False)
    opts.add("share_id", str, "The share identifier for the job; set iff the queue has a scheduling policy.")
    opts.add(
        "priority",
        int,
        "Scheduling priority within share_id (0-9999, higher runs first); needs share_id (a fair-share queue).",
        default=0,
    )
    opts.add("job_role_arn", str, "IAM role ARN the containers can assume for AWS permissions.")
    opts.add(
        "execution_role_arn",
        str,
        "IAM role ARN the ECS agent can assume for AWS permissions (pulls images, writes logs); "
        "required with platform=FARGATE.",
    )
    opts.add("ulimits", list, "Ulimits as name:softLimit:hardLimit, comma separated (EC2 only).")
    opts.add("quiet", bool, "Suppress verbose output of image builds.", default=False)
    opts.add(
        "job_type",
        str,
        "auto: one role with one replica runs as a single-node job (type container; the only kind "
        "Spot and Fargate queues run), anything else as a multi-node parallel job; container; multinode.",
        default="auto",
    )
    opts.add("platform", str, "EC2 or FARGATE (single-node jobs only; needs execution_role_arn).", default="EC2")
    opts.add(
        "assign_public_ip",
        bool,
        "FARGATE only: give the task a public IP (to pull public images).",
        default=False,
    )
    opts.add(
        "retry_on",
        str,
        "any: retry any failure while attempts (1 + max_retries) remain; infra: retry only host "
        "terminations (Spot reclaims, status reason 'Host EC2*'), an application failure fails at once.",
        default="any",
    )
    opts.add(
        "shm_size",
        int,
        "Size of /dev/shm in MiB (EC2 only); default: the role's memory, as TorchX; 0: Docker's 64 MiB.",
    )
    opts.add(
        "attempt_timeout",
        int,
        f"Seconds each attempt may run (timeout.attemptDurationSeconds, at least {MIN_ATTEMPT_TIMEOUT}, "
        "AWS Batch's minimum); AWS Batch then stops it, a failed attempt that the retry strategy "
        "(max_retries, retry_on) may retry; default: no limit.",
        minimum=MIN_ATTEMPT_TIMEOUT,
    )
    opts.add(
        "check_queue",
        bool,
        "Before submitting, check that the queue and one of its compute environments can run the job "
        "(state, maxvCpus, the GPUs, memory and vCPUs of its instance types); False: submit unchecked.",
        default=True,
    )
    return opts
