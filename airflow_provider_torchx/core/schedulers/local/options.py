"""The local schedulers' run options, in a module of their own: cheap to import, so that a DAG
can be checked when it is parsed without loading the scheduler."""

from __future__ import annotations

from airflow_provider_torchx.core.guards import MAX_GPU_HOURS, START_TIMEOUT, add_guard_option
from airflow_provider_torchx.core.runopts import runopts

#: The shortest ``attempt_timeout`` (seconds) a local job takes.
MIN_ATTEMPT_TIMEOUT = 1


def run_opts() -> runopts:
    """The run options of ``local_cwd`` and ``local_dir``."""
    opts = runopts()
    opts.add(
        "log_dir",
        str,
        "Directory to write stdout/stderr log files of replicas (under <log_dir>/<app_id>/); "
        "default: the job's directory in the job store",
    )
    opts.add(
        "prepend_cwd",
        bool,
        "If set, prepends CWD to replica's PATH env var making binaries in CWD take precedence.",
        default=False,
    )
    opts.add(
        "auto_set_cuda_visible_devices",
        bool,
        "Sets CUDA_VISIBLE_DEVICES for roles that request GPU resources.",
        default=False,
    )
    opts.add(
        "allow_no_gpus",
        bool,
        "Run a job asking for GPUs on a host without any (its replicas then run without GPUs); "
        "by default such a job is refused at submission.",
        default=False,
    )
    opts.add(
        "attempt_timeout",
        int,
        "Seconds each attempt of a replica may run (from its start or restart); the supervisor then stops "
        "it (SIGTERM, SIGKILL after the grace period) as a failed attempt, restarted while max_retries allow, "
        "else the job is FAILED; default: no limit.",
        minimum=MIN_ATTEMPT_TIMEOUT,
    )
    add_guard_option(
        opts,
        START_TIMEOUT,
        "Seconds the job may wait for its GPUs from its submission; the supervisor then stops it, CANCELLED "
        "(TorchXRunOperator's start_timeout, held without a watcher); default: no limit.",
    )
    add_guard_option(
        opts,
        MAX_GPU_HOURS,
        "The job's GPU budget (its replicas' GPUs times their running time, every attempt); once over it, the "
        "supervisor stops the job, CANCELLED (TorchXRunOperator's max_gpu_hours, held without a watcher); "
        "default: no limit.",
    )
    return opts
