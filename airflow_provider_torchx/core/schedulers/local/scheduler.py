"""``LocalScheduler``: each replica of each role runs as a process on this host, under a
per-job supervisor, with the job kept in an on-disk store so that any process on the host can
describe, list, tail, cancel or delete it, also after the launcher is gone.

Differences from TorchX's local scheduler: jobs live on disk, not in the launcher's memory; a
failed replica stops the job at once (fail fast); ``max_retries`` and ``retry_policy`` are
honoured; logs are also readable through a resumable cursor (``read_log``).
"""

from __future__ import annotations

import builtins
import copy
import heapq
import json
import logging
import marshal
import os
import re
import secrets
import select
import shutil
import signal
import socket
import subprocess
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from airflow_provider_torchx.core.checkpoints import LOCAL_ROOT_NAME as LOCAL_CHECKPOINT_ROOT
from airflow_provider_torchx.core.checkpoints import app_checkpoint_dir
from airflow_provider_torchx.core.errorfile import ERROR_FILE_ENV, ERROR_FILE_NAME, RANK_LOGS_ENV, RANK_LOGS_NAME
from airflow_provider_torchx.core.errors import InvalidSpecError, UnknownAppError, shown
from airflow_provider_torchx.core.runopts import Cfg, CfgVal, runopts
from airflow_provider_torchx.core.schedulers.api import (
    DescribeAppResponse,
    ListAppResponse,
    LogChunk,
    Scheduler,
    SchedulerCapabilities,
    Stream,
    cursor_object,
    filter_regex,
    labels_match,
)
from airflow_provider_torchx.core.schedulers.local import gpus, ledger, options, ports, procfs, store
from airflow_provider_torchx.core.schedulers.local.images import (
    CWDImageProvider,
    ImageProvider,
    LocalDirectoryImageProvider,
)
from airflow_provider_torchx.core.schedulers.local.logs import LogIterator, open_log, rank_log, read_lines, tail_lines
from airflow_provider_torchx.core.schedulers.local.request import (
    PopenRequest,
    ReplicaParam,
    format_request,
    request_from_json,
    request_to_json,
    role_from_json,
)
from airflow_provider_torchx.core.schedulers.local.supervisor import is_supervisor_of, supervisor_command
from airflow_provider_torchx.core.schedulers.local.usage import local_usage
from airflow_provider_torchx.core.specs import (
    AppDef,
    AppDryRunInfo,
    AppState,
    ReplicaStatus,
    Role,
    RoleStatus,
    macros,
)

ImageProviderFactory = Callable[[Cfg], ImageProvider]
log = logging.getLogger(__name__)
#: The most of a replica's torchrun error file read for its root cause (the file is a small
#: JSON document; a larger one is cut, never read whole).
MAX_ERROR_FILE_BYTES = 1 << 20

#: The env var that holds rank 0's host (``${rank0_env}`` names it); locally, ``localhost``.
RANK0_ENV = "TORCHX_RANK0_HOST"
#: A job whose supervisor has not shown up this long after submission is FAILED.
SUPERVISOR_START_TIMEOUT = ledger.START_TIMEOUT
_TERMINAL_NAMES = {s.name for s in AppState if s.is_terminal()}


def _summary_key(item: tuple[str, dict[str, Any]]) -> tuple[float, str]:
    """Oldest first: by submission time, then app id (``Scheduler.list``'s order)."""
    return (item[1]["created"] or 0.0, item[0])


#: ``AppState`` by name: a dict lookup, cheaper than ``AppState[name]`` when listing thousands.
_STATES = {s.name: s for s in AppState}
_PENDING_STATE: dict[str, Any] = {"state": "PENDING", "num_restarts": 0, "msg": "", "replicas": {}}
#: The keys of ``request.json`` a reader relies on, with their JSON types.
_RECORD_KEYS: dict[str, type | tuple[type, ...]] = {
    "backend": str,
    "app_name": str,
    "log_dir": str,
    "labels": dict,
    "cfg": dict,
    "role_params": dict,
    "roles": list,
    "created": (int, float),
}
#: How much of the end of ``supervisor.log`` a reader quotes when the supervisor died.
_LAST_WORDS_BYTES = 300


def make_app_id(app_name: str) -> str:
    """``<name>-<12 random hex digits>``; the name is reduced to ``[A-Za-z0-9_-]``."""
    safe = re.sub(r"[^A-Za-z0-9_-]+", "-", app_name).strip("-")[:40] or "app"
    return f"{safe}-{secrets.token_hex(6)}"


class LocalScheduler(Scheduler[PopenRequest]):
    """Runs apps as local processes (see the module docstring).

    ``backend`` is the scheduler's name (``local_cwd`` or ``local_dir``);
    ``cancel_grace_period`` is the time between SIGTERM and SIGKILL when cancelling;
    ``device_count`` returns the host's GPU count (devices ``0..n-1``; default:
    ``gpus.host_devices()``); ``state_dir`` overrides
    where the job store is (default: ``statedir.default_state_dir()``). ``cache_size`` bounds
    what is held in memory, never what is on disk.
    """

    #: Jobs run on this host and are watched from it; a status is a few small file reads.
    capabilities = SchedulerCapabilities(
        host_bound=True, cheap_status=True, error_files=True, separate_stderr=True, local_store=True
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
    ) -> None:
        super().__init__(backend, session_name)
        if cache_size <= 0:
            raise ValueError(f"cache_size: {cache_size!r} must be > 0")
        self.image_provider_class = image_provider_class
        self.cache_size = cache_size
        self.extra_paths = list(extra_paths or [])
        self.cancel_grace_period = float(cancel_grace_period)
        self.device_count = device_count
        self.store = store.JobStore(state_dir)
        # app id -> (request record, final state or None); both never change once written.
        self._cache: OrderedDict[str, tuple[dict[str, Any], dict[str, Any] | None]] = OrderedDict()
        # Watchers of many threads (a triggerer's pool, sensors) share one instance.
        self._cache_lock = threading.Lock()
        # app id -> what ``list`` answers for an ended job (it never changes).
        self._ended_listed: dict[str, ListAppResponse] = {}
        # The ended entries of the index as last parsed (``summaries``), by that parse.
        self._ended_index: tuple[dict[str, Any], dict[str, Any]] | None = None

    # ------------------------------------------------------------------ submit

    def _run_opts(self) -> runopts:
        return options.run_opts()

    def _submit_dryrun(
        self, app: AppDef, cfg: dict[str, CfgVal], labels: dict[str, str]
    ) -> AppDryRunInfo[PopenRequest]:
        host_gpus = self._host_gpus() if any(r.resource.gpu > 0 for r in app.roles) else None
        if host_gpus == [] and not cfg.get("allow_no_gpus"):
            raise _no_gpus_error(app)
        app_id = make_app_id(app.name)
        provider = self.image_provider_class(cfg)
        log_dir_opt = cfg.get("log_dir")
        if log_dir_opt:
            app_log_dir = os.path.join(os.path.abspath(str(log_dir_opt)), app_id)
        else:
            app_log_dir = self.store.job_dir(app_id)
        role_params: dict[str, list[ReplicaParam]] = {}
        role_log_dirs: dict[str, list[str]] = {}
        for i, role in enumerate(app.roles):
            img_root = provider.fetch_role(role)
            params, dirs = [], []
            for k in range(role.num_replicas):
                values = macros.Values(img_root=img_root, app_id=app_id, replica_id=str(k), rank0_env=RANK0_ENV)
                replica_role = values.apply(role)
                replica_role.env[RANK0_ENV] = "localhost"
                replica_dir = os.path.join(app_log_dir, role.name, str(k))
                param = provider.get_replica_param(
                    img_root,
                    replica_role,
                    stdout=os.path.join(replica_dir, "stdout.log"),
                    stderr=os.path.join(replica_dir, "stderr.log"),
                    combined=os.path.join(replica_dir, "combined.log"),
                )
                self._set_path(param, bool(cfg.get("prepend_cwd")))
                param.env.setdefault(ERROR_FILE_ENV, os.path.join(replica_dir, ERROR_FILE_NAME))
                param.env.setdefault(RANK_LOGS_ENV, os.path.join(replica_dir, RANK_LOGS_NAME))
                params.append(param)
                dirs.append(replica_dir)
            _check_entrypoint(i, role, params[0])
            role_params[role.name] = params
            role_log_dirs[role.name] = dirs
        gpu_plan = None
        if cfg.get("auto_set_cuda_visible_devices"):
            gpu_plan = self.auto_set_CUDA_VISIBLE_DEVICES(role_params, app, cfg)
        elif host_gpus:  # a host without GPUs (allow_no_gpus) has none to share
            _warn_shared_gpus(app)
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
        )
        return AppDryRunInfo(request, format_request)

    def _set_path(self, param: ReplicaParam, prepend_cwd: bool) -> None:
        """Put the cwd (with ``prepend_cwd``) and the scheduler's ``extra_paths`` in front of
        the replica's PATH."""
        front = ([os.getcwd()] if prepend_cwd else []) + self.extra_paths
        if front:
            base = param.env.get("PATH", os.environ.get("PATH", ""))
            param.env["PATH"] = os.pathsep.join([*front, base] if base else front)

    def _host_gpus(self) -> list[int]:
        """The host's GPU indices: ``device_count``'s, else ``gpus.host_devices()``."""
        return list(range(self.device_count())) if self.device_count else gpus.host_devices()

    def auto_set_CUDA_VISIBLE_DEVICES(  # noqa: N802 - TorchX's public name
        self, role_params: dict[str, list[ReplicaParam]], app: AppDef, cfg: Cfg
    ) -> dict[str, Any] | None:
        """Give each replica of each GPU role its own consecutive devices in
        ``CUDA_VISIBLE_DEVICES`` (overwriting the role's), in role order, as on an idle host;
        or, when the host has fewer devices than requested in total, set it nowhere and warn
        with both counts. Returns the job's GPU plan (``gpus.plan``; None: no GPU or too many):
        at run time the host's GPU ledger decides which devices the replicas get."""
        devices = self._host_gpus()
        plan = gpus.plan(
            {r.name: max(r.resource.gpu, 0) for r in app.roles}, {r.name: r.num_replicas for r in app.roles}, devices
        )
        if plan is None:
            return None
        if plan["need"] > len(devices):
            warnings.warn(
                f"auto_set_cuda_visible_devices: app {app.name!r} requests {gpus.gpus_text(plan['need'])} but this "
                f"host has {len(devices)}; CUDA_VISIBLE_DEVICES is not set",
                UserWarning,
                stacklevel=3,
            )
            return None
        params = [p for r in app.roles if r.name in plan["roles"] for p in role_params[r.name]]
        counts = [plan["roles"][r.name] for r in app.roles if r.name in plan["roles"] for _ in role_params[r.name]]
        for param, chunk in zip(params, gpus.split(counts, devices), strict=True):
            param.env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, chunk))
        return plan

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

    def _record(self, app_id: str) -> dict[str, Any] | None:
        """The job's request record, or None if there is no such job."""
        if not store.is_valid_app_id(app_id):
            return None
        path = os.path.join(self.store.job_dir(app_id), store.REQUEST)
        with self._cache_lock:
            cached = self._cache.get(app_id)
            if cached is not None:
                if os.path.exists(path):  # another process may have deleted it
                    self._cache.move_to_end(app_id)
                    return cached[0]
                del self._cache[app_id]
                return None
        rec = _read_entry(app_id, path, _check_record)
        if rec is not None:
            self._remember(app_id, rec, None)
        return rec

    def _remember(self, app_id: str, rec: dict[str, Any], final: dict[str, Any] | None) -> None:
        with self._cache_lock:
            self._cache[app_id] = (rec, final)
            self._cache.move_to_end(app_id)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)

    def _state(self, app_id: str, rec: dict[str, Any]) -> dict[str, Any]:
        """The job's ``state.json``; for a job whose supervisor died (or never started) and
        whose end is not recorded, the end ``finalize`` would record (``orphaned``), read only:
        nothing is stopped or written here, so describing stays a few small file reads (an
        event loop may call it)."""
        with self._cache_lock:
            cached = self._cache.get(app_id)
        if cached is not None and cached[1] is not None:
            return cached[1]
        job_dir = Path(self.store.job_dir(app_id))
        st = _read_entry(app_id, job_dir / store.STATE, _check_state)
        if st is None or st["state"] not in _TERMINAL_NAMES:
            if not _on_this_host(rec):
                return st or _PENDING_STATE  # its processes cannot be checked from here
            sup = _read_entry(app_id, job_dir / store.SUPERVISOR, _check_supervisor)
            if ledger.supervisor_alive(sup):
                return st or _PENDING_STATE
            if sup is None and time.time() - rec["created"] < SUPERVISOR_START_TIMEOUT:
                return _PENDING_STATE
            st = _read_entry(app_id, job_dir / store.STATE, _check_state)  # it may have ended just now
            if st is None or st["state"] not in _TERMINAL_NAMES:
                return {**_orphan_end(job_dir, st, sup), "orphaned": True}  # not cached: finalize records it
        self._remember(app_id, rec, st)
        return st

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
        rec = self._record(app_id)
        if rec is None or not self._state(app_id, rec).get("orphaned"):
            return None
        job_dir = Path(self.store.job_dir(app_id))
        st = _read_entry(app_id, job_dir / store.STATE, _check_state)
        sup = _read_entry(app_id, job_dir / store.SUPERVISOR, _check_supervisor)
        replicas = (st or {}).get("replicas") or {}
        reps_ids = {(r["pid"], r["start"]) for rs in replicas.values() for r in rs if r.get("pid") and r.get("start")}
        tracked = {(p, t) for p, t in (st or {}).get("tracked") or []}
        # The dead supervisor's session is the job's unless its pid now names another process
        # (the kernel does not reuse a pid while a session of that id has members).
        sid = sup["pid"] if sup and procfs.proc_info(sup["pid"]) is None else None
        killed = procfs.kill_job(sid, reps_ids | tracked, env_marker=store.job_marker(job_dir))
        end = _orphan_end(job_dir, st, sup, [p for p in killed if (p.pid, p.start) not in reps_ids])
        try:
            store.write_json_atomic(job_dir / store.STATE, end)
        except OSError as e:
            err = store.store_error(self.store.root, f"record the end of {job_dir.name!r}", e)
            log.warning("%s (reported, not recorded)", err)
            return self._describe(app_id, rec, {**end, "msg": f"{end['msg']} (not recorded: {err})"})
        self._remember(app_id, rec, end)
        return self._describe(app_id, rec, end)

    # ------------------------------------------------------------------ observe

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        """The job's state, replicas (pid-checked, so a dead supervisor is noticed; each
        replica's ``msg`` names its GPUs from the ledger), failure or waiting message, restarts,
        labels, roles and whether a cancel was requested; None if unknown. Side-effect free:
        a job whose supervisor died is reported ended, and ``finalize`` stops and records it."""
        rec = self._record(app_id)
        if rec is None:
            return None
        return self._describe(app_id, rec, self._state(app_id, rec))

    def _describe(self, app_id: str, rec: dict[str, Any], st: dict[str, Any]) -> DescribeAppResponse:
        """The description of the job of record ``rec`` in state ``st``."""
        replicas = st.get("replicas") or {}
        statuses = []
        unstarted = _unstarted_replica(st["state"])
        for role_name, params in rec["role_params"].items():
            reps = replicas.get(role_name) or [unstarted] * len(params)
            statuses.append(
                RoleStatus(
                    role=role_name,
                    replicas=[
                        ReplicaStatus(
                            id=k,
                            state=AppState[r["state"]],
                            role=role_name,
                            hostname="localhost",
                            exit_code=r.get("exit_code"),
                            msg=r.get("msg") or (f"GPUs {r['devices']}" if r.get("devices") else ""),
                            devices=r.get("devices") or "",
                        )
                        for k, r in enumerate(reps)
                    ],
                )
            )
        roles = [role_from_json(r) for r in rec["roles"]]
        state = AppState[st["state"]]
        cancel = _read_entry(app_id, os.path.join(self.store.job_dir(app_id), store.CANCEL), _check_cancel)
        return DescribeAppResponse(
            app_id=app_id,
            state=state,
            num_restarts=int(st.get("num_restarts", 0)),
            msg=st.get("msg", ""),
            ui_url=f"file://{rec['log_dir']}",
            roles_statuses=statuses,
            roles=roles,
            labels=dict(rec["labels"]),
            cancel_requested=cancel is not None,
            cancel_reason=(cancel or {}).get("reason"),
            usage=local_usage(rec, st, roles) if state.is_terminal() else None,
            usage_so_far=None if state.is_terminal() else local_usage(rec, st, roles),
            started=st.get("started"),
            ended=st.get("ended"),
            created=rec.get("created"),
        )

    def read_error_file(self, app_id: str, role_name: str, k: int) -> tuple[str, float] | None:
        """``Scheduler.read_error_file``: ``error.json`` in the replica's log directory, a place
        derived from the store's layout (``_log_file``), never from the job's record, and read
        only as a regular file inside the job's log directory (``logs.open_log``). None for an
        unknown job, role or replica, a role that set its own ``TORCHELASTIC_ERROR_FILE``
        elsewhere, or a file that is not the job's own (a symbolic link: logged, never read)."""
        try:
            _, path, root = self._log_file(app_id, role_name, k, Stream.STDERR)
            fd = open_log(os.path.join(os.path.dirname(path), ERROR_FILE_NAME), root)
        except store.UnsafeFileError as e:
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
        rec = self._record(app_id)
        if rec is None:
            return None
        info = AppDryRunInfo(request_from_json(rec), format_request)
        info.labels = dict(rec["labels"])
        info._cfg = dict(rec["cfg"])
        info._scheduler = rec["backend"]
        return info

    def summaries(self, states: bool = True) -> dict[str, dict[str, Any]]:
        """What a listing shows of every job of the store (any local backend): app id ->
        ``{"backend", "name", "labels", "created", "state", "started", "ended"}``. Ended jobs come from
        the store's index (``store.FINISHED_INDEX``); only the others' files are read, and
        those found ended are added to it. Corrupt entries are skipped (logged). ``states``
        False: the jobs not in the index have no ``state`` or ``ended`` (their state files are
        not read: what matching by backend and labels needs)."""
        index = self.store.finished()  # the same dict while the file is unchanged
        if self._ended_index is None or self._ended_index[0] is not index:
            ended = {k: v for k, v in index.items() if isinstance(v, dict) and v.get("state") in _TERMINAL_NAMES}
            self._ended_index = (index, ended)
        ended = self._ended_index[1]
        present = self.store.app_ids()
        found: dict[str, dict[str, Any]] = {app_id: ended[app_id] for app_id in present & ended.keys()}
        learned = {}
        for app_id in present - ended.keys():
            try:
                rec = self._record(app_id)
                if rec is None:
                    continue
                st = self._state(app_id, rec) if states else None
            except store.CorruptEntryError as e:
                log.warning("list: skipping %s", e)
                continue
            entry = {
                "backend": rec["backend"],
                "name": rec["app_name"],
                "labels": rec["labels"],
                "created": rec["created"],
            }
            if st is None:
                found[app_id] = entry
                continue
            entry.update(state=st["state"], started=st.get("started"), ended=st.get("ended"))
            if st.get("orphaned"):  # reported ended, not recorded: finalize records it
                entry["orphaned"] = True
            elif st["state"] in _TERMINAL_NAMES:
                learned[app_id] = entry
            found[app_id] = entry
        if learned:
            self.store.record_finished(learned, present)
        return found

    def prune(self, older_than: float, states: Iterable[str] = (), dry_run: bool = False) -> list[tuple[str, int]]:
        """Remove the jobs of the store (any local backend) that ended more than ``older_than``
        seconds ago, in one of ``states`` if given (never a job that has not ended; logs under
        a ``log_dir`` option stay); ``dry_run``: remove nothing. Returns ``(app_id, bytes on
        disk)`` per job, oldest first; ``StoreError`` if the store cannot be written."""
        wanted = {s.upper() for s in states}
        cutoff = time.time() - older_than
        summaries = self.summaries()
        for app_id, entry in summaries.items():
            if entry.get("orphaned"):  # stop what is left of it and record its end first
                done = self.finalize(app_id)
                if done is None or "not recorded" in done.msg:
                    entry["state"] = "UNKNOWN"  # not prunable this time
                else:
                    entry.update(state=done.state.name, ended=done.ended)
        chosen = sorted(
            (entry.get("ended") or entry["created"], app_id)
            for app_id, entry in summaries.items()
            if entry["state"] in _TERMINAL_NAMES
            and (not wanted or entry["state"] in wanted)
            and (entry.get("ended") or entry["created"]) <= cutoff
        )
        pruned = []
        for _, app_id in chosen:
            size = self.store.disk_usage(app_id)
            if not dry_run:
                with self._cache_lock:
                    self._cache.pop(app_id, None)
                self.store.remove(app_id)
            pruned.append((app_id, size))
        if pruned and not dry_run:
            self.store.record_finished({}, set(summaries) - {app_id for app_id, _ in pruned})
        return pruned

    def checkpoint_dirs(self) -> dict[str, str]:
        """``{app_id: TORCHX_CHECKPOINT_DIR}`` of every job of the store that has one, so
        ``prune --checkpoints`` removes a location only when no job left uses it."""
        found = {}
        for app_id in sorted(self.store.app_ids()):
            try:
                rec = self._record(app_id)
            except store.CorruptEntryError as e:
                log.warning("checkpoints: skipping %s", e)
                continue
            location = app_checkpoint_dir(role_from_json(r) for r in rec["roles"]) if rec else None
            if location:
                found[app_id] = location
        return found

    def _matching(
        self, summaries: dict[str, dict[str, Any]], labels: Mapping[str, str] | None
    ) -> list[tuple[str, dict[str, Any]]]:
        """``(app id, summary)`` of this backend's jobs in ``summaries`` whose labels include
        ``labels``."""
        backend = self.backend
        return [
            (app_id, entry)
            for app_id, entry in summaries.items()
            if entry["backend"] == backend and (not labels or labels_match(entry["labels"], labels))
        ]

    def list(
        self, cfg: Cfg | None = None, labels: Mapping[str, str] | None = None, *, limit: int | None = None
    ) -> list[ListAppResponse]:
        """Every job of this backend in the store (any session) whose labels include every
        ``labels`` pair, oldest first, or the newest ``limit`` (from ``summaries``; answers are
        built for those only, and those of ended jobs once per process and shared: read them,
        do not change them)."""
        with store.GcPaused():
            return self._newest(self.summaries(), labels, limit)

    def _newest(
        self, summaries: dict[str, dict[str, Any]], labels: Mapping[str, str] | None, limit: int | None
    ) -> builtins.list[ListAppResponse]:
        """``list``'s answer from ``summaries``."""
        ended = self._ended_listed
        for gone in ended.keys() - summaries.keys():  # deleted since
            del ended[gone]
        matching = self._matching(summaries, labels)
        if limit is not None and limit < len(matching):
            chosen = heapq.nlargest(limit, matching, key=_summary_key)
            chosen.reverse()
        else:
            chosen = sorted(matching, key=_summary_key)
        found = []
        for app_id, entry in chosen:
            resp = ended.get(app_id)
            if resp is None:
                resp = ListAppResponse(
                    app_id=app_id,
                    state=_STATES[entry["state"]],
                    name=entry["name"],
                    labels=dict(entry["labels"]),
                    created=entry["created"],
                    started=entry.get("started"),
                    ended=entry.get("ended"),
                )
                if entry["state"] in _TERMINAL_NAMES and not entry.get("orphaned"):
                    ended[app_id] = resp
            found.append(resp)
        return found

    def count(self, cfg: Cfg | None = None, labels: Mapping[str, str] | None = None) -> int:
        """How many jobs ``list`` returns, counted on the summaries (no answer built, no
        state file read: a job with a corrupt one, which ``list`` skips, is counted)."""
        with store.GcPaused():
            return len(self._matching(self.summaries(states=False), labels))

    def wait_for_change(self, app_id: str, timeout: float) -> None:
        """Block until the job's supervisor exits (the job is over) or ``timeout`` passes,
        through a pidfd: no busy polling."""
        sup = _read_entry(app_id, self.job_dir(app_id) / store.SUPERVISOR, _check_supervisor)
        rec = self._record(app_id)
        if rec is not None and not _on_this_host(rec):
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
        rec = self._record(app_id)
        if rec is None or not _on_this_host(rec):
            return None
        sup = _read_entry(app_id, self.job_dir(app_id) / store.SUPERVISOR, _check_supervisor)
        return None if sup is None else _open_supervisor(sup)

    # ------------------------------------------------------------------ logs

    def _log_root(self, app_id: str, rec: dict[str, Any]) -> str:
        """The job's log directory as the store's layout makes it (``_submit_dryrun``): the job's
        directory, or ``<log_dir>/<app_id>`` under the ``log_dir`` run option. Never a path the
        record names: a job may rewrite its ``request.json``."""
        log_dir = rec["cfg"].get("log_dir")
        if not log_dir:
            return self.store.job_dir(app_id)
        return os.path.join(os.path.abspath(str(log_dir)), app_id)

    def _log_file(self, app_id: str, role_name: str, k: int, streams: Stream | str | None) -> tuple[str, str, str]:
        """``(stream name, path, the job's log directory)`` of a replica's log, derived from the
        store's layout (``<log root>/<role>/<k>/<stream>.log``, ``_log_root``), never read from
        the job's record; every read stays in that directory (``logs.open_log``). Raises for
        unknown app, role, replica or stream."""
        rec = self._record(app_id)
        if rec is None:
            raise UnknownAppError(f"app_id: no app {app_id!r} on {self.backend}")
        params = rec["role_params"].get(role_name)
        if params is None:
            raise ValueError(
                f"role_name: app {app_id!r} has no role {role_name!r}; its roles: {', '.join(rec['role_params'])}"
            )
        if not isinstance(k, int) or not 0 <= k < len(params):
            raise ValueError(f"k: role {role_name!r} has replicas 0..{len(params) - 1}; got {k!r}")
        try:
            stream = Stream(streams or Stream.COMBINED)
        except ValueError:
            raise ValueError(f"streams: {streams!r} is not one of {', '.join(s.value for s in Stream)}") from None
        if role_name in (".", "..") or "/" in role_name or "\0" in role_name:
            raise ValueError(f"role_name: {shown(role_name)} cannot name a log directory")
        root = self._log_root(app_id, rec)
        return stream.value, os.path.join(root, role_name, str(k), f"{stream.value}.log"), root

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
        offset = 0
        if cursor is not None:
            try:
                parsed = cursor_object(cursor)
                offset = parsed["offset"]
                ok = parsed.get("stream") == stream and type(offset) is int and 0 <= offset < 1 << 62
            except (ValueError, TypeError, KeyError):
                ok = False
            if not ok:
                raise ValueError(f"cursor: {shown(cursor)} is not a cursor read_log returned for the {stream} stream")
        rec = self._record(app_id)
        assert rec is not None
        final = self._state(app_id, rec)["state"] in _TERMINAL_NAMES
        lines, offset, more = read_lines(path, offset, final, max_lines, root=root)
        return LogChunk(lines=lines, cursor=json.dumps({"stream": stream, "offset": offset}), eof=final and not more)

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

    def cancel(self, app_id: str, *, reason: str | None = None) -> None:
        """``Scheduler.cancel``; a job one of whose files is refused (``CorruptEntryError``: a
        state file or directory swapped for a symbolic link, a corrupt record) is stopped all the
        same: its supervisor, known without that file (``_supervisor_pid``), is signalled and
        ``CancelDeliveredError`` names the refused file (``CorruptEntryError`` itself when no
        supervisor of the job runs: ``delete`` stops and removes such a job)."""
        try:
            super().cancel(app_id, reason=reason)
        except store.CorruptEntryError as refused:
            pid = self._signal_supervisor(app_id)
            if pid is None:
                raise
            raise store.CancelDeliveredError(refused, pid) from None

    def _signal_supervisor(self, app_id: str) -> int | None:
        """SIGTERM the supervisor of ``app_id`` without trusting the job's files: the process
        ``supervisor.json`` names if it still is the supervisor of this job directory (start
        time and argv checked against ``/proc``), else the process of this host whose argv is
        that supervisor's. Returns its pid, None when none runs (or it could not be signalled).
        The supervisor takes the signal as a cancel (the default grace period when it cannot
        read ``cancel.json``)."""
        job_dir = self.store.job_dir(app_id)
        try:
            sup = _read_entry(app_id, os.path.join(job_dir, store.SUPERVISOR), _check_supervisor)
        except store.CorruptEntryError:
            sup = None

        def stopped(pid: int, start: int) -> bool:
            return is_supervisor_of(procfs.cmdline(pid), job_dir) and procfs.signal_if_same(pid, start, signal.SIGTERM)

        if sup is not None and sup.get("boot") == procfs.boot_id() and stopped(sup["pid"], sup["start"]):
            return int(sup["pid"])
        return next((p.pid for p in procfs.scan() if stopped(p.pid, p.start)), None)

    def _cancel_existing(self, app_id: str, reason: str | None) -> None:
        """Record the cancel (with the grace period and ``reason``) and SIGTERM the supervisor, which
        SIGTERMs every process of the job, SIGKILLs them after the grace period and records
        CANCELLED. Returns at once. When the store cannot be written, the supervisor is
        signalled all the same and ``CancelNotRecordedError`` says so (``StoreError`` if there
        was no supervisor to signal either)."""
        job_dir = self.job_dir(app_id)
        rec = self._record(app_id)
        if rec is not None and not _on_this_host(rec):
            raise RuntimeError(f"cancel: app {app_id!r} runs on host {rec['host']!r}; cancel it from there")
        unrecorded = None
        try:
            store.write_json_atomic(
                job_dir / store.CANCEL,
                {"time": time.time(), "grace": self.cancel_grace_period, "pid": os.getpid(), "reason": reason},
            )
        except OSError as e:
            unrecorded = store.store_error(self.store.root, f"record the cancel of {app_id!r}", e)
        sup = _read_entry(app_id, job_dir / store.SUPERVISOR, _check_supervisor)
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
            self._cache.pop(app_id, None)
            job_dir = self.store.job_dir(app_id)
            try:
                sup = _read_entry(app_id, os.path.join(job_dir, store.SUPERVISOR), _check_supervisor)
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
            rec = self._record(app_id)
            if rec is None or self._state(app_id, rec)["state"] in _TERMINAL_NAMES:
                break
            self.wait_for_change(app_id, deadline - time.monotonic())
        with self._cache_lock:
            self._cache.pop(app_id, None)
        self.store.remove(app_id)


def _no_gpus_error(app: AppDef) -> InvalidSpecError:
    """The error of a job asking for GPUs on a host without any (refused at the dry run, unless
    the run option ``allow_no_gpus``): its replicas would run on the CPU, or fail, far from
    where the mistake was made."""
    asks = "; ".join(
        f"role {r.name!r} asks for {gpus.gpus_text(r.resource.gpu)} per replica ({r.num_replicas} replicas)"
        for r in app.roles
        if r.resource.gpu > 0
    )
    return InvalidSpecError(
        f"resource.gpu: {asks}, but this host has no GPU (none detected by nvidia-smi -L or "
        f"/proc/driver/nvidia/gpus; {gpus.GPUS_ENV} is unset or empty). Run it on a host with GPUs, "
        "ask for gpu=0, or set the run option allow_no_gpus=True to run it without GPUs"
    )


def _warn_shared_gpus(app: AppDef) -> None:
    """Warn that the GPU roles of ``app`` (those not setting ``CUDA_VISIBLE_DEVICES``
    themselves) will see every GPU of the host, as without ``auto_set_cuda_visible_devices``."""
    roles = [r.name for r in app.roles if r.resource.gpu > 0 and "CUDA_VISIBLE_DEVICES" not in r.env]
    if roles:
        warnings.warn(
            f"auto_set_cuda_visible_devices is off: the replicas of {', '.join(map(repr, roles))} (asking for GPUs) "
            "see every GPU of the host, also those other jobs use; set the run option "
            "auto_set_cuda_visible_devices=True to give each replica its own",
            UserWarning,
            stacklevel=4,
        )


def _read_entry(app_id: str, path: str | Path, check: Callable[[Any], str | None]) -> Any:
    """The JSON of a job's file ``<store>/<app_id>/<name>`` (None when missing), read only
    through real directories below the store (``store.open_inside``) and checked by ``check``
    (which returns why it is not valid, or None); ``store.CorruptEntryError`` naming the job
    and file if bad, swapped for a symbolic link or not a regular file."""
    try:
        value = store.read_json(path, os.path.dirname(os.path.dirname(path)))
    except store.UnsafeFileError as e:
        raise store.CorruptEntryError(app_id, path, e.why) from None
    except ValueError as e:
        raise store.CorruptEntryError(app_id, path, f"not JSON: {e}") from None
    except NotADirectoryError:
        raise store.CorruptEntryError(app_id, os.path.dirname(path), "a file, not a job directory") from None
    why = None if value is None else check(value)
    if why:
        raise store.CorruptEntryError(app_id, path, why)
    return value


def _check_record(rec: Any) -> str | None:
    """Why ``rec`` is not a ``request.json`` this scheduler wrote (None: it is)."""
    if not isinstance(rec, dict):
        return f"a JSON {type(rec).__name__}, not an object"
    for key, kind in _RECORD_KEYS.items():
        if not isinstance(rec.get(key), kind):
            return f"{key!r} is missing or not a {getattr(kind, '__name__', 'number')}"
    if not all(isinstance(r, dict) and isinstance(r.get("name"), str) for r in rec["roles"]):
        return "'roles' is not a list of roles"
    for role, params in rec["role_params"].items():
        if not isinstance(params, list) or not all(isinstance(p, dict) and "args" in p for p in params):
            return f"'role_params' of role {role!r} is not a list of replica parameters"
    return None


def _check_state(st: Any) -> str | None:
    """Why ``st`` is not a ``state.json`` the supervisor wrote (None: it is)."""
    if not isinstance(st, dict):
        return f"a JSON {type(st).__name__}, not an object"
    if st.get("state") not in AppState.__members__:
        return f"'state' is {st.get('state')!r}, not an app state"
    replicas = st.get("replicas", {})
    if not isinstance(replicas, dict) or not all(
        isinstance(reps, list) and all(_is_replica_state(r) for r in reps) for reps in replicas.values()
    ):
        return "'replicas' is not an object of lists of replica states"
    tracked = st.get("tracked", [])
    if not isinstance(tracked, list) or not all(
        isinstance(t, list) and len(t) == 2 and all(isinstance(x, int) for x in t) for t in tracked
    ):
        return "'tracked' is not a list of [pid, start] pairs"
    return None


def _is_replica_state(r: Any) -> bool:
    """Whether ``r`` is a replica's entry in ``state.json`` (a state, runs as objects)."""
    runs = r.get("attempts", []) if isinstance(r, dict) else None
    return (
        isinstance(r, dict)
        and r.get("state") in AppState.__members__
        and isinstance(runs, list)
        and all(isinstance(x, dict) for x in runs)
    )


def _check_supervisor(sup: Any) -> str | None:
    """Why ``sup`` is not a ``supervisor.json`` (None: it is)."""
    if not isinstance(sup, dict) or not all(isinstance(sup.get(k), int) for k in ("pid", "start")):
        return "not an object with an integer 'pid' and 'start'"
    return None


def _check_cancel(cancel: Any) -> str | None:
    """Why ``cancel`` is not a ``cancel.json`` (None: it is)."""
    if not isinstance(cancel, dict) or not isinstance(cancel.get("reason"), str | None):
        return "not an object whose 'reason' is a string or null"
    return None


def _unstarted_replica(app_state: str) -> dict[str, Any]:
    """The status of a replica the supervisor never started: PENDING while the job may still
    start it, else the job's end with a message saying it never ran."""
    if app_state not in _TERMINAL_NAMES:
        return {"state": "PENDING"}
    return {"state": app_state, "msg": f"never started: the job ended {app_state} before this replica ran"}


def _orphan_end(
    job_dir: Path, st: dict[str, Any] | None, sup: dict[str, Any] | None, strays: list[procfs.ProcInfo] | None = None
) -> dict[str, Any]:
    """The end of a job whose supervisor is gone (``sup``; None: it never started), from its
    last ``state.json`` (``st``): every unfinished replica FAILED, or CANCELLED when a cancel
    was requested, and why. ``strays``: the processes outside the replicas that ``finalize``
    stopped (None: nothing was stopped yet, as ``describe`` reports it)."""
    st = copy.deepcopy(st or _PENDING_STATE)
    replicas = st.get("replicas") or {}
    cancel = _read_entry(job_dir.name, job_dir / store.CANCEL, _check_cancel)
    final = "CANCELLED" if cancel is not None else "FAILED"
    for reps in replicas.values():
        for r in reps:
            if r["state"] not in _TERMINAL_NAMES:
                r["state"] = final
    if cancel is not None:
        why = f"{store.cancelled_msg(cancel)} (the supervisor ended before it could record it)"
    elif sup is None:
        why = f"the supervisor did not start within {SUPERVISOR_START_TIMEOUT:.0f} s"
    else:
        why = f"the supervisor (pid {sup['pid']}) died before the job ended"
        if strays is not None:
            why += "; its replicas were stopped"
        last = _last_words(job_dir / store.SUPERVISOR_LOG)
        if last:
            why += f"; its last words: {last}"
    if strays:
        shown = ", ".join(f"{p.pid} ({p.comm})" for p in strays[:10])
        more = f" and {len(strays) - 10} more" if len(strays) > 10 else ""
        why += f"; stopped {len(strays)} process(es) left outside the replicas: {shown}{more}"
    st.update(state=final, msg=why, ended=time.time(), replicas=replicas)
    return st


def _last_words(path: Path) -> str:
    """The last non-empty line of the end of ``path`` (the supervisor's log in the job's
    directory, read as the logs are: ``logs.open_log``), shortened."""
    try:
        fd = open_log(str(path), str(path.parent))
        if fd is None:
            return ""
        with open(fd, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - _LAST_WORDS_BYTES))
            tail = f.read().decode("utf-8", "replace")
    except (OSError, store.UnsafeFileError):
        return ""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _open_supervisor(sup: Mapping[str, Any]) -> int | None:
    """A pidfd of the supervisor ``sup`` (its store entry) if it still runs, else None."""
    return procfs.open_if_same(sup["pid"], sup["start"]) if sup.get("boot") == procfs.boot_id() else None


def _on_this_host(rec: dict[str, Any]) -> bool:
    """Whether the job was launched on this host (a job store may be shared, e.g. on NFS)."""
    return rec.get("host", socket.gethostname()) == socket.gethostname()


def _check_entrypoint(index: int, role: Role, param: ReplicaParam) -> None:
    """Raise ``InvalidSpecError`` unless the role's program exists and is executable."""
    program = param.args[0]
    if os.sep in program:
        path = os.path.join(param.cwd or os.getcwd(), program)
        found = os.path.isfile(path) and os.access(path, os.X_OK)
        where = f"{path!r} is not an executable file"
    else:
        search = param.env.get("PATH", os.environ.get("PATH", ""))
        found = shutil.which(program, path=search) is not None
        where = f"{program!r} is not an executable on PATH ({search})"
    if not found:
        raise InvalidSpecError(
            f"roles[{index}].entrypoint: role {role.name!r}: {where}; give an executable on PATH or a path to one"
        )


def create_scheduler(
    session_name: str,
    cache_size: int = 100,
    extra_paths: list[str] | None = None,
    image_provider_class: ImageProviderFactory = CWDImageProvider,
    **kwargs: Any,
) -> LocalScheduler:
    """A ``LocalScheduler`` (TorchX's factory). Recognised keyword arguments: ``backend``
    (default: ``local_dir`` for ``LocalDirectoryImageProvider``, else ``local_cwd``),
    ``cancel_grace_period``, ``device_count``, ``state_dir``; others are ignored."""
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
    )


def create_cwd_scheduler(session_name: str, **kwargs: Any) -> LocalScheduler:
    """The ``local_cwd`` scheduler: runs in the current directory, ignores images."""
    kwargs.update(image_provider_class=CWDImageProvider, backend="local_cwd")
    return create_scheduler(session_name, **kwargs)


def create_dir_scheduler(session_name: str, **kwargs: Any) -> LocalScheduler:
    """The ``local_dir`` scheduler: each role's image is an absolute local directory."""
    kwargs.update(image_provider_class=LocalDirectoryImageProvider, backend="local_dir")
    return create_scheduler(session_name, **kwargs)
