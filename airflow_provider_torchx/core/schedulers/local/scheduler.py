"""``LocalScheduler``: each replica of each role runs as a process on this host, under a
per-job supervisor, with the job kept in an on-disk store so that any process on the host can
describe, list, tail, cancel or delete it, also after the launcher is gone.

Differences from TorchX's local scheduler: jobs live on disk, not in the launcher's memory; a
failed replica stops the job at once (fail fast); ``max_retries`` and ``retry_policy`` are
honoured; logs are also readable through a resumable cursor (``read_log``).

The class composes the package's modules: the dry run is ``render.py``'s, what a job's files
say (its state, an orphan's end, its description) ``record.py``'s, listings ``listing.py``'s,
log paths and reads ``logs.py``'s; it keeps the launch (``schedule``), the reaping of an
orphan (``finalize``) and the stopping of a job (``cancel``, ``delete``).
"""

from __future__ import annotations

import builtins
import json
import logging
import marshal
import os
import select
import signal
import socket
import subprocess
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_provider_torchx.core import safefiles
from airflow_provider_torchx.core.checkpoints import LOCAL_ROOT_NAME as LOCAL_CHECKPOINT_ROOT
from airflow_provider_torchx.core.checkpoints import app_checkpoint_dir
from airflow_provider_torchx.core.clock import SYSTEM_CLOCK, Clock
from airflow_provider_torchx.core.errorfile import ERROR_FILE_NAME, RANK_LOGS_NAME
from airflow_provider_torchx.core.errors import InvalidSpecError, UnknownAppError, shown
from airflow_provider_torchx.core.guards import MAX_GPU_HOURS, START_TIMEOUT
from airflow_provider_torchx.core.runopts import Cfg, CfgVal, runopts
from airflow_provider_torchx.core.schedulers.api import (
    CancelledBy,
    DescribeAppResponse,
    ListAppResponse,
    LogChunk,
    Scheduler,
    SchedulerCapabilities,
    Stream,
    filter_regex,
)
from airflow_provider_torchx.core.schedulers.local import gpus, listing, options, ports, procfs, record, render, store
from airflow_provider_torchx.core.schedulers.local.images import (
    CWDImageProvider,
    ImageProvider,
    LocalDirectoryImageProvider,
)
from airflow_provider_torchx.core.schedulers.local.logs import (
    LogIterator,
    cursor_at,
    cursor_offset,
    log_root,
    open_log,
    rank_log,
    read_lines,
    replica_log,
    tail_lines,
)
from airflow_provider_torchx.core.schedulers.local.request import (
    PopenRequest,
    ReplicaParam,
    format_request,
    request_from_json,
    request_to_json,
    role_from_json,
)
from airflow_provider_torchx.core.schedulers.local.supervisor import supervisor_command
from airflow_provider_torchx.core.specs import AppDef, AppDryRunInfo

if TYPE_CHECKING:
    from airflow_provider_torchx.core.checkpoint_prune import Use as CheckpointUse

ImageProviderFactory = Callable[[Cfg], ImageProvider]
log = logging.getLogger(__name__)
#: The most of a replica's torchrun error file read for its root cause (the file is a small
#: JSON document; a larger one is cut, never read whole).
MAX_ERROR_FILE_BYTES = 1 << 20


class LocalScheduler(Scheduler[PopenRequest]):
    """Runs apps as local processes (see the module docstring).

    ``backend`` is the scheduler's name (``local_cwd`` or ``local_dir``);
    ``cancel_grace_period`` is the time between SIGTERM and SIGKILL when cancelling;
    ``device_count`` returns the host's GPU count (devices ``0..n-1``; default:
    ``gpus.host_devices()``); ``state_dir`` overrides
    where the job store is (default: ``statedir.default_state_dir()``). ``cache_size`` bounds
    what is held in memory, never what is on disk. ``clock``: the time a job's state, an
    orphan's end and what a prune takes are judged at (records are stamped with the real
    time).
    """

    #: Jobs run on this host and are watched from it; a status is a few small file reads.
    capabilities = SchedulerCapabilities(
        host_bound=True, cheap_status=True, error_files=True, separate_stderr=True, prune=True
    )

    def __init__(
        self,
        session_name: str,
        image_provider_class: ImageProviderFactory,
        cache_size: int = 100,
        extra_paths: list[str] | None = None,
        *,
        backend: str = "local_cwd",
        cancel_grace_period: float = 10.0,
        device_count: Callable[[], int] | None = None,
        state_dir: str | os.PathLike[str] | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        super().__init__(backend, session_name)
        self.image_provider_class = image_provider_class
        self.cache_size = cache_size
        self.extra_paths = list(extra_paths or [])
        self.cancel_grace_period = float(cancel_grace_period)
        self.device_count = device_count
        self.store = store.JobStore(state_dir)
        self.clock = clock
        self.records = record.JobRecords(self.store.root, cache_size, clock)
        self.listing = listing.Listing(self.store, self.records, backend)

    # ------------------------------------------------------------------ submit

    def _run_opts(self) -> runopts:
        return options.run_opts()

    def _submit_dryrun(
        self, app: AppDef, cfg: dict[str, CfgVal], labels: dict[str, str]
    ) -> AppDryRunInfo[PopenRequest]:
        host_gpus = self._host_gpus() if any(r.resource.gpu > 0 for r in app.roles) else None
        if host_gpus == [] and not cfg.get("allow_no_gpus"):
            raise render.no_gpus_error(app)
        app_id = render.make_app_id(app.name)
        app_log_dir = log_root(self.store.job_dir(app_id), app_id, cfg)
        path_front = ([os.getcwd()] if cfg.get("prepend_cwd") else []) + self.extra_paths
        provider = self.image_provider_class(cfg)
        role_params, role_log_dirs = render.replica_params(app, app_id, app_log_dir, provider, path_front)
        gpu_plan = None
        if cfg.get("auto_set_cuda_visible_devices"):
            gpu_plan = self.auto_set_CUDA_VISIBLE_DEVICES(role_params, app, cfg)
        elif host_gpus:  # a host without GPUs (allow_no_gpus) has none to share
            render.warn_shared_gpus(app)
        timeout = cfg.get("attempt_timeout")  # an int >= 1 or None: cfg is resolved
        request = PopenRequest(
            app_id=app_id,
            log_dir=app_log_dir,
            role_params=role_params,
            role_log_dirs=role_log_dirs,
            app_name=app.name,
            roles=list(app.roles),
            cancel_grace_period=self.cancel_grace_period,
            gpus=gpu_plan or {},
            attempt_timeout=timeout if isinstance(timeout, int) else None,
            start_timeout=_guard(cfg, START_TIMEOUT),
            max_gpu_hours=_guard(cfg, MAX_GPU_HOURS),
        )
        return AppDryRunInfo(request, format_request)

    def _host_gpus(self) -> list[int]:
        """The host's GPU indices: ``device_count``'s, else ``gpus.host_devices()``."""
        return list(range(self.device_count())) if self.device_count else gpus.host_devices()

    def auto_set_CUDA_VISIBLE_DEVICES(  # noqa: N802 - TorchX's public name
        self, role_params: dict[str, list[ReplicaParam]], app: AppDef, cfg: Cfg
    ) -> dict[str, Any] | None:
        """Give each replica of each GPU role its own consecutive devices of this host
        (``render.assign_gpus``); returns the job's GPU plan (None: no GPU or too many): at run
        time the host's GPU ledger decides which devices the replicas get."""
        return render.assign_gpus(role_params, app, self._host_gpus())

    def schedule(self, dryrun_info: AppDryRunInfo[PopenRequest]) -> str:
        """Create the job in the store and start its supervisor; return the app id.

        Returns once the supervisor process exists (it does not wait for the replicas).
        Scheduling the same dry run twice raises ``ValueError`` (the app id is taken).
        """
        req = dryrun_info.request
        if not store.is_valid_app_id(req.app_id):
            raise InvalidSpecError(f"app_id: {req.app_id!r} may only hold letters, digits, '_', '-', '.'")
        try:
            job_dir = Path(self.store.create(req.app_id))
        except FileExistsError:
            raise ValueError(f"app_id: {req.app_id!r} was already scheduled; dry-run the app again") from None
        try:
            # The supervisor's interpreter starts while the job's files (the replicas' logs too)
            # are written: it waits for the record on its stdin (``_hand_over``).
            sh = self._spawn_supervisor(job_dir)
            written = None
            try:
                ports.assign(self.store.root, req)
                record = {
                    "backend": self.backend,
                    "session": self.session_name,
                    "host": socket.gethostname(),
                    "created": time.time(),
                    "labels": dict(dryrun_info.labels),
                    "cfg": json.loads(json.dumps(dryrun_info.cfg, default=str)),
                    **request_to_json(req),
                }
                try:
                    store.write_json_atomic(job_dir / store.REQUEST, record)
                    if req.gpus:
                        gpus.enqueue(self.store.root, req.app_id, int(req.gpus["need"]))
                    for params in req.role_params.values():
                        for param in params:
                            store.create_logs([param.stdout, param.stderr, param.combined])
                except OSError as e:
                    raise store.store_error(self.store.root, f"write the job {req.app_id!r}", e) from None
                written = record
            finally:
                self._hand_over(job_dir, sh, written)
        except BaseException:
            self.store.remove(req.app_id)
            raise
        return req.app_id

    def _spawn_supervisor(self, job_dir: Path) -> subprocess.Popen[bytes]:
        """Start the supervisor detached: a background job of a short-lived ``sh``, so it is
        nobody's child and survives its launcher. It waits for ``_hand_over``."""
        # The log is created owner-only here (the supervisor keeps the launcher's umask for the
        # replicas) and is the shell's stderr, which the supervisor's stdout and stderr share.
        # The shell's stdin goes on to the supervisor through fd 3: a background job's own
        # stdin is /dev/null.
        try:
            log_fd = os.open(
                job_dir / store.SUPERVISOR_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600
            )
        except OSError as e:
            raise store.store_error(self.store.root, f"write the job {job_dir.name!r}", e) from None
        try:
            return subprocess.Popen(
                ["/bin/sh", "-c", 'exec 3<&0; "$@" <&3 3<&- >&2 & echo $!', "sh", *supervisor_command(str(job_dir))],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log_fd,
                start_new_session=True,
            )
        finally:
            os.close(log_fd)

    def _hand_over(self, job_dir: Path, sh: subprocess.Popen[bytes], record: dict[str, Any] | None) -> None:
        """Record the supervisor's identity, then hand it the job's ``record`` (what
        ``request.json`` holds) on its stdin in ``marshal``'s format (``supervisor.read_request``:
        it starts the replicas without importing ``json``, and finds its identity recorded).
        ``record`` None, or an identity that cannot be recorded: the supervisor gets None and
        exits without running or writing anything."""
        assert sh.stdout is not None
        echoed = sh.stdout.readline()  # sh prints the supervisor's pid once it started it
        plan = None
        try:
            if record is not None:
                if not echoed.strip().isdigit():
                    raise RuntimeError(f"could not start the supervisor of {job_dir} (sh printed {echoed!r})")
                pid = int(echoed)
                start = procfs.start_time(pid)
                if start is not None:
                    try:
                        store.write_json_atomic(
                            job_dir / store.SUPERVISOR, {"pid": pid, "start": start, "boot": procfs.boot_id()}
                        )
                    except OSError as e:
                        raise store.store_error(self.store.root, f"write the job {job_dir.name!r}", e) from None
                plan = record
        finally:
            sh.communicate(marshal.dumps(plan))

    # ------------------------------------------------------------------ records

    def job_dir(self, app_id: str) -> Path:
        """The job's directory in the store (which need not exist); ``UnknownAppError`` for an
        id that cannot be a job of this store (``/``, ``..``)."""
        if not store.is_valid_app_id(app_id):
            raise UnknownAppError(
                f"app_id: {shown(app_id)} is not a local app id (no '/', '..' or leading '.', "
                f"at most {store.NAME_MAX} characters)"
            )
        return Path(self.store.job_dir(app_id))

    def default_checkpoint_root(self) -> str | None:
        """``checkpoints/`` beside the job store (``<state dir>/checkpoints``)."""
        return os.path.join(os.path.dirname(os.path.abspath(self.store.root)), LOCAL_CHECKPOINT_ROOT)

    def sidecar_dir(self, app_id: str) -> Path | None:
        """The job's directory: watchers' own files (log cursors) live beside the job in the
        store and go away with ``delete``. None for an unknown job, or one whose directory is
        a symbolic link (a swapped job: its watchers keep their files under the state dir)."""
        path = self.job_dir(app_id)
        return path if path.is_dir() and not path.is_symlink() else None

    def finalize(self, app_id: str) -> DescribeAppResponse | None:
        """The supervisor-death finaliser, the one place that reaps a local job: when the
        job's supervisor died (or never started) before it recorded the end, stop what is left
        of the job and record its end. Every process of the job is killed: the replicas and the
        other processes the supervisor recorded (``tracked``), the members of its session,
        their descendants and whatever carries the job marker; those found only by the marker
        or the record (they had left the replicas' trees) are named in the message. When the
        store cannot be written, the end is reported all the same (``not recorded``) and a
        later ``finalize`` records it.

        Blocking (a ``/proc`` scan, kills, a store write): never on an event loop. Returns the
        job's description once finalised, None when there was nothing to do (no such job, or
        one still supervised or already recorded as ended)."""
        reaped = self._reap(app_id)
        return None if reaped is None else reaped[0]

    def _reap(self, app_id: str) -> tuple[DescribeAppResponse, bool] | None:
        """``finalize``, with whether the end was recorded (False: the store could not be
        written, the description says why)."""
        rec = self.records.request(app_id)
        if rec is None or not self.records.state(app_id, rec).get("orphaned"):
            return None
        job_dir = self.job_dir(app_id)
        st = self.records.read(app_id, store.STATE)
        sup = self.records.read(app_id, store.SUPERVISOR)
        replicas, tracked = record.recorded_processes(st)
        # The dead supervisor's session is the job's unless its pid now names another process
        # (the kernel does not reuse a pid while a session of that id has members).
        sid = sup["pid"] if sup and procfs.proc_info(sup["pid"]) is None else None
        killed = procfs.kill_job(sid, replicas | tracked, env_marker=store.job_marker(job_dir))
        end = self.records.orphan_end(app_id, st, sup, strays=[p for p in killed if (p.pid, p.start) not in replicas])
        try:
            store.write_json_atomic(job_dir / store.STATE, end)
        except OSError as e:
            err = store.store_error(self.store.root, f"record the end of {app_id!r}", e)
            log.warning("%s (reported, not recorded)", err)
            return self._describe(app_id, rec, {**end, "msg": f"{end['msg']} (not recorded: {err})"}), False
        self.records.remember(app_id, rec, end)
        return self._describe(app_id, rec, end), True

    # ------------------------------------------------------------------ observe

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        """The job's state, replicas (pid-checked, so a dead supervisor is noticed; each
        replica's ``msg`` names its GPUs from the ledger), failure or waiting message, restarts,
        labels, roles and whether a cancel was requested; None if unknown. Side-effect free:
        a job whose supervisor died is reported ended, and ``finalize`` stops and records it."""
        rec = self.records.request(app_id)
        if rec is None:
            return None
        return self._describe(app_id, rec, self.records.state(app_id, rec))

    def _describe(self, app_id: str, rec: dict[str, Any], st: dict[str, Any]) -> DescribeAppResponse:
        """The description of the job of record ``rec`` in state ``st`` (``record.description``)."""
        return record.description(app_id, rec, st, self.records.read(app_id, store.CANCEL))

    def read_error_file(self, app_id: str, role_name: str, k: int) -> tuple[str, float] | None:
        """``Scheduler.read_error_file``: ``error.json`` in the replica's log directory, a place
        derived from the store's layout (``_log_file``), never from the job's record, and read
        only as a regular file inside the job's log directory (``logs.open_log``). None for an
        unknown job, role or replica, a role that set its own ``TORCHELASTIC_ERROR_FILE``
        elsewhere, or a file that is not the job's own (a symbolic link: logged, never read)."""
        try:
            _, path, root = self._log_file(app_id, role_name, k, Stream.STDERR)
            fd = open_log(os.path.join(os.path.dirname(path), ERROR_FILE_NAME), root)
        except safefiles.UnsafeFileError as e:
            log.warning("root cause of %s: %s", shown(app_id), e)
            return None
        except (UnknownAppError, ValueError):
            return None
        if fd is None:
            return None
        with open(fd, encoding="utf-8", errors="replace") as f:
            return f.read(MAX_ERROR_FILE_BYTES), os.fstat(f.fileno()).st_mtime

    def rank_stderr(self, app_id: str, role_name: str, k: int, local_rank: int, n: int) -> builtins.list[str] | None:
        """``Scheduler.rank_stderr``: from torchrun's newest per-rank file (``logs.rank_log``)
        below ``<replica's log directory>/ranks`` (``$PET_LOG_DIR``), a place derived from the
        store's layout (``_log_file``), never from the job's record, and read inside the job's
        log directory (``logs.tail_lines``). None for an unknown job, role or replica, or when
        torchrun kept no such file there (a role that set its own ``--log-dir``)."""
        try:
            _, path, root = self._log_file(app_id, role_name, k, Stream.STDERR)
        except (UnknownAppError, ValueError):
            return None
        found = rank_log(os.path.join(os.path.dirname(path), RANK_LOGS_NAME), local_rank)
        return tail_lines(found, n, root=root) if found else None

    def describe_native(self, app_id: str) -> AppDryRunInfo[PopenRequest] | None:
        """The stored ``PopenRequest`` (with labels, cfg and backend), or None if unknown."""
        rec = self.records.request(app_id)
        if rec is None:
            return None
        info = AppDryRunInfo(request_from_json(rec), format_request)
        info.labels = dict(rec["labels"])
        info._cfg = dict(rec["cfg"])
        info._scheduler = rec["backend"]
        return info

    def summaries(self, states: bool = True) -> dict[str, dict[str, Any]]:
        """What a listing shows of every job of the store (any local backend): app id ->
        ``{"backend", "name", "labels", "created", "state", "started", "ended"}``
        (``Listing.summaries``: ended jobs from the store's index, the others from their files;
        ``states`` False: without reading the state files of the jobs not in the index)."""
        return self.listing.summaries(states)

    def prune(self, older_than: float, states: Iterable[str] = (), dry_run: bool = False) -> list[tuple[str, int]]:
        """Remove this backend's jobs of the store that ended more than ``older_than`` seconds
        ago, in one of ``states`` if given (``Scheduler.prune``; logs under a ``log_dir``
        option stay). Returns ``(app_id, bytes on disk)`` per job, oldest first."""
        cutoff = self.clock.wall() - older_than
        summaries = self.summaries()
        own = dict(self.listing.matching(summaries, None))
        for app_id, entry in own.items():
            if entry.get("orphaned"):  # stop what is left of it and record its end first
                reaped = self._reap(app_id)
                if reaped is None or not reaped[1]:
                    entry["state"] = "UNKNOWN"  # not prunable this time
                else:
                    entry.update(state=reaped[0].state.name, ended=reaped[0].ended)
        pruned = []
        for app_id in listing.prunable(own, cutoff=cutoff, states=states):
            size = self.store.disk_usage(app_id)
            if not dry_run:
                self.records.forget(app_id)
                self.store.remove(app_id)
            pruned.append((app_id, size))
        if pruned and not dry_run:
            self.store.record_finished({}, set(summaries) - {app_id for app_id, _ in pruned})
        return pruned

    def checkpoint_uses(self) -> dict[str, list[CheckpointUse]]:
        """The local checkpoint locations this backend's jobs of the store name (as ``list``
        takes them: with the refused ones of no known backend), with those jobs
        (``Scheduler.checkpoint_uses``)."""
        from airflow_provider_torchx.core import checkpoint_prune

        own = dict(self.listing.matching(self.summaries(), None))
        return checkpoint_prune.uses(self._checkpoint_dirs(own), own)

    def _checkpoint_dirs(self, app_ids: Iterable[str]) -> dict[str, str]:
        """``{app_id: TORCHX_CHECKPOINT_DIR}`` of the jobs ``app_ids`` of the store that have one."""
        found = {}
        for app_id in sorted(app_ids):
            try:
                rec = self.records.request(app_id)
            except store.CorruptEntryError as e:
                log.warning("checkpoints: skipping %s", e)
                continue
            location = app_checkpoint_dir(role_from_json(r) for r in rec["roles"]) if rec else None
            if location:
                found[app_id] = location
        return found

    def list(
        self, cfg: Cfg | None = None, labels: Mapping[str, str] | None = None, *, limit: int | None = None
    ) -> list[ListAppResponse]:
        """Every job of this backend in the store (any session) whose labels include every
        ``labels`` pair, oldest first, or the newest ``limit`` (from ``summaries``; answers are
        built for those only, and those of ended jobs once per process and shared: read them,
        do not change them)."""
        with store.GcPaused():
            return self.listing.answers(self.summaries(), labels, limit)

    def count(self, cfg: Cfg | None = None, labels: Mapping[str, str] | None = None) -> int:
        """How many jobs ``list`` returns, counted on the summaries (no answer built, no
        state file read: a job with a corrupt one, which ``list`` skips once no supervisor of it
        runs, is counted)."""
        with store.GcPaused():
            return len(self.listing.matching(self.summaries(states=False), labels))

    def wait_for_change(self, app_id: str, timeout: float) -> None:
        """Block until the job's supervisor exits (the job is over) or ``timeout`` passes,
        through a pidfd: no busy polling."""
        self.job_dir(app_id)  # UnknownAppError for an id that cannot be a job of this store
        sup = self.records.read(app_id, store.SUPERVISOR)
        rec = self.records.request(app_id)
        if rec is not None and not record.on_this_host(rec):
            super().wait_for_change(app_id, timeout)  # no process to watch here: sleep
            return
        if sup is None:
            # Submitted a moment ago: the supervisor has not recorded itself yet.
            time.sleep(max(0.0, min(timeout, 0.05)))
            return
        fd = _open_supervisor(sup)
        if fd is None:
            return
        try:
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            poller.poll(max(0, int(timeout * 1000)))
        finally:
            os.close(fd)

    def change_fd(self, app_id: str) -> int | None:
        """A pidfd of the job's supervisor, readable once it exited (the job is over); None
        for a job without a live supervisor on this host. A few small file reads."""
        rec = self.records.request(app_id)
        if rec is None or not record.on_this_host(rec):
            return None
        sup = self.records.read(app_id, store.SUPERVISOR)
        return None if sup is None else _open_supervisor(sup)

    # ------------------------------------------------------------------ logs

    def _log_file(self, app_id: str, role_name: str, k: int, streams: Stream | str | None) -> tuple[str, str, str]:
        """``(stream name, path, the job's log directory)`` of a replica's log, derived from the
        store's layout (``logs.log_root``, ``logs.replica_log``), never read from the job's
        record; every read stays in that directory (``logs.open_log``). Raises for unknown
        app, role, replica or stream."""
        rec = self.records.request(app_id)
        if rec is None:
            raise UnknownAppError(f"app_id: no app {app_id!r} on {self.backend}")
        root = log_root(self.store.job_dir(app_id), app_id, rec["cfg"])
        stream, path = replica_log(app_id, root, rec["role_params"], role_name, k, streams)
        return stream, path, root

    def read_log(
        self,
        app_id: str,
        role_name: str,
        k: int = 0,
        cursor: str | None = None,
        streams: Stream | None = None,
        max_lines: int | None = None,
    ) -> LogChunk:
        """Whole lines of replica ``k`` of ``role_name`` after ``cursor`` (a JSON byte offset;
        None: the start), at most ``max_lines``. ``eof`` once the job is terminal and the
        whole log was returned. Default stream: combined. Never blocks."""
        stream, path, root = self._log_file(app_id, role_name, k, streams)
        offset = cursor_offset(cursor, stream)
        rec = self.records.request(app_id)
        assert rec is not None
        final = record.is_ended(self.records.state(app_id, rec))
        lines, offset, more = read_lines(path, offset, final, max_lines, root=root)
        return LogChunk(lines=lines, cursor=cursor_at(stream, offset), eof=final and not more)

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
        """Lines of replica ``k`` of ``role_name`` (default stream: combined), filtered by
        ``regex``; with ``should_tail`` it follows until the job is terminal and drained.
        ``since``/``until`` are ignored with a warning (local logs carry no timestamps), as in
        TorchX. Unknown app: ``UnknownAppError``; unknown role/replica: ``ValueError``."""
        _, path, root = self._log_file(app_id, role_name, k, streams)
        if since or until:
            warnings.warn(
                "since/until are ignored by the local scheduler: all log lines are returned", UserWarning, stacklevel=2
            )
        return filter_regex(regex, LogIterator(app_id, path, self, should_tail, root=root))

    # ------------------------------------------------------------------ stop

    def cancel(self, app_id: str, *, reason: str | None = None, by: CancelledBy | None = None) -> None:
        """``Scheduler.cancel``; a job one of whose files is refused (``CorruptEntryError``: a
        state file or directory swapped for a symbolic link, a corrupt record) is stopped all the
        same: its supervisor, known without that file (``JobRecords.running_supervisor``), is
        signalled, the cancel recorded with the refusal where the job's directory is a real one
        (``_record_refused_cancel``), and ``CancelDeliveredError`` names the refused file
        (``CorruptEntryError`` itself when no supervisor of the job runs: ``delete`` stops and
        removes such a job)."""
        try:
            super().cancel(app_id, reason=reason, by=by)
        except store.CorruptEntryError as refused:
            found = self.records.running_supervisor(app_id)
            if found is None:
                raise
            self._record_refused_cancel(app_id, {**self._cancel_record(reason, by), "refused": str(refused)})
            if not procfs.signal_if_same(*found, signal.SIGTERM):  # the supervisor takes it as a cancel
                raise
            raise store.CancelDeliveredError(refused, found[0]) from None

    def _cancel_record(self, reason: str | None, by: CancelledBy | None) -> dict[str, Any]:
        """What ``cancel.json`` holds of a cancel: when, the grace period, who asked and why."""
        return {
            "time": time.time(),
            "grace": self.cancel_grace_period,
            "pid": os.getpid(),
            "reason": reason,
            "by": None if by is None else by.value,
        }

    def _record_refused_cancel(self, app_id: str, cancel: dict[str, Any]) -> None:
        """Write ``cancel.json`` of a job whose record is refused, in its directory only when
        that is a real one (opened without following a link: nothing is written where a link
        points), so that the end its supervisor writes over a refused ``state.json`` still says
        it was stopped unwatched (``stopped_while_refused``). Best effort: the cancel is
        delivered all the same."""
        try:
            fd = os.open(self.job_dir(app_id), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return
        try:
            store.write_json_atomic(store.CANCEL, cancel, dir_fd=fd)
        except OSError as e:
            log.warning("cancel: could not record the cancel of %s, whose record is refused: %s", app_id, e)
        finally:
            os.close(fd)

    def _cancel_existing(self, app_id: str, reason: str | None, by: CancelledBy | None) -> None:
        """Record the cancel (with the grace period, ``reason`` and ``by``) and SIGTERM the supervisor, which
        SIGTERMs every process of the job, SIGKILLs them after the grace period and records
        CANCELLED. Returns at once. When the store cannot be written, the supervisor is
        signalled all the same and ``CancelNotRecordedError`` says so (``StoreError`` if there
        was no supervisor to signal either)."""
        job_dir = self.job_dir(app_id)
        rec = self.records.request(app_id)
        if rec is not None and not record.on_this_host(rec):
            raise RuntimeError(f"cancel: app {app_id!r} runs on host {rec['host']!r}; cancel it from there")
        unrecorded = None
        try:
            store.write_json_atomic(job_dir / store.CANCEL, self._cancel_record(reason, by))
        except OSError as e:
            unrecorded = store.store_error(self.store.root, f"record the cancel of {app_id!r}", e)
        sup = self.records.read(app_id, store.SUPERVISOR)
        signalled = (
            sup is not None
            and sup.get("boot") == procfs.boot_id()
            and procfs.signal_if_same(sup["pid"], sup["start"], signal.SIGTERM)
        )
        if unrecorded is None:
            return
        if not signalled:
            raise unrecorded
        raise store.CancelNotRecordedError(
            unrecorded.errno,
            f"{unrecorded}; its supervisor was signalled: the job stops and is recorded CANCELLED "
            "once the store can be written again",
        )

    def delete(self, app_id: str) -> None:
        """Cancel the job if it runs, then remove it from the store. A corrupt entry (one that
        ``list`` skips) is removed as it is, after killing its supervisor (when its record
        can be read) and every process that carries the job's marker."""
        try:
            super().delete(app_id)
        except store.CorruptEntryError:
            self.records.forget(app_id)
            job_dir = self.store.job_dir(app_id)
            try:
                sup = self.records.read(app_id, store.SUPERVISOR)
            except store.CorruptEntryError:
                sup = None
            if sup is not None and sup.get("boot") == procfs.boot_id():
                procfs.signal_if_same(sup["pid"], sup["start"], signal.SIGKILL)
            procfs.kill_job(None, [], env_marker=store.job_marker(job_dir))
            self.store.remove(app_id)

    def _delete_existing(self, app_id: str) -> None:
        """Wait (up to the grace period and a little) for the cancelled job's supervisor to
        exit, then remove the job from the store (logs under a ``log_dir`` option stay)."""
        deadline = time.monotonic() + self.cancel_grace_period + 5.0
        while time.monotonic() < deadline:
            rec = self.records.request(app_id)
            if rec is None or record.is_ended(self.records.state(app_id, rec)):
                break
            self.wait_for_change(app_id, deadline - time.monotonic())
        self.records.forget(app_id)
        self.store.remove(app_id)


def _guard(cfg: Mapping[str, CfgVal], name: str) -> float | None:
    """The guard ``name`` of the resolved ``cfg`` (a float > 0, or None: not set)."""
    value = cfg.get(name)
    return float(value) if isinstance(value, int | float) else None


def _open_supervisor(sup: Mapping[str, Any]) -> int | None:
    """A pidfd of the supervisor ``sup`` (its store entry) if it still runs, else None."""
    return procfs.open_if_same(sup["pid"], sup["start"]) if sup.get("boot") == procfs.boot_id() else None


def create_scheduler(
    session_name: str,
    cache_size: int = 100,
    extra_paths: list[str] | None = None,
    image_provider_class: ImageProviderFactory = CWDImageProvider,
    **kwargs: Any,
) -> LocalScheduler:
    """A ``LocalScheduler`` (TorchX's factory). Recognised keyword arguments: ``backend``
    (default: ``local_dir`` for ``LocalDirectoryImageProvider``, else ``local_cwd``),
    ``cancel_grace_period``, ``device_count``, ``state_dir``, ``clock``; others are ignored."""
    backend = kwargs.get("backend") or (
        "local_dir" if image_provider_class is LocalDirectoryImageProvider else "local_cwd"
    )
    return LocalScheduler(
        session_name,
        image_provider_class,
        cache_size=cache_size,
        extra_paths=extra_paths,
        backend=backend,
        cancel_grace_period=kwargs.get("cancel_grace_period", 10.0),
        device_count=kwargs.get("device_count"),
        state_dir=kwargs.get("state_dir"),
        clock=kwargs.get("clock", SYSTEM_CLOCK),
    )


def create_cwd_scheduler(session_name: str, **kwargs: Any) -> LocalScheduler:
    """The ``local_cwd`` scheduler: runs in the current directory, ignores images."""
    kwargs.update(image_provider_class=CWDImageProvider, backend="local_cwd")
    return create_scheduler(session_name, **kwargs)


def create_dir_scheduler(session_name: str, **kwargs: Any) -> LocalScheduler:
    """The ``local_dir`` scheduler: each role's image is an absolute local directory."""
    kwargs.update(image_provider_class=LocalDirectoryImageProvider, backend="local_dir")
    return create_scheduler(session_name, **kwargs)
