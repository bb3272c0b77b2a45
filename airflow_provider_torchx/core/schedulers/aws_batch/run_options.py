"""The run options of ``aws_batch``, declared apart from the scheduler so that a DAG's literal
cfg is checked when the DAG is parsed (entry point group ``airflow_provider_torchx.run_options``)
without importing the scheduler, boto3 or docker: this module imports only the core's
``runopts``."""

from __future__ import annotations

import getpass
import re

from airflow_provider_torchx.core.errors import InvalidRunConfigError
from airflow_provider_torchx.core.guards import MAX_GPU_HOURS, START_TIMEOUT, add_guard_option
from airflow_provider_torchx.core.runopts import CfgVal, runopts

#: The shortest ``timeout.attemptDurationSeconds`` AWS Batch takes.
MIN_ATTEMPT_TIMEOUT = 60

#: A consumable resource's name (AWS Batch API reference, ``CreateConsumableResource``) or ARN.
_CONSUMABLE_NAME = re.compile(
    r"[A-Za-z0-9_-]{1,128}|arn:aws[a-z-]*:batch:[a-z0-9-]+:\d{12}:consumable-resource/[A-Za-z0-9_-]{1,128}"
)
#: The largest quantity a job may ask of one consumable resource (the API's ``quantity`` is a
#: long; a resource holds at most this many units).
MAX_CONSUMABLE_QUANTITY = 2**31 - 1
#: A Kubernetes namespace AWS Batch places pods in (``EksMetadata.namespace``).
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
#: A CloudWatch Logs log group name that a job tag's value can hold (no ``#``).
_LOG_GROUP = re.compile(r"[A-Za-z0-9._/-]{1,256}")
#: A Kubernetes service account name (a DNS subdomain).
_SERVICE_ACCOUNT = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


def parse_consumables(value: CfgVal) -> list[tuple[str, int]]:
    """``["license-a:2", ...]`` (or the string ``"license-a:2,..."``) -> ``[(name or ARN,
    quantity)]``; a bad entry raises naming it and what is allowed."""
    items = value.split(",") if isinstance(value, str) else list(value or [])  # type: ignore[arg-type]
    form = "name:quantity, e.g. consumable_resources=my-license:2,other:1"
    out: list[tuple[str, int]] = []
    for item in (str(i).strip() for i in items):
        name, sep, quantity = item.rpartition(":")
        if not sep or not name:
            raise InvalidRunConfigError(f"cfg: consumable_resources entry {item!r} is not {form}")
        if not _CONSUMABLE_NAME.fullmatch(name):
            raise InvalidRunConfigError(
                f"cfg: consumable_resources entry {item!r} names {name!r}, which is not a consumable resource "
                "name (1-128 letters, digits, '-', '_') or ARN (arn:aws:batch:REGION:ACCOUNT:consumable-resource/NAME)"
            )
        if not quantity.isdigit() or not 1 <= int(quantity) <= MAX_CONSUMABLE_QUANTITY:
            raise InvalidRunConfigError(
                f"cfg: consumable_resources entry {item!r} asks for quantity {quantity!r}; "
                f"give a whole number from 1 to {MAX_CONSUMABLE_QUANTITY} ({form})"
            )
        if name in (n for n, _ in out):
            raise InvalidRunConfigError(f"cfg: consumable_resources names {name!r} twice; give each resource once")
        out.append((name, int(quantity)))
    return out


def check_namespace(value: CfgVal) -> None:
    """A Kubernetes namespace AWS Batch accepts for its pods, else ``InvalidRunConfigError``."""
    text = str(value)
    if value is not None and (not _NAMESPACE.fullmatch(text) or text == "default" or text.startswith("kube")):
        raise InvalidRunConfigError(
            f"cfg: namespace={value!r} is not a namespace AWS Batch places pods in: 1-63 lower-case letters, digits "
            "and '-', starting and ending with a letter or digit, not 'default', not starting with 'kube'"
        )


def check_service_account(value: CfgVal) -> None:
    """A Kubernetes service account name, else ``InvalidRunConfigError``."""
    if value is not None and not _SERVICE_ACCOUNT.fullmatch(str(value)):
        raise InvalidRunConfigError(
            f"cfg: service_account={value!r} is not a Kubernetes service account name: up to 253 lower-case "
            "letters, digits, '-' and '.', starting and ending with a letter or digit"
        )


def check_log_group(value: CfgVal) -> None:
    """A CloudWatch Logs log group name (kept in a job tag), else ``InvalidRunConfigError``."""
    if value is not None and not _LOG_GROUP.fullmatch(str(value)):
        raise InvalidRunConfigError(
            f"cfg: eks_log_group={value!r} is not a log group name this scheduler can keep: 1-256 letters, digits, "
            "'.', '-', '_' and '/', e.g. /aws/containerinsights/CLUSTER/application"
        )


def check_platform(value: CfgVal) -> None:
    """One of ``PLATFORMS`` (any case), else ``InvalidRunConfigError``."""
    if value not in (None, "") and str(value).strip().upper() not in PLATFORMS:
        raise InvalidRunConfigError(f"cfg: platform={value!r} is not one of: {', '.join(PLATFORMS)}")


#: The platforms a job is rendered for (``options.resolve``).
PLATFORMS = ("EC2", "FARGATE", "EKS")


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
    opts.add(
        "platform",
        str,
        "EC2, FARGATE (single-node jobs only; needs execution_role_arn) or EKS (pods on a queue of EKS compute "
        "environments); default: EKS when namespace or service_account is set, else EKS for a queue whose compute "
        "environments are EKS (looked up at submit), else EC2.",
        check=check_platform,
    )
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
        "Size of /dev/shm in MiB (EC2 and EKS); default: the role's memory, as TorchX; 0: Docker's 64 MiB "
        "(EKS: no /dev/shm volume).",
    )
    opts.add(
        "attempt_timeout",
        int,
        f"Seconds each attempt may run (timeout.attemptDurationSeconds, at least {MIN_ATTEMPT_TIMEOUT}, "
        "AWS Batch's minimum); AWS Batch then stops it, a failed attempt that the retry strategy "
        "(max_retries, retry_on) may retry; default: no limit.",
        minimum=MIN_ATTEMPT_TIMEOUT,
    )
    add_guard_option(
        opts,
        MAX_GPU_HOURS,
        "The job's GPU budget (TorchXRunOperator's max_gpu_hours, held without a watcher): each attempt's "
        "timeout.attemptDurationSeconds is at most the budget over the GPUs the job reserves (at least "
        f"{MIN_ATTEMPT_TIMEOUT}, and never longer than attempt_timeout); default: no budget.",
    )
    add_guard_option(
        opts,
        START_TIMEOUT,
        "Seconds the job may take from its submission until it runs (TorchXRunOperator's start_timeout): "
        "tagged on the job, so that the deployment's reaper cancels it past that with nobody watching; "
        "default: no limit.",
    )
    opts.add(
        "check_queue",
        bool,
        "Before submitting, check that the queue and one of its compute environments can run the job "
        "(state, maxvCpus, the GPUs, memory and vCPUs of its instance types); False: submit unchecked.",
        default=True,
    )
    opts.add(
        "namespace",
        str,
        "EKS only: the Kubernetes namespace of the job's pods (default: the compute environment's).",
        check=check_namespace,
    )
    opts.add(
        "service_account",
        str,
        "EKS only: the Kubernetes service account the pods run as (their AWS role, through IRSA or EKS Pod "
        "Identity; EKS's job_role_arn).",
        check=check_service_account,
    )
    opts.add(
        "eks_log_group",
        str,
        "EKS only: the CloudWatch Logs log group the cluster's Fluent Bit writes the pods' output to, as Container "
        "Insights names its streams (default: /aws/containerinsights/CLUSTER/application of the job's EKS cluster).",
        check=check_log_group,
    )
    opts.add(
        "consumable_resources",
        list,
        "Consumable resources the job holds while it runs (licences, shared limits), as name:quantity, comma "
        "separated; names or ARNs of the account's consumable resources.",
        check=parse_consumables,
    )
    return opts
