"""``SlurmScheduler``: each app is one Slurm batch job (a heterogeneous job when it has several
roles), submitted with ``sbatch`` from this host, its script, record and replicas' logs under
``<job_dir>/<job id>/`` on a file system this host and the nodes share.

It composes: the run options (``options.py``), the sbatch script (``render.py``), Slurm's
commands (``commands.py``), the partition preflight (``preflight.py``), the job's record
(``record.py``), the description rules (``status.py``) and the shared status poller
(``poller.py``). Logs are the replicas' own files, read with the local scheduler's resumable
readers (``local/logs.py``: byte-offset cursors, reads that stay inside the job's directory).
"""

from __future__ import annotations

import builtins
import concurrent.futures
import contextlib
import os
import shutil
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from airflow_provider_torchx.core.checkpoints import CHECKPOINT_DIR_ENV
from airflow_provider_torchx.core.clock import SYSTEM_CLOCK, Clock
from airflow_provider_torchx.core.errorfile import ERROR_FILE_NAME, RANK_LOGS_NAME
from airflow_provider_torchx.core.errors import InvalidRunConfigError, StoreError, UnknownAppError
from airflow_provider_torchx.core.runopts import Cfg, CfgVal, runopts
from airflow_provider_torchx.core.safefiles import disk_usage
from airflow_provider_torchx.core.schedulers.api import (
    CancelledBy,
    DescribeAppResponse,
    ListAppResponse,
    LogChunk,
    Scheduler,
    SchedulerCapabilities,
    Stream,
    filter_regex,
    labels_match,
    newest,
)
from airflow_provider_torchx.core.schedulers.local import logs
from airflow_provider_torchx.core.schedulers.slurm import options, preflight, record, render, status
from airflow_provider_torchx.core.schedulers.slurm.commands import SlurmCommandError, SlurmCommands
from airflow_provider_torchx.core.schedulers.slurm.poller import Entries, SqueuePoller
from airflow_provider_torchx.core.schedulers.slurm.render import SlurmRequest
from airflow_provider_torchx.core.specs import AppDef, AppDryRunInfo

if TYPE_CHECKING:
    from airflow_provider_torchx.core.checkpoint_prune import Use as CheckpointUse

BACKEND = "slurm"
#: How old (seconds) a ``squeue`` snapshot log reads may use is.
SNAPSHOT_AGE = 1.0
R = TypeVar("R")


class SlurmScheduler(Scheduler[SlurmRequest]):
    """Runs apps as Slurm jobs through Slurm's client commands (see the module docstring)."""

    capabilities = SchedulerCapabilities(error_files=True, separate_stderr=True, prune=True, shared_paths=True)

    def __init__(
        self,
        session_name: str,
        commands: SlurmCommands | None = None,
        index: record.JobIndex | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        super().__init__(BACKEND, session_name)
        self.commands = commands or SlurmCommands()
        self.index = index or record.JobIndex()
        self.clock = clock
        self.poller = SqueuePoller(self._entries, _ended, clock)
        self._snapshot: tuple[float, Entries] = (float("-inf"), {})

    # ------------------------------------------------------------------ submit

    def _run_opts(self) -> runopts:
        return options.run_opts()

    def _validate(self, app: AppDef, scheduler: str, cfg: dict[str, CfgVal]) -> None:
        render.validate(app)

    def _submit_dryrun(
        self, app: AppDef, cfg: dict[str, CfgVal], labels: dict[str, str]
    ) -> AppDryRunInfo[SlurmRequest]:
        return AppDryRunInfo(render.render(app, cfg, labels), str)

    def preflight(self, request: SlurmRequest, cfg: Mapping[str, CfgVal]) -> str:
        """Check, before submitting, that the job fits its partition (``preflight.check_fit``),
        then that its directory can be made and written here (a job that does not fit leaves
        no directory behind); return the partition's name. A guard's time limit over the
        partition's ``MaxTime`` is lowered to it in ``request`` (``preflight.fit_time``)."""
        partitions = self.commands.show("partition")
        partition = preflight.check_fit(request.roles, cfg, partitions, self.commands.show("node"))
        part = preflight.pick_partition(cfg, partitions)
        request.script = preflight.fit_time(request.script, request.roles, cfg, part)
        try:
            os.makedirs(request.job_dir, exist_ok=True)
            writable = os.access(request.job_dir, os.W_OK | os.X_OK)
        except OSError as err:
            raise InvalidRunConfigError(f"cfg: job_dir={request.job_dir!r} cannot be made: {err.strerror}") from None
        if not writable:
            raise InvalidRunConfigError(f"cfg: job_dir={request.job_dir!r} is not writable by this host's user")
        return partition

    def schedule(self, dryrun_info: AppDryRunInfo[SlurmRequest]) -> str:
        """Check the job fits (``preflight``), submit it with ``sbatch --parsable`` and write
        its record (``record.py``). A refusal by ``sbatch`` is an ``InvalidRunConfigError``
        with Slurm's words."""
        req = dryrun_info.request
        self.preflight(req, dryrun_info.cfg)
        try:
            job_id = self.commands.sbatch(req.args, req.script)
        except SlurmCommandError as err:
            raise InvalidRunConfigError(f"sbatch refused the job: {err}") from None
        directory = os.path.join(req.job_dir, job_id)
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, record.SCRIPT_FILE), "w") as f:
            f.write(req.script)
        record.write_json(
            os.path.join(directory, record.JOB_FILE),
            {
                "name": req.name,
                "roles": req.roles,
                "labels": dryrun_info.labels,
                "cfg": dryrun_info.cfg,
                "args": req.args,
                "submitted": time.time(),
            },
        )
        self.index.add(job_id, directory)
        return job_id

    def test_only(self, dryrun_info: AppDryRunInfo[SlurmRequest]) -> str:
        """Slurm's own check of a dry run (``sbatch --test-only``): where and when it would
        start; nothing is submitted. ``SlurmCommandError`` with Slurm's words if refused."""
        return self.commands.sbatch(dryrun_info.request.args, dryrun_info.request.script, test_only=True)

    def check_settings(self, cfg: Mapping[str, CfgVal]) -> str:
        """The partition of ``cfg`` exists and is UP."""
        resolved = self.run_opts().resolve(cfg)
        part = preflight.pick_partition(resolved, self.commands.show("partition"))
        name = part.get("PartitionName", "")
        preflight.check_fit([], resolved, [part], [])
        return f"Slurm partition {name!r} is UP (MaxTime {part.get('MaxTime')}, nodes {part.get('Nodes')})"

    # ------------------------------------------------------------------ observe

    def _entries(self, watched: Collection[str] = ()) -> dict[str, Mapping[str, Any]]:
        """Every job Slurm knows, by app id (one ``squeue`` call), and, where the cluster keeps
        accounting, what it keeps of the ``watched`` jobs the controller forgot (one ``sacct``
        call for all of them: ``status.sacct_entry``); kept as the snapshot that reads within
        ``SNAPSHOT_AGE`` seconds use."""
        entries = status.index_jobs(self.commands.squeue())
        self._add_kept(entries, watched)
        self._snapshot = (self.clock.monotonic(), entries)
        return entries

    def _add_kept(self, entries: dict[str, Mapping[str, Any]], ids: Collection[str]) -> None:
        """Add to ``entries`` what accounting keeps of the ``ids`` they lack (one ``sacct`` call
        for all of them; none on a cluster without accounting)."""
        forgotten = sorted(app_id for app_id in ids if app_id.isdigit() and app_id not in entries)
        kept = self.commands.sacct(forgotten) if forgotten else None
        if kept:
            known = status.index_jobs(status.sacct_entry(job) for job in kept)
            entries.update((app_id, known[app_id]) for app_id in forgotten if app_id in known)

    def _recent_entries(self) -> Entries:
        """The snapshot if it is at most ``SNAPSHOT_AGE`` seconds old, else a new one: log reads
        and tails (many per round) cost no ``squeue`` call of their own."""
        at, entries = self._snapshot
        return entries if self.clock.monotonic() - at <= SNAPSHOT_AGE else self._entries()

    def _lookup(self, app_id: str, entries: Entries) -> tuple[record.JobRecord | None, Mapping[str, Any] | None]:
        """The job's record and Slurm's entry for it (None: no record; not ours, or unknown)."""
        if not app_id.isdigit():
            return None, None
        entry = entries.get(app_id)
        if entry is not None and render.parse_comment(str(entry.get("comment", ""))) is None:
            entry = None  # not a job of ours
        directory = self._directory(app_id, entry)
        return status.current(record.read(app_id, directory) if directory else None, entry), entry

    def _directory(self, app_id: str, entry: Mapping[str, Any] | None) -> str | None:
        """Where job ``app_id`` keeps its record: this host's index, else what Slurm says of
        one of our jobs (its working directory is ``job_dir``), remembered for later."""
        known = self.index.get(app_id)
        if known is not None or entry is None:
            return known
        cwd = str(entry.get("current_working_directory") or "")
        if not cwd.startswith("/"):
            return None
        directory = os.path.join(cwd, app_id)
        self.index.add(app_id, directory)
        return directory

    def _describe_from(self, app_id: str, entries: Entries) -> DescribeAppResponse | None:
        return status.describe(app_id, *self._lookup(app_id, entries))

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        """One ``squeue`` call (and one ``sacct`` once the controller forgot the job, where the
        cluster keeps accounting), and the job's record (all there is once Slurm forgot it and
        without accounting). No call when the snapshot of the last ``SNAPSHOT_AGE`` seconds
        shows the job ended: an ended job's entry no longer changes, and every watcher the
        poller's round told of an end describes its job once more (``TaskWatcher.failure``):
        a thousand jobs ending together cost no thousand calls."""
        if not app_id.isdigit():
            return None
        at, entries = self._snapshot
        fresh = self.clock.monotonic() - at <= SNAPSHOT_AGE
        if not (fresh and app_id in entries and _ended(entries[app_id])):
            entries = self._entries([app_id])
        return self._describe_from(app_id, entries)

    def describe_future_as(
        self, app_id: str, then: Callable[[DescribeAppResponse | None], R], period: float | None = None
    ) -> concurrent.futures.Future[R] | None:
        """Answered by the shared poller's next round (``poller.py``): one ``squeue`` call for
        every job watched through this scheduler."""
        if not app_id.isdigit():
            return None

        def answer(entries: Entries | BaseException) -> R:
            if isinstance(entries, BaseException):
                raise entries
            return then(self._describe_from(app_id, entries))

        return self.poller.look(app_id, answer, period)

    def describe_native(self, app_id: str) -> AppDryRunInfo[SlurmRequest] | None:
        """The ``sbatch`` request read back from the job's directory (None: no record)."""
        rec, _ = self._lookup(app_id, self._recent_entries())
        text = record.script(rec.directory) if rec is not None else None
        if rec is None or text is None:
            return None
        job_dir = str(rec.cfg.get("job_dir") or os.path.dirname(rec.directory))
        request = SlurmRequest(job_dir=job_dir, args=rec.args, script=text, name=rec.name, roles=rec.roles)
        return AppDryRunInfo(request, str)

    def wait_reason(self, app_id: str) -> str:
        """Slurm's reason for a pending job (``Resources``, ``Priority``, a QOS limit ...)."""
        entry = self._entries().get(app_id)
        if entry is None or status.slurm_state(entry) != "PENDING":
            return ""
        return f"Slurm's reason: {entry.get('state_reason') or 'none given'}"

    def list(
        self, cfg: Cfg | None = None, labels: Mapping[str, str] | None = None, *, limit: int | None = None
    ) -> builtins.list[ListAppResponse]:
        """Our jobs Slurm knows (one ``squeue`` call) and those this host recorded; where the
        cluster keeps accounting, one ``sacct`` call for the recorded jobs the controller forgot
        whose record shows no end (a time limit, a node failure, a cancel outside
        airflow-torchx): accounting's state is theirs, as ``describe`` gives it."""
        entries = dict(self._entries())
        ids = {app_id for app_id, e in entries.items() if render.parse_comment(str(e.get("comment", ""))) is not None}
        ids.update(app_id for app_id, _ in self.index.items())
        looked = {app_id: self._lookup(app_id, entries) for app_id in ids}
        unsettled = [
            app_id
            for app_id, (rec, _) in looked.items()
            if app_id not in entries and (rec is None or (rec.ended is None and rec.cancel is None))
        ]
        if unsettled:
            self._add_kept(entries, unsettled)
            looked.update((app_id, self._lookup(app_id, entries)) for app_id in unsettled)
        out = []
        for app_id, (rec, entry) in looked.items():
            desc = status.describe(app_id, rec, entry)
            if desc is not None and labels_match(desc.labels, labels):
                out.append(status.listed(desc, rec, entry))
        return newest(out, limit)

    # ------------------------------------------------------------------ logs

    def _replica_log(
        self, app_id: str, role_name: str, k: int, streams: Stream | None
    ) -> tuple[record.JobRecord, str, str]:
        """The job's record and the replica's log (stream name, path); ``UnknownAppError``
        without a record, ``ValueError`` for an unknown role or replica."""
        directory = self.index.get(app_id) if app_id.isdigit() else None
        rec = record.read(app_id, directory) if directory else None
        if rec is None:
            rec, _ = self._lookup(app_id, self._recent_entries())
        if rec is None:
            raise UnknownAppError(f"app_id: no app {app_id!r} on {self.backend}")
        counts = {r["name"]: [None] * int(r.get("num_replicas", 0)) for r in rec.roles}
        stream, path = logs.replica_log(rec.app_id, rec.directory, counts, role_name, k, streams)
        return rec, stream, path

    def _log_final(self, app_id: str, role_name: str, k: int) -> bool:
        """Whether the replica's logs are complete: it wrote its exit code (after its logs), or
        the batch script ended, or Slurm says the job ended (the snapshot). A requeued job's
        earlier run's ends do not count (``status.current``, against the snapshot): its next
        run writes on."""
        rec, entry = self._lookup(app_id, self._recent_entries())
        if rec is not None and ((role_name, k) in rec.exits or rec.ended is not None):
            return True
        desc = status.describe(app_id, rec, entry)
        return desc is None or desc.state.is_terminal()

    def read_log(
        self,
        app_id: str,
        role_name: str,
        k: int = 0,
        cursor: str | None = None,
        streams: Stream | None = None,
        max_lines: int | None = None,
    ) -> LogChunk:
        """Whole lines of the replica's file from the cursor's byte offset (``local/logs.py``);
        ``eof`` once its logs are complete (``_log_final``) and everything was read."""
        rec, stream, path = self._replica_log(app_id, role_name, k, streams)
        offset = logs.cursor_offset(cursor, stream)
        final = self._log_final(rec.app_id, role_name, k)
        lines, nxt, more = logs.read_lines(path, offset, final, max_lines, root=rec.directory)
        return LogChunk(lines=lines, cursor=logs.cursor_at(stream, nxt), eof=final and not more)

    def log_iter(
        self,
        app_id: str,
        role_name: str,
        k: int = 0,
        regex: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        should_tail: bool = False,
        streams: Stream | None = None,
    ) -> Iterable[str]:
        rec, _, path = self._replica_log(app_id, role_name, k, streams)
        lines = logs.LogIterator(app_id, path, self, should_tail, root=rec.directory)
        return filter_regex(regex, lines)

    def read_error_file(self, app_id: str, role_name: str, k: int) -> tuple[str, float] | None:
        """The replica's ``TORCHELASTIC_ERROR_FILE``, in its directory under ``job_dir``."""
        directory = self.index.get(app_id)
        if directory is None:
            return None
        path = os.path.join(directory, role_name, str(k), ERROR_FILE_NAME)
        fd = logs.open_log(path, directory)
        if fd is None:
            return None
        with open(fd, "rb") as f:
            return f.read(record.MAX_RECORD_BYTES).decode("utf-8", "replace"), os.fstat(f.fileno()).st_mtime

    def rank_stderr(self, app_id: str, role_name: str, k: int, local_rank: int, n: int) -> builtins.list[str] | None:
        """The last ``n`` lines of torchrun's file of ``local_rank`` below the replica's directory."""
        directory = self.index.get(app_id)
        if directory is None:
            return None
        path = logs.rank_log(os.path.join(directory, role_name, str(k), RANK_LOGS_NAME), local_rank)
        return None if path is None else logs.tail_lines(path, n, root=directory)

    # ------------------------------------------------------------------ stop

    def _cancel_existing(self, app_id: str, reason: str | None, by: CancelledBy | None) -> None:
        """Record who and why (``cancel.json``), then ``scancel`` the job (all its components)."""
        directory = self.index.get(app_id)
        if directory is not None:
            record.write_json(
                os.path.join(directory, record.CANCEL_FILE),
                {"reason": reason, "by": by.value if by else None, "at": time.time()},
            )
        self.commands.scancel(app_id)

    def _delete_existing(self, app_id: str) -> None:
        """Remove the job's directory and this host's index entry."""
        directory = self.index.get(app_id)
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)
        self.index.remove(app_id)

    # ------------------------------------------------------------------ keep

    def _recorded(self) -> builtins.list[tuple[ListAppResponse, record.JobRecord]]:
        """The jobs this host recorded (its index) whose directory still holds their record,
        each as ``list`` gives it: what ``prune`` and ``checkpoint_uses`` judge. A directory
        without a readable ``job.json`` is never taken for a job's."""
        recorded = {}
        for app_id, directory in self.index.items():
            rec = record.read(app_id, directory)
            if rec is not None:
                recorded[app_id] = rec
        if not recorded:  # a host that never submitted to Slurm asks Slurm nothing
            return []
        return [(app, recorded[app.app_id]) for app in self.list() if app.app_id in recorded]

    def prune(
        self, older_than: float, states: Iterable[str] = (), dry_run: bool = False
    ) -> builtins.list[tuple[str, int]]:
        """Remove the directories under ``job_dir`` (and this host's index entries) of the jobs
        that ended, by Slurm's word or their record's, more than ``older_than`` seconds ago
        (``Scheduler.prune``). A job Slurm still holds, or whose end is not known, stays.
        ``StoreError`` when a directory cannot be removed."""
        cutoff = self.clock.wall() - older_than
        wanted = {s.upper() for s in states}
        ended = sorted(
            (app.ended, app.app_id, rec.directory)
            for app, rec in self._recorded()
            if app.state.is_terminal()
            and app.ended is not None
            and app.ended <= cutoff
            and (not wanted or app.state.name in wanted)
        )
        pruned = []
        for _, app_id, directory in ended:
            output = os.path.join(os.path.dirname(directory), render.BATCH_OUTPUT.replace("%j", app_id))
            pruned.append((app_id, disk_usage(directory) + _file_size(output)))
            if dry_run:
                continue
            try:
                shutil.rmtree(directory)  # does not follow links below the directory
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(output)
            except FileNotFoundError:
                pass
            except OSError as e:
                raise StoreError(f"prune: cannot remove Slurm job {app_id}'s files under {directory}: {e}") from None
            self.index.remove(app_id)
        return pruned

    def checkpoint_uses(self) -> dict[str, builtins.list[CheckpointUse]]:
        """The local checkpoint locations the recorded jobs' roles carry, with those jobs
        (``Scheduler.checkpoint_uses``)."""
        from airflow_provider_torchx.core import checkpoint_prune

        locations, summaries = {}, {}
        for app, rec in self._recorded():
            location = next((_env(r)[CHECKPOINT_DIR_ENV] for r in rec.roles if _env(r).get(CHECKPOINT_DIR_ENV)), None)
            if location:
                locations[app.app_id] = str(location)
                summaries[app.app_id] = {
                    "labels": app.labels,
                    "state": app.state.name,
                    "ended": app.ended,
                    "created": app.created,
                }
        return checkpoint_prune.uses(locations, summaries)

    def close(self) -> None:
        self.poller.close()


def _file_size(path: str) -> int:
    """Bytes the file ``path`` takes on disk (a link not followed; 0 when there is none)."""
    try:
        return os.lstat(path).st_blocks * 512
    except OSError:
        return 0


def _env(role: Mapping[str, Any]) -> Mapping[str, Any]:
    """A recorded role's env (empty when the record has none)."""
    env = role.get("env")
    return env if isinstance(env, Mapping) else {}


def _ended(entry: Mapping[str, Any]) -> bool:
    """Whether Slurm's entry shows the job ended."""
    return status.app_state(None, entry)[0].is_terminal()


def create_scheduler(session_name: str, **kwargs: Any) -> SlurmScheduler:
    """A ``SlurmScheduler``. Recognised keyword arguments: ``commands``, ``index``, ``clock``;
    others (another scheduler's, such as ``session_factory``) are ignored."""
    known = {k: kwargs[k] for k in ("commands", "index", "clock") if k in kwargs}
    return SlurmScheduler(session_name, **known)
