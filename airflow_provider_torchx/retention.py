"""Automatic retention of the local job store: ``[torchx] retain_finished`` (a duration such
as ``30d``; empty, the default: keep every job).

When set, a task that submits a job of a scheduler whose jobs live in the local store (the
``local_store`` capability: ``local_cwd``, ``local_dir``) removes afterwards, at most once an hour per store
(a stamp file, ``.pruned``, shared by every process), the jobs that ended longer ago than
that, as ``airflow-torchx prune --older-than`` does: never a live job, never the task's own.
A store that cannot be written, or a bad value, is logged and never fails the task.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from airflow_provider_torchx._compat import conf
from airflow_provider_torchx.core.clock import SYSTEM_CLOCK, Clock
from airflow_provider_torchx.core.durations import parse_duration

if TYPE_CHECKING:
    from airflow_provider_torchx.core.runner import Runner

#: At most one prune per store in this many seconds.
PRUNE_EVERY_S = 3600.0
_STAMP = ".pruned"


def apply_retention(runner: Runner, scheduler: str, log: Any = None, *, clock: Clock = SYSTEM_CLOCK) -> int:
    """After a submit to ``scheduler``: prune the local store if the scheduler's jobs live
    there (``local_store``), ``retain_finished`` is set and no process did in the last
    ``PRUNE_EVERY_S`` of ``clock``'s wall time; return how many jobs were removed."""
    log = log or logging.getLogger(__name__)
    setting = (conf.get("torchx", "retain_finished", fallback="") or "").strip()
    if not setting or not runner.capabilities(scheduler).local_store:
        return 0
    from airflow_provider_torchx.core.schedulers.local.scheduler import create_cwd_scheduler

    try:
        older_than = parse_duration(setting, "[torchx] retain_finished")
        sched = create_cwd_scheduler("torchx")
        stamp = os.path.join(sched.store.root, _STAMP)
        now = clock.wall()
        try:
            if now - os.stat(stamp).st_mtime < PRUNE_EVERY_S:
                return 0
        except FileNotFoundError:
            pass
        with open(stamp, "a"):
            os.utime(stamp, (now, now))
        pruned = sched.prune(older_than)
    except (OSError, ValueError) as err:
        log.warning("TorchX retention (retain_finished=%s) skipped: %s", setting, err)
        return 0
    if pruned:
        freed = sum(size for _, size in pruned) / 1e6
        log.info("TorchX retention: removed %d job(s) that ended over %s ago (%.1f MB)", len(pruned), setting, freed)
    return len(pruned)
