"""Automatic retention of ended jobs' records: ``[torchx] retain_finished`` (a duration such
as ``30d``; empty, the default: keep every job).

When set, a task that submits a job of a scheduler with the ``prune`` capability (the
scheduler keeps its ended jobs' records) removes afterwards, through ``Scheduler.prune``, at
most once an hour per scheduler on this host (a stamp file per scheduler in the host's state
directory, shared by every process), that scheduler's jobs that ended longer ago than that, as
``airflow-torchx prune --older-than`` does: never a live job, never the task's own. A store
that cannot be written, or a bad value, is logged and never fails the task.
"""

from __future__ import annotations

import logging
import os
import urllib.parse
from typing import TYPE_CHECKING, Any

from airflow_provider_torchx._compat import conf
from airflow_provider_torchx.core.clock import SYSTEM_CLOCK, Clock
from airflow_provider_torchx.core.durations import parse_duration
from airflow_provider_torchx.core.errors import SchedulerSetupError
from airflow_provider_torchx.core.safefiles import makedirs_private
from airflow_provider_torchx.core.statedir import default_state_dir

if TYPE_CHECKING:
    from airflow_provider_torchx.core.runner import Runner

#: At most one prune per scheduler in this many seconds.
PRUNE_EVERY_S = 3600.0
#: The directory of the state dir holding one stamp file per scheduler: when it was last pruned.
STAMPS_DIR = "retention"


def stamp_path(scheduler: str) -> str:
    """The stamp file of ``scheduler``'s last prune (its name quoted: any registered name is
    one file of ``STAMPS_DIR``)."""
    return os.path.join(default_state_dir(), STAMPS_DIR, urllib.parse.quote(scheduler, safe="") + ".pruned")


def apply_retention(runner: Runner, scheduler: str, log: Any = None, *, clock: Clock = SYSTEM_CLOCK) -> int:
    """After a submit to ``scheduler``: prune its ended jobs if it has the ``prune`` capability,
    ``retain_finished`` is set and no process did in the last ``PRUNE_EVERY_S`` of ``clock``'s
    wall time; return how many jobs were removed."""
    log = log or logging.getLogger(__name__)
    setting = (conf.get("torchx", "retain_finished", fallback="") or "").strip()
    if not setting or not runner.capabilities(scheduler).prune:
        return 0
    try:
        older_than = parse_duration(setting, "[torchx] retain_finished")
        stamp = stamp_path(scheduler)
        now = clock.wall()
        try:
            if now - os.stat(stamp).st_mtime < PRUNE_EVERY_S:
                return 0
        except FileNotFoundError:
            makedirs_private(os.path.dirname(stamp))
        with open(stamp, "a"):
            os.utime(stamp, (now, now))
        pruned = runner.prune(scheduler, older_than)
    except (OSError, ValueError, SchedulerSetupError) as err:
        log.warning("TorchX retention (retain_finished=%s) skipped: %s", setting, err)
        return 0
    if pruned:
        freed = sum(size for _, size in pruned) / 1e6
        log.info("TorchX retention: removed %d job(s) that ended over %s ago (%.1f MB)", len(pruned), setting, freed)
    return len(pruned)
