"""The ``slurm`` scheduler's run options, in a module of their own: cheap to import, so that a
DAG's literal cfg is checked when it is parsed without loading the scheduler.

Names as TorchX's own ``slurm`` scheduler has them (``partition``, ``account``, ``qos``,
``time``, ``constraint``, ``comment``, ``mail-user``, ``mail-type``, ``job_dir``), plus
``exclusive``. ``time`` takes Slurm's formats and is checked here, as ``job_dir`` (absolute).

``attempt_timeout`` (seconds) and the guard ``max_gpu_hours`` (``core/guards.py``, handed over
by the task) become the job's ``--time`` (``time_limit``), so that Slurm itself stops a run
that outlives them, with nobody watching: it ends TIMEOUT (failure kind ``timeout``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from airflow_provider_torchx.core.errors import InvalidRunConfigError, shown
from airflow_provider_torchx.core.guards import ATTEMPT_TIMEOUT, MAX_GPU_HOURS, add_guard_option, budget_seconds
from airflow_provider_torchx.core.runopts import CfgVal, runopts

#: Slurm's ``--time`` formats: ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S``.
TIME_FORMATS = "minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"
_TIME = re.compile(
    r"^(?:(?P<d>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?|(?P<a>\d+)(?::(?P<b>\d+)(?::(?P<c>\d+))?)?)$"
)
#: ``mail-type`` values Slurm takes (comma-separated).
MAIL_TYPES = (
    "NONE",
    "BEGIN",
    "END",
    "FAIL",
    "REQUEUE",
    "ALL",
    "INVALID_DEPEND",
    "STAGE_OUT",
    "TIME_LIMIT",
    "TIME_LIMIT_90",
    "TIME_LIMIT_80",
    "TIME_LIMIT_50",
    "ARRAY_TASKS",
)


def time_minutes(value: str) -> float:
    """Slurm's ``--time`` ``value`` in minutes; ``ValueError`` for anything Slurm would refuse
    (``UNLIMITED`` and ``INFINITE`` are infinity)."""
    text = value.strip()
    if text.upper() in ("UNLIMITED", "INFINITE"):
        return float("inf")
    m = _TIME.match(text)
    if m is None:
        raise ValueError(text)
    g = {k: int(v) for k, v in m.groupdict().items() if v is not None}
    if "d" in g:
        return g["d"] * 1440 + g["dh"] * 60 + g.get("dm", 0) + g.get("ds", 0) / 60
    if "c" in g:  # H:M:S
        return g["a"] * 60 + g["b"] + g["c"] / 60
    return g["a"] + g.get("b", 0) / 60  # M or M:S


def time_limit(gpus: int, cfg: Mapping[str, Any]) -> tuple[str, str] | None:
    """The job's ``--time`` (Slurm's format) and the setting it comes from (``name=value``),
    for a job holding ``gpus`` GPUs in all; None: no limit of ours (the partition's default).

    ``attempt_timeout`` and ``max_gpu_hours`` give a limit by ``guards.budget_seconds`` (each
    run within the GPU budget alone; never longer than ``attempt_timeout``), in whole minutes
    rounded up, as Slurm counts time limits. With ``time`` set as well, the shorter wins: each
    is a limit someone asked for, ``time`` the user's own for Slurm, the guards the task's
    promise to stop the job, and a job must keep both; a longer ``time`` must not loosen a
    guard, and a shorter one is what Slurm would hold the job to anyway."""
    timeout, budget = cfg.get(ATTEMPT_TIMEOUT), cfg.get(MAX_GPU_HOURS)
    seconds = budget_seconds(
        float(budget) if budget is not None else None, gpus, int(timeout) if timeout is not None else None
    )
    given = str(cfg["time"]) if cfg.get("time") else None
    if seconds is None or (given is not None and time_minutes(given) * 60 <= seconds):
        return None if given is None else (given, f"time={given!r}")
    source = ATTEMPT_TIMEOUT if timeout is not None and int(timeout) == seconds else MAX_GPU_HOURS
    return str(math.ceil(seconds / 60)), f"{source}={cfg[source]}"


def _check_time(value: CfgVal) -> None:
    try:
        time_minutes(str(value))
    except ValueError:
        raise InvalidRunConfigError(f"cfg: time={shown(value)} is not a Slurm time limit; use {TIME_FORMATS}") from None


def _check_job_dir(value: CfgVal) -> None:
    if not str(value).startswith("/"):
        raise InvalidRunConfigError(
            f"cfg: job_dir={shown(value)} is not an absolute path; give a directory on a file system "
            "this host and the Slurm nodes share"
        )


def _check_mail_type(value: CfgVal) -> None:
    bad = [t for t in str(value).split(",") if t.strip().upper() not in MAIL_TYPES]
    if bad:
        raise InvalidRunConfigError(
            f"cfg: mail-type={shown(value)} has {', '.join(map(repr, bad))}; use a comma-separated list of "
            + ", ".join(MAIL_TYPES)
        )


def run_opts() -> runopts:
    """The run options of ``slurm``."""
    opts = runopts()
    opts.add("partition", str, "The partition to run the job in (default: the cluster's default partition)")
    opts.add("account", str, "The account to charge the job to")
    opts.add("qos", str, "The quality of service of the job")
    opts.add("time", str, f"The job's time limit ({TIME_FORMATS}); default: the partition's", check=_check_time)
    opts.add("constraint", str, "Node features the job needs (sbatch --constraint)")
    opts.add("comment", str, "A comment shown with the job (kept beside the job's identity labels)")
    opts.add("mail-user", str, "Who Slurm mails about the job")
    opts.add("mail-type", str, "When Slurm mails (e.g. END,FAIL)", check=_check_mail_type)
    opts.add(
        "job_dir",
        str,
        "An absolute directory on a file system this host and the Slurm nodes share: each job keeps its "
        "script, record and replicas' logs in <job_dir>/<job id>",
        required=True,
        check=_check_job_dir,
    )
    opts.add("exclusive", bool, "Take whole nodes (sbatch --exclusive)", default=False)
    opts.add(
        ATTEMPT_TIMEOUT,
        int,
        "Seconds each run of the job may take (its first, and each after a requeue): the job's --time, in "
        "whole minutes rounded up; Slurm then stops it, TIMEOUT; with time also set, the shorter wins; "
        "default: no limit.",
        minimum=1,
    )
    add_guard_option(
        opts,
        MAX_GPU_HOURS,
        "The job's GPU budget (TorchXRunOperator's max_gpu_hours, held without a watcher): the job's --time is "
        "at most the budget over the GPUs it holds (never longer than attempt_timeout or time); default: no "
        "budget.",
    )
    return opts
