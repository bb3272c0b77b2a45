"""The per-job supervisor: ``python -I -S -c ... <job dir>`` (see ``supervisor_command``).

It runs in a session of its own, detached from whoever launched the job, so the job outlives
its launcher. It starts every replica (each in its own process group, with a parent-death
signal so that replicas die if the supervisor dies), copies their stdout/stderr into the
per-replica ``stdout``/``stderr``/``combined`` log files (whole lines only, so the combined
file never mixes two lines), records pids, start times and exit codes in ``state.json``,
applies fail-fast and the retry policies, honours a cancel (SIGTERM; the grace period is in
``cancel.json``), holds the job to its guards, kills what is left of the job at the end and
exits. What to do at each of these is ``policy.py``'s decision (pure functions); this module
applies it to processes and files.

With ``attempt_timeout`` (seconds, in the request), a replica that runs longer than that since
its start or restart is stopped like a failed replica (SIGTERM, SIGKILL after the grace
period): its role's retry policy restarts it (each attempt gets the full time) while
``max_retries`` allow, else the job is FAILED, saying so, and every replica is stopped. The
clock starts when the replica starts (not while the job waits for GPUs), as AWS Batch's runs
from an attempt's start.

With ``start_timeout`` (seconds) or ``max_gpu_hours`` in the request (the task's guards,
``core/guards.py``), the supervisor holds the job to them itself, whether anyone watches or
not: a job still waiting for its GPUs ``start_timeout`` after its submission (the request's
``created``), or whose replicas' GPU-hours (each replica's GPUs times its attempts' running
time) went over ``max_gpu_hours``, is stopped and ends CANCELLED, as a watcher's trip cancels
it, its ``state.json`` carrying the trip (``guard``: ``Trip.to_dict``'s fields), from which its
description gives the task the message a watcher's trip gives. The loop wakes at the moment a guard can trip
(``policy.next_guard_check``), so a job overruns by at most one wake-up.

No process outlives the job: the supervisor is the subreaper of its replicas, so every
process they start stays its descendant (an orphan is re-parented to it, not to pid 1); at the
end it kills its descendants until it has no child left. Every ``_TRACK_INTERVAL`` it records
the descendants that are not replicas in ``state.json`` (``tracked``), so that whoever
finalises the job after the supervisor was killed finds them too. Files and directories are
created owner-only (umask 077; the replicas get the launcher's umask back).

A restart (the retry policy, ``max_retries``) puts the reason in the job's ``msg`` while it
runs, and starts each restarted replica's log (stderr) with a line naming its new
``TORCHX_ATTEMPT`` and the reason (``RESTART_PREFIX``): the request's ``TORCHX_ATTEMPT`` (0
without one) plus the replica's restarts so far (docs/checkpoints.md).

It reserves room in the job directory (``.reserve``) and frees it to record its end when the
filesystem is full, so a job stopped by a full disk ends FAILED with that reason.

It is single-threaded: one ``select.poll`` loop over pidfds (replica exits), pipes (output)
and a signal wake-up pipe, so it never busy-polls.

A job's start waits for the supervisor's start-up, so that is kept small: standard library
only, started without ``site`` and isolated (``-I``: no environment variables, no working
directory on the path), and until the replicas run it imports only modules that load no others
(``_signal``, not ``signal`` and its enums). It reads the request the launcher hands it on its
stdin in ``marshal``'s format (``json`` loads ``re`` and ``enum``; it is imported once the
replicas run, to record their state). The launcher writes the job's files, the replicas' log
files and directories too, while this interpreter starts; the supervisor opens the logs once
the replicas run (their output waits in the pipes).
"""

from __future__ import annotations

import _signal
import ctypes
import marshal
import os
import select
import sys
import time

from airflow_provider_torchx.core.schedulers.local import policy, procfs, store

TYPE_CHECKING = False  # not ``typing``/``pathlib``: they would slow the start-up
if TYPE_CHECKING:
    from typing import Any

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_CHUNK = 1 << 16
#: A line longer than this is cut (written with a newline) so memory stays bounded.
_MAX_PARTIAL = 1 << 20
_STREAMS = ("stdout", "stderr")
#: How long to wait for the pipes of killed leftovers to close at the very end.
_DRAIN_TIMEOUT = 1.0
#: How often the descendants that are not replicas are recorded (seconds).
_TRACK_INTERVAL = 1.0
#: How often a stop checks whether the stopped trees' last processes have exited (seconds).
_WIND_DOWN_POLL = 0.05
#: The most rounds of the end-of-job sweep (each kills every descendant found).
_SWEEP_ROUNDS = 200
#: Space kept in the job directory for the last ``state.json``: this plus this per replica.
_RESERVE_BASE, _RESERVE_PER_REPLICA = 64 << 10, 512
_RESERVE = ".reserve"
#: The longest pause between tries to record the end in a store that refuses writes.
_RECORD_RETRY_MAX_S = 5.0


#: Each replica's attempt number (``core/checkpoints.py``'s ``ATTEMPT_ENV``): the request's value
#: (the attempts of the task instance's earlier jobs; 0 without one) plus this replica's restarts.
ATTEMPT_ENV = "TORCHX_ATTEMPT"

#: How a restarted replica's log starts its new attempt: ``<prefix> <attempt>: <why>``.
RESTART_PREFIX = "[airflow-torchx] restarted as TORCHX_ATTEMPT"

#: The end of the supervisor's ``-c`` code (``supervisor_command``, ``is_supervisor_of``).
_ENTRY = "from airflow_provider_torchx.core.schedulers.local.supervisor import main; main(sys.argv[1])"


def supervisor_command(job_dir: str) -> list[str]:
    """The argv that runs the supervisor of ``job_dir`` (without ``site``, isolated: fast
    start-up). It reads the request on its stdin (``read_request``)."""
    package_root = os.path.realpath(__file__)
    for _ in range(5):  # .../airflow_provider_torchx/core/schedulers/local/supervisor.py
        package_root = os.path.dirname(package_root)
    code = f"import sys; sys.path.insert(0, {package_root!r}); {_ENTRY}"
    return [sys.executable, "-I", "-S", "-c", code, job_dir]


def read_request(job_dir: str) -> dict[str, Any] | None:
    """The job's request: what ``request.json`` holds, as the launcher hands it on stdin
    (``marshal.dumps``); without it (the launcher died first), ``request.json`` itself. None:
    nothing to run (the launcher could not write the job, or there is no ``request.json``)."""
    chunks = []
    while chunk := os.read(0, _CHUNK):
        chunks.append(chunk)
    try:
        request: dict[str, Any] | None = marshal.loads(b"".join(chunks))
    except (EOFError, ValueError):  # nothing handed, or cut short
        request = store.read_json(os.path.join(job_dir, store.REQUEST), job_dir)
    return request


def is_supervisor_of(argv: list[str] | None, job_dir: str) -> bool:
    """Whether ``argv`` is that of the supervisor of ``job_dir`` (``supervisor_command``,
    whichever interpreter ran it): how a canceller knows the supervisor without the job's files."""
    return argv is not None and len(argv) >= 2 and argv[-1] == job_dir and argv[-2].endswith(_ENTRY)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class _Replica:
    """One replica slot: its parameters, current process, log files and state."""

    def __init__(self, role: str, idx: int, param: dict[str, Any]) -> None:
        self.role = role
        self.idx = idx
        self.param = param
        self.pid: int | None = None
        self.start: int | None = None
        self.pidfd = -1
        self.state = "PENDING"
        self.exit_code: int | None = None
        self.msg = ""
        self.stopping = False
        #: When (``time.monotonic``) this attempt runs out of ``attempt_timeout``; None: never.
        self.deadline: float | None = None
        self.timed_out = False
        self.pipes: dict[int, str] = {}
        self.partial: dict[str, bytes] = {s: b"" for s in _STREAMS}
        self.files: dict[str, int] = {}
        #: Each run of this replica: wall-clock start, end and exit code (usage summaries).
        self.attempts: list[dict[str, Any]] = []
        self.devices: str | None = None

    @property
    def running(self) -> bool:
        return self.pid is not None and self.pidfd >= 0

    @property
    def ident(self) -> tuple[int, int] | None:
        if self.pid is None or self.start is None:
            return None
        return (self.pid, self.start)

    def create_logs(self) -> None:
        """``store.create_logs`` for this replica (the launcher made them, unless it died first)."""
        store.create_logs([self.param.get(stream) for stream in (*_STREAMS, "combined")])

    def open_logs(self) -> None:
        for stream in (*_STREAMS, "combined"):
            path = self.param.get(stream)
            if path:
                self.files[stream] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def emit(self, stream: str, data: bytes) -> None:
        """Write whole lines of ``data`` (after what was pending) to the stream's and the
        combined log."""
        buf = self.partial[stream] + data
        cut = buf.rfind(b"\n") + 1
        if not cut and len(buf) > _MAX_PARTIAL:
            buf, cut = buf + b"\n", len(buf) + 1
        if cut:
            for key in (stream, "combined"):
                if key in self.files:
                    _write_all(self.files[key], buf[:cut])
        self.partial[stream] = buf[cut:]

    def flush(self, stream: str) -> None:
        """End the stream: its unterminated last line gets a newline."""
        if self.partial[stream]:
            self.emit(stream, b"\n")

    def describe(self) -> dict[str, Any]:
        out = {
            "pid": self.pid,
            "start": self.start,
            "state": self.state,
            "exit_code": self.exit_code,
            "attempts": self.attempts,
            "devices": self.devices,
        }
        if self.msg:
            out["msg"] = self.msg
        return out

    def never_ran(self, state: str) -> None:
        """End a replica that was never started in ``state``, saying so."""
        if self.state == "PENDING":
            self.state, self.msg = state, f"never started: the job ended {state} before this replica ran"


class Supervisor:
    """Runs the job in ``job_dir`` to its end (see the module docstring)."""

    def __init__(self, job_dir: str) -> None:
        self.dir = job_dir
        self.pid = os.getpid()
        self.poller = select.poll()
        self.handlers: dict[int, Any] = {}
        self.replicas: list[_Replica] = []
        self.final: str | None = None
        self.msg = ""
        self.num_restarts = 0
        self.retries_used: dict[str, int] = {}
        self.retry: dict[str, tuple[int, str]] = {}
        self.restart_group: list[_Replica] = []
        self.kill_at: float | None = None
        self.kill_session = False
        self.cancel_requested = False
        self.dirty = False
        self.base_env = dict(os.environ)
        self.started = time.time()
        self.grace = 10.0
        self.attempt_timeout: int | None = None
        #: The guards the supervisor holds the job to itself (see the module docstring).
        self.start_timeout: float | None = None
        self.max_gpu_hours: float | None = None
        self.submitted = self.started
        self.gpus_of: dict[str, int] = {}
        #: The guard that stopped the job (``policy.guard_trip``), recorded in ``state.json``.
        self.trip: dict[str, Any] | None = None
        self.self_start = procfs.start_time(self.pid)
        self.holds_gpus = False
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.umask = os.umask(0o077)  # the replicas get it back
        self.tracked: list[tuple[int, int]] = []
        self.tracked_at = 0.0
        self.strays: dict[tuple[int, int], str] = {}

    # ------------------------------------------------------------------ records

    def identity(self) -> dict[str, Any]:
        return {"pid": self.pid, "start": self.self_start, "boot": procfs.boot_id()}

    def write_state(self, state: str, ended: float | None = None) -> None:
        roles: dict[str, list[dict[str, Any]]] = {}
        for r in self.replicas:
            roles.setdefault(r.role, []).append(r.describe())
        record = {
            "state": state,
            "num_restarts": self.num_restarts,
            "msg": self.msg,
            "started": self.started,
            "ended": ended,
            "supervisor": self.identity(),
            "replicas": roles,
            "tracked": self.tracked,
        }
        if self.trip is not None:
            record["guard"] = self.trip
        store.write_json_atomic(os.path.join(self.dir, store.STATE), record)

    def reserve_room(self) -> None:
        """Keep room for the final ``state.json`` (best effort: none if the disk is full)."""
        path = os.path.join(self.dir, _RESERVE)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.posix_fallocate(fd, 0, _RESERVE_BASE + _RESERVE_PER_REPLICA * len(self.replicas))
            finally:
                os.close(fd)
        except OSError:
            self.free_room()

    def free_room(self) -> None:
        """Free the reserved room (before the last write)."""
        try:  # noqa: SIM105 - contextlib would cost start-up time
            os.unlink(os.path.join(self.dir, _RESERVE))
        except OSError:
            pass

    def track(self) -> None:
        """Record the descendants that are not replicas when they changed (see the module
        docstring); ``dirty`` makes the loop write them."""
        self.tracked_at = time.monotonic()
        replicas = {r.ident for r in self.replicas}
        found = sorted((p.pid, p.start) for p in procfs.descendants(self.pid) if (p.pid, p.start) not in replicas)
        if found != self.tracked:
            self.tracked = found
            self.dirty = True

    # ------------------------------------------------------------------ processes

    def launch_all(self, group: list[_Replica]) -> None:
        """Start (or restart) the replicas of ``group``, then read their start times (their
        identities): a read of a child's ``/proc`` entry waits for its exec, which would hold up
        the next fork. A replica that ended already has none (it is reaped, never signalled)."""
        for r in group:
            self.launch(r)
        for r in group:
            r.start = procfs.start_time(r.pid) if r.pid is not None else None

    def launch(self, r: _Replica) -> None:
        """Start (or restart) replica ``r``: fork, then exec in the child. Not ``subprocess``:
        importing it costs start-up time, and its ``Popen`` waits for each exec in turn."""
        env = dict(self.base_env)
        env.update(r.param["env"])
        env[store.JOB_ENV] = self.dir
        env[ATTEMPT_ENV] = str(_base_attempt(r.param["env"]) + len(r.attempts))
        if r.attempts:  # a restart: its log says so, and why, before the new attempt's lines
            r.flush("stderr")
            r.emit("stderr", f"{RESTART_PREFIX} {env[ATTEMPT_ENV]}: {self.msg}\n".encode(errors="replace"))
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        started = time.time()  # before the fork: the child may run before the parent resumes
        pid = os.fork()
        if pid == 0:
            self.exec_child(r.param, env, out_w, err_w)
        os.close(out_w)
        os.close(err_w)
        r.pid, r.exit_code, r.stopping, r.state = pid, None, False, "RUNNING"
        r.timed_out, r.msg = False, ""
        r.deadline = policy.attempt_deadline(time.monotonic(), self.attempt_timeout)
        r.start = None  # ``launch_all`` reads it
        r.attempts.append({"started": started, "ended": None, "exit_code": None})
        r.pidfd = os.pidfd_open(pid)
        self.watch(r.pidfd, lambda: self.reap(r))
        for fd, stream in ((out_r, "stdout"), (err_r, "stderr")):
            os.set_blocking(fd, False)
            r.pipes[fd] = stream
            self.watch(fd, lambda fd=fd: self.read_pipe(r, fd))
        self.dirty = True

    def exec_child(self, param: dict[str, Any], env: dict[str, str], out_w: int, err_w: int) -> None:
        """In the forked child: own process group, die with the supervisor, default signal
        dispositions, stdio to the pipes, then exec. Never returns; a failed exec is reported
        on stderr and exits 127 (126: not executable)."""
        code = 127
        try:
            os.umask(self.umask)
            os.setpgid(0, 0)
            self.libc.prctl(_PR_SET_PDEATHSIG, _signal.SIGKILL, 0, 0, 0)
            if os.getppid() != self.pid:
                os._exit(1)
            for sig in (_signal.SIGPIPE, _signal.SIGXFSZ):  # ignored by Python; exec keeps SIG_IGN
                _signal.signal(sig, _signal.SIG_DFL)
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            if param.get("cwd"):
                os.chdir(param["cwd"])
            os.execvpe(param["args"][0], param["args"], env)
        except BaseException as e:
            code = 126 if isinstance(e, PermissionError) else 127
            try:  # noqa: SIM105 - contextlib would cost start-up time
                os.write(err_w, f"airflow-torchx: cannot start {param['args'][0]!r}: {e}\n".encode())
            except OSError:
                pass
        finally:
            os._exit(code)

    def watch(self, fd: int, handler: Any) -> None:
        self.handlers[fd] = handler
        self.poller.register(fd, select.POLLIN)

    def unwatch(self, fd: int) -> None:
        self.poller.unregister(fd)
        del self.handlers[fd]
        os.close(fd)

    def read_pipe(self, r: _Replica, fd: int) -> bool:
        """Copy what the pipe holds into the logs; return whether it reached EOF."""
        stream = r.pipes[fd]
        while True:
            try:
                data = os.read(fd, _CHUNK)
            except BlockingIOError:
                return False
            if not data:
                r.flush(stream)
                del r.pipes[fd]
                self.unwatch(fd)
                return True
            r.emit(stream, data)

    def reap(self, r: _Replica) -> None:
        assert r.pid is not None
        code = os.waitstatus_to_exitcode(os.waitpid(r.pid, 0)[1])
        self.unwatch(r.pidfd)
        r.pidfd = -1
        for fd in list(r.pipes):
            self.read_pipe(r, fd)
        self.on_exit(r, code)

    def stop(self, targets: list[_Replica], session: bool) -> None:
        """SIGTERM the targets' process trees (and the whole session if ``session``); they
        get SIGKILL once the grace period is over."""
        running = [r for r in targets if r.running]
        if self.kill_at is None:  # no stop under way: every orphan now outlived its replica
            self.note_escaped()
        for r in running:
            r.stopping = True
        self.kill_session = self.kill_session or session
        if running or session:
            self.signal_job(running, _signal.SIGTERM, session)
            self.kill_at = time.monotonic() + self.grace

    def note_escaped(self) -> None:
        """Remember in ``strays`` the processes that escaped a replica's tree: the orphans the
        supervisor adopted (as the subreaper) from replicas that ended on their own, with their
        descendants. Called before a stop, so that the processes a stop orphans (the
        ``torchrun`` of an ``sh -c`` killed by the SIGTERM torchrun is still handling) are
        never counted."""
        replicas = {r.pid for r in self.replicas if r.running}
        escaped: set[int] = set()
        for p in procfs.descendants(self.pid):  # parents come before their children
            if (p.ppid == self.pid and p.pid not in replicas) or p.ppid in escaped:
                escaped.add(p.pid)
                self.strays[(p.pid, p.start)] = p.comm

    def winding_down(self) -> bool:
        """Whether a stop is under way and, every replica having ended, processes of the
        stopped trees are still exiting (they get the rest of the grace period)."""
        if self.kill_at is None or any(x.running for x in self.replicas):
            return False
        _reap_adopted()
        return bool(procfs.children(self.pid))

    def signal_job(self, targets: list[_Replica], sig: int, session: bool) -> None:
        roots = [r.ident for r in targets if r.ident]
        if session and self.self_start is not None:
            roots.append((self.pid, self.self_start))  # as subreaper, it adopted the orphans
        sid = self.pid if session else None
        if sig == _signal.SIGKILL:
            procfs.kill_job(sid, roots, exclude=self.pid)
            return
        # The session leader and subreaper is the ancestor of every process of its session:
        # its tree holds them, without a scan of every process on the host (``job_processes``),
        # which would cost each job's cancel a read of all of ``/proc`` (benchmarks/README.md:
        # 500 local jobs cancelled one after the other). A process the walk misses is killed by
        # ``finish``'s sweep.
        procs = procfs.tree(roots, exclude=self.pid)
        procfs.signal_all(procs if procs is not None else procfs.job_processes(sid, roots, exclude=self.pid), sig)

    def take_gpus(self, plan: dict[str, Any] | None) -> None:
        """Wait, PENDING and saying why, until the host's GPU ledger hands the job its devices
        (``gpus.take``), then give each GPU replica its own in ``CUDA_VISIBLE_DEVICES``. A
        cancel ends the wait (the job leaves the queue)."""
        if not plan:
            return
        from airflow_provider_torchx.core.schedulers.local import gpus  # only a GPU job pays for it

        root, app_id = os.path.split(self.dir)
        counts = [plan["roles"].get(r.role, 0) for r in self.replicas]
        while not self.cancel_requested and not self.hold_guards():
            got, why = gpus.take(root, app_id, self.identity(), plan)
            if got is not None:
                self.holds_gpus, self.msg = True, ""
                for r, chunk in zip(self.replicas, gpus.split(counts, got), strict=True):
                    if chunk:
                        r.devices = r.param["env"]["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, chunk))
                return
            if why != self.msg:
                self.msg = why
                self.write_state("PENDING")
            wait_ms = gpus.POLL_MS
            check = self.next_guard_check()
            if check is not None:  # start_timeout: wake at its deadline
                wait_ms = min(wait_ms, max(0, int((check - time.monotonic()) * 1000) + 1))
            for fd, _ in self.poller.poll(wait_ms):
                if fd in self.handlers:
                    self.handlers[fd]()
            # A canceller that came before this supervisor recorded itself sent no signal.
            self.cancel_requested = self.cancel_requested or os.path.exists(os.path.join(self.dir, store.CANCEL))
        gpus.release(root, app_id)

    def release_gpus(self) -> None:
        if self.holds_gpus:
            from airflow_provider_torchx.core.schedulers.local import gpus

            gpus.release(*os.path.split(self.dir))
            self.holds_gpus = False

    # ------------------------------------------------------------------ policy

    def on_exit(self, r: _Replica, code: int) -> None:
        r.exit_code = code
        r.attempts[-1].update(ended=time.time(), exit_code=code)
        end = policy.exited(code, timed_out=r.timed_out, stopping=r.stopping, attempt_timeout=self.attempt_timeout)
        r.state, r.msg, r.stopping = end.state, end.msg or r.msg, False
        if end.failure and self.final is None:
            self.on_failure(r, _exit_text(r.role, r.idx, code))
        self.dirty = True

    def time_out(self) -> None:
        """Fail each running replica whose attempt ran out of ``attempt_timeout`` (see the
        module docstring): stopped, then restarted or the end of the job, as ``on_failure``
        decides."""
        now = time.monotonic()
        for r in self.replicas:
            if self.final is None and r.running and not r.stopping and policy.is_timed_out(r.deadline, now):
                r.timed_out = True
                what = f"role {r.role!r} replica {r.idx} {policy.timed_out_text(self.attempt_timeout)} and was stopped"
                self.on_failure(r, what)

    def next_deadline(self) -> float | None:
        """The earliest ``attempt_timeout`` deadline of a running replica not being stopped."""
        deadlines = [r.deadline for r in self.replicas if r.running and not r.stopping and r.deadline is not None]
        return min(deadlines, default=None)

    def on_failure(self, r: _Replica, what: str) -> None:
        """Replica ``r``'s attempt failed (``what`` says how): restart its group or fail the
        job and stop every replica, as ``policy.after_failure`` decides."""
        max_retries, retry_policy = self.retry.get(r.role, (0, "APPLICATION"))
        used = self.retries_used.get(r.role, 0)
        decision = policy.after_failure(
            (r.role, r.idx),
            what,
            replicas=[(x.role, x.idx) for x in self.replicas],
            max_retries=max_retries,
            policy=retry_policy,
            retries_used=used,
            restarts=self.num_restarts,
        )
        if isinstance(decision, policy.Restart):
            self.retries_used[r.role] = used + 1
            self.num_restarts += 1
            group = [x for x in self.replicas if (x.role, x.idx) in decision.group]
            # In ``msg`` while the job runs, so the task log's progress notes show the restart and why.
            self.msg = decision.msg
            print(self.msg, file=sys.stderr)
            self.restart_group.extend(x for x in group if x not in self.restart_group)
            self.stop([x for x in group if x.running], session=False)
            return
        self.end("FAILED", decision.msg)

    def end(self, final: str, msg: str) -> None:
        """End the job ``final`` with ``msg``: no restart is left to do, every replica is stopped."""
        self.final, self.msg = final, msg
        self.restart_group = []
        self.stop([x for x in self.replicas if x.running], session=True)

    # ------------------------------------------------------------------ guards

    def guard_runs(self) -> list[tuple[float, list[tuple[float, float | None]]]]:
        """Each replica's GPUs and its attempts' ``(started, ended)`` (``policy.gpu_seconds``)."""
        return [(self.gpus_of.get(r.role, 0), [(a["started"], a["ended"]) for a in r.attempts]) for r in self.replicas]

    def guard_inputs(self) -> dict[str, Any]:
        """What ``policy.guard_trip`` and ``policy.next_guard_check`` decide from."""
        starts = [a["started"] for r in self.replicas for a in r.attempts]
        return {
            "start_timeout": self.start_timeout,
            "max_gpu_hours": self.max_gpu_hours,
            "submitted": self.submitted,
            "first_running": min(starts) if starts else None,
            "runs": self.guard_runs(),
        }

    def next_guard_check(self) -> float | None:
        """When (``time.monotonic``) a guard may next trip; None: no guard set, the job is
        ending already (its stop's grace period must not spin the loop), or none can trip."""
        if self.final is not None or (self.start_timeout is None and self.max_gpu_hours is None):
            return None
        wall = time.time()
        at = policy.next_guard_check(now=wall, **self.guard_inputs())
        return None if at is None else time.monotonic() + max(0.0, at - wall)

    def hold_guards(self) -> bool:
        """Stop the job if a guard tripped (``policy.guard_trip``), recording the trip (see the
        module docstring); return whether one did."""
        if self.final is not None or (self.start_timeout is None and self.max_gpu_hours is None):
            return False
        trip = policy.guard_trip(msg=self.msg, now=time.time(), **self.guard_inputs())
        if trip is None:
            return False
        self.trip = trip
        print(f"{policy.guard_msg(trip)}: {trip}", file=sys.stderr)
        self.end("CANCELLED", policy.guard_msg(trip))
        self.dirty = True
        return True

    def progress(self) -> None:
        """Act on what changed: restarts due, a cancel, success, the end."""
        if self.cancel_requested and self.final is None:
            try:
                cancel = store.read_json(os.path.join(self.dir, store.CANCEL), self.dir)
            except ValueError:  # not JSON, or swapped for a link: a cancel all the same
                cancel = None
            self.grace = policy.cancel_grace(cancel, self.grace)
            self.end("CANCELLED", store.cancelled_msg(cancel))
        self.time_out()
        self.hold_guards()
        if self.restart_group and not any(x.running for x in self.restart_group):
            group, self.restart_group = self.restart_group, []
            if not any(x.running for x in self.replicas):
                # A whole-job restart starts clean: what the last attempt left behind (a
                # torchrun agent's store, a daemon) would hold its ports and answer the new one.
                self.sweep()
            self.launch_all(group)
        if self.final is None and policy.succeeded([x.state for x in self.replicas]):
            self.final = "SUCCEEDED"
        if not any(x.running for x in self.replicas) and not self.winding_down():
            self.kill_at = None

    # ------------------------------------------------------------------ main loop

    def on_signal(self, signum: int, frame: object) -> None:
        self.cancel_requested = True

    def run(self) -> int:
        try:  # noqa: SIM105 - contextlib would cost start-up time
            os.setsid()
        except PermissionError:  # already a session leader
            pass
        # Orphans of the replicas (even those that left the session) become our children.
        self.libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        os.set_blocking(wake_r, False)
        for sig in (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP):
            _signal.signal(sig, self.on_signal)
        _signal.set_wakeup_fd(wake_w)
        self.watch(wake_r, lambda: os.read(wake_r, 512))
        request = read_request(self.dir)  # the launcher writes the job's files meanwhile
        if request is None:  # the launcher removes the job: nothing of it is touched
            return 0
        if not os.path.exists(os.path.join(self.dir, store.SUPERVISOR)):  # the launcher died first
            store.write_json_atomic(os.path.join(self.dir, store.SUPERVISOR), self.identity())
        self.grace = float(request.get("cancel_grace_period", 10.0))
        self.attempt_timeout = request.get("attempt_timeout")
        self.start_timeout, self.max_gpu_hours = request.get("start_timeout"), request.get("max_gpu_hours")
        self.submitted = float(request.get("created") or self.started)
        for role in request["roles"]:
            self.gpus_of[role["name"]] = max(0, int((role.get("resource") or {}).get("gpu") or 0))
            self.retry[role["name"]] = (int(role.get("max_retries", 0)), str(role.get("retry_policy", "APPLICATION")))
        for role_name, params in request["role_params"].items():
            for idx, param in enumerate(params):
                self.replicas.append(_Replica(role_name, idx, param))
        if os.path.exists(os.path.join(self.dir, store.CANCEL)):
            self.cancel_requested = True
        else:
            self.take_gpus(request.get("gpus"))
        for r in self.replicas:
            r.create_logs()
        if not self.cancel_requested and self.final is None:
            self.launch_all(self.replicas)
        # The replicas run meanwhile: their output waits in the pipes until the loop reads it.
        for r in self.replicas:
            r.open_logs()
        self.reserve_room()
        while True:
            self.progress()
            if self.dirty:  # once per round of events: replicas often end together
                try:
                    self.write_state("RUNNING")
                    self.dirty = False
                except OSError:  # a full or read-only store: next round; record_end keeps the end
                    pass
            if self.final is not None and not any(x.running for x in self.replicas) and self.kill_at is None:
                break
            wake_at = self.tracked_at + _TRACK_INTERVAL
            for deadline in (self.next_deadline(), self.next_guard_check()):
                if deadline is not None:
                    wake_at = min(wake_at, deadline)
            if self.kill_at is not None:
                wake_at = min(wake_at, self.kill_at)
                if not any(x.running for x in self.replicas):  # orphans exit without a wake-up
                    wake_at = min(wake_at, time.monotonic() + _WIND_DOWN_POLL)
            for fd, _ in self.poller.poll(max(0, int((wake_at - time.monotonic()) * 1000) + 1)):
                if fd in self.handlers:
                    self.handlers[fd]()
            if time.monotonic() >= self.tracked_at + _TRACK_INTERVAL:
                self.track()
            if self.kill_at is not None and time.monotonic() >= self.kill_at:
                stopping = [x for x in self.replicas if x.running and x.stopping]
                self.signal_job(stopping, _signal.SIGKILL, self.kill_session)
                self.kill_at = None
        self.finish()
        return 0

    def finish(self) -> None:
        """Kill what is left of the job, drain the pipes, write the final state. Without a
        stop, whatever is left escaped the replicas' trees (they all ended): it is named."""
        if not self.kill_session:
            self.note_escaped()
        self.sweep()
        deadline = time.monotonic() + _DRAIN_TIMEOUT
        while any(r.pipes for r in self.replicas) and time.monotonic() < deadline:
            for fd, _ in self.poller.poll(50):
                if fd in self.handlers:
                    self.handlers[fd]()
        for r in self.replicas:
            for stream in _STREAMS:
                r.flush(stream)
            for fd in r.files.values():
                os.close(fd)
            r.never_ran(self.final or "FAILED")
        self.release_gpus()
        _reap_adopted()
        if self.strays:
            shown = ", ".join(f"{pid} ({comm})" for (pid, _), comm in list(self.strays.items())[:10])
            more = f" and {len(self.strays) - 10} more" if len(self.strays) > 10 else ""
            left = f"stopped {len(self.strays)} process(es) left behind by the replicas: {shown}{more}"
            self.msg = f"{self.msg}; {left}" if self.msg else left
        self.tracked = []
        self.free_room()
        self.record_end(self.final or "FAILED", time.time())

    def record_end(self, state: str, ended: float) -> None:
        """Write the final state; while the store refuses (full, read-only), try again, ever
        less often (every process of the job is stopped already): a waiter learns of the end
        once it is recorded."""
        pause = 0.1
        while True:
            try:
                self.write_state(state, ended=ended)
                return
            except OSError:
                time.sleep(pause)
                pause = min(pause * 2, _RECORD_RETRY_MAX_S)

    def sweep(self) -> None:
        """SIGKILL every descendant, round after round, until none is left (as the subreaper,
        every process of the job that is left is one), at most ``_SWEEP_ROUNDS`` rounds. A
        round can miss a process forked while it walked the tree; the next finds it, re-parented
        to us."""
        for _ in range(_SWEEP_ROUNDS):
            _reap_adopted()
            kids = procfs.children(self.pid)
            if kids is None:
                break
            if not kids:
                return
            procfs.signal_all(procfs.descendants(self.pid), _signal.SIGKILL)
            time.sleep(0.001)
        self.signal_job([], _signal.SIGKILL, session=True)  # the kernel does not list children


def _reap_adopted() -> None:
    """Reap every exited child: adopted orphans (replicas are reaped through their pidfds
    before this is called)."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def _base_attempt(env: dict[str, str]) -> int:
    """The request's ``TORCHX_ATTEMPT`` (0 when it has none or it is not a number >= 0)."""
    try:
        return max(int(env.get(ATTEMPT_ENV) or 0), 0)
    except ValueError:
        return 0


def _exit_text(role: str, idx: int, code: int) -> str:
    """``policy.exit_text``, with the name of the signal that killed the replica."""
    name = None
    if code < 0:
        from signal import Signals  # its enums load once a replica was killed, not at start-up

        try:  # noqa: SIM105 - contextlib would cost start-up time
            name = Signals(-code).name
        except ValueError:
            pass
    return policy.exit_text(role, idx, code, name)


def main(job_dir: str) -> None:
    """Entry point: supervise the job in ``job_dir`` and exit; on an internal error, stop the
    job and record it as FAILED with the reason (exit status 1)."""
    code = _supervise(job_dir)
    try:  # noqa: SIM105 - contextlib would cost start-up time
        sys.stderr.flush()
    except OSError:  # a full disk
        pass
    # Skip the interpreter's teardown: waiters learn of the end when this process is gone.
    os._exit(code)


def _supervise(job_dir: str) -> int:
    sup = Supervisor(job_dir)
    try:
        return sup.run()
    except Exception as e:
        sup.sweep()
        try:  # noqa: SIM105 - contextlib would cost start-up time
            sup.release_gpus()
        except OSError:
            pass
        sup.msg = f"the supervisor failed: {type(e).__name__}: {e}; the job was stopped"
        for r in sup.replicas:
            r.never_ran("FAILED")
            if r.state == "RUNNING":
                r.state = "FAILED"
        sup.tracked = []
        sup.free_room()  # a full disk: the reserved room holds the last state
        try:  # noqa: SIM105 - contextlib would cost start-up time
            sup.write_state("FAILED", ended=time.time())
        except OSError:
            pass
        try:  # the log may be on the full disk too
            import traceback

            traceback.print_exc()
            sys.stderr.flush()
        except OSError:
            pass
        return 1
