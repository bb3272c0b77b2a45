"""The contract every scheduler backend meets.

A backend subclasses ``Scheduler`` and implements the required core, TorchX's handful of
abstract methods (``_run_opts``, ``_submit_dryrun``, ``schedule``, ``describe``, ``list``,
``_cancel_existing``); every other method has a default a backend may replace. A capability it
declares (``SchedulerCapabilities``) promises methods of its own (``CAPABILITY_METHODS``),
checked when the class is made, as is ``list``'s signature: a ``TypeError`` names the class,
what it declared and what it misses. Each public method's docstring lists its behaviours and
assumptions: what it guarantees, what it raises and whether it blocks. The ``Runner`` only
talks to backends through this contract.
"""

from __future__ import annotations

import abc
import builtins
import concurrent.futures
import contextlib
import enum
import inspect
import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from airflow_provider_torchx.core.checkpoints import app_checkpoint_dir
from airflow_provider_torchx.core.errors import UnknownAppError, shown
from airflow_provider_torchx.core.runopts import Cfg, CfgVal, runopts
from airflow_provider_torchx.core.specs import AppDef, AppDryRunInfo, AppState, Role, RoleStatus, validate_app
from airflow_provider_torchx.core.usage import Usage

if TYPE_CHECKING:
    import asyncio

    from airflow_provider_torchx.core.checkpoint_prune import Use as CheckpointUse
    from airflow_provider_torchx.core.guards import Trip

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


class Stream(str, enum.Enum):
    """Which output of a replica to read."""

    STDOUT = "stdout"
    STDERR = "stderr"
    COMBINED = "combined"


class CancelledBy(str, enum.Enum):
    """Who asked for a cancel, as the job's record keeps it (``Scheduler.cancel(by=...)``): a
    closed vocabulary, so that a watcher tells its task's own cancel from one made outside it
    by what was recorded, never by the wording of a reason."""

    #: The task itself: its timeout, its kill (``on_kill``, a trigger cancelled while the task
    #: is no longer deferred), a guardrail.
    TASK = "task"
    #: The orphaned-jobs rule (``orphans.decide``), applied by the reaper or by a trigger's
    #: start check: the job's task instance ended.
    REAPER = "reaper"
    #: A person: the CLI, the UI's jobs page.
    USER = "user"

    @classmethod
    def parse(cls, value: object) -> CancelledBy | None:
        """The member a record holds (``"task"``, ...); None for anything else."""
        return next((member for member in cls if member.value == value), None)


@dataclass
class DescribeAppResponse:
    """What a scheduler knows of an app: its state and why, its roles and their replicas'
    states, and the labels it was submitted with."""

    app_id: str = "<NOT_SET>"
    state: AppState = AppState.UNSUBMITTED
    num_restarts: int = -1
    msg: str = ""
    structured_error_msg: str = ""
    ui_url: str | None = None
    roles_statuses: list[RoleStatus] = field(default_factory=list)
    roles: list[Role] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    #: A cancel was requested through this scheduler (such a job is never adopted again).
    cancel_requested: bool = False
    #: Who or what asked for the cancel, as given to ``cancel(reason=...)`` (None: no cancel
    #: was requested, none was given, or the backend could not keep it).
    cancel_reason: str | None = None
    #: Who asked for the cancel, as given to ``cancel(by=...)`` (None: no cancel was
    #: requested, it did not say, or the backend could not keep it).
    cancelled_by: CancelledBy | None = None
    #: What the job cost (``core/usage.py``), once it ended and where the scheduler knows it.
    usage: Usage | None = None
    #: What a live job has cost so far (attempts still running have no end: see
    #: ``Usage.gpu_hours_at``) and when it was submitted; None once it ended, or unknown.
    usage_so_far: Usage | None = None
    #: When the app started running and when it ended (epoch seconds; None: not yet, or unknown).
    started: float | None = None
    ended: float | None = None
    #: When the app was submitted (epoch seconds; None: unknown).
    created: float | None = None
    #: Where the job checkpoints (``TORCHX_CHECKPOINT_DIR`` of its roles, ``core/checkpoints.py``;
    #: None: it was given none). Read from ``roles`` when not given.
    checkpoint_dir: str | None = None
    #: The guard the scheduler stopped the job for itself (``core/guards.py``: the task's
    #: ``start_timeout`` or ``max_gpu_hours``, handed over as run options); None: none did.
    guard_trip: Trip | None = None
    #: Why the scheduler refused the app's record when a cancel reached it all the same
    #: (``RecordRefusedError``'s message; ``cancel``, guarantee 5): its end, readable again
    #: once written over the refused file, still says it was stopped unwatched, and no retry
    #: follows it with another job. None: no cancel reached it while its record was refused.
    stopped_while_refused: str | None = None

    def __post_init__(self) -> None:
        if self.checkpoint_dir is None:
            self.checkpoint_dir = app_checkpoint_dir(self.roles)


@dataclass
class ListAppResponse:
    """One app in ``Scheduler.list``; the runner fills in ``app_handle``."""

    app_id: str
    state: AppState
    app_handle: str = "<NOT_SET>"
    name: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    #: When the app was submitted (epoch seconds; None: unknown).
    created: float | None = None
    #: When the app started running and when it ended (epoch seconds; None: not yet, or unknown).
    started: float | None = None
    ended: float | None = None
    #: Why the scheduler refuses the app's record (``RecordRefusedError``'s message), for an
    #: app listed while it may still run all the same: its state is then ``UNKNOWN``, and its
    #: name, labels and submission time are what could still be read (empty when none);
    #: None: its record was read.
    refused: str | None = None
    #: The ``start_timeout`` (seconds) the app was submitted with where the scheduler cannot
    #: hold it itself (``core/guards.py``): the reaper holds it. None: none, or the scheduler's own.
    start_timeout: float | None = None


def cursor_object(cursor: str | bytes) -> dict[str, Any]:
    """The JSON object a log cursor holds (every backend's cursor is one flat object);
    ``ValueError`` when it holds none: not JSON, not an object, or nested deeper than the
    parser goes (``RecursionError``, which would otherwise escape as a crash)."""
    try:
        value = json.loads(cursor)
    except RecursionError:
        raise ValueError("nested too deep") from None
    if not isinstance(value, dict):
        raise ValueError(f"a JSON {type(value).__name__}, not an object")
    return value


@dataclass
class LogChunk:
    """Lines read from a cursor, the cursor to read on from, and whether the log is over.

    ``lines`` each end in ``"\\n"``; ``cursor`` is an opaque JSON string; ``eof`` is true once
    the app is terminal and every line was returned (a tailer can stop). ``behind_s``: how many
    seconds what was read so far may lag the log (0: caught up), when the backend shares a
    read budget and knows (AWS Batch); None: not known, or no such lag.
    """

    lines: list[str]
    cursor: str
    eof: bool
    behind_s: float | None = None


@dataclass(frozen=True)
class SchedulerCapabilities:
    """What a watcher of this scheduler's jobs must know of it (the Airflow layer and the CLI
    act on these, never on a scheduler's name; docs/architecture.md, "Capabilities, not names").

    - ``host_bound``: jobs run on the submitting host and can only be watched from there (a
      deferred task must be watched by a triggerer on the same host).
    - ``cheap_status``: ``describe`` is a quick local read that never waits on a remote
      service, so an event loop may call it directly.
    - ``aws_session``: the factory takes ``session_factory=``, a zero-argument callable
      returning a boto3 session built from the connection's AWS settings (``aws_conn_id``,
      ``region_name``); it is called only when AWS is used.
    - ``error_files``: every replica gets ``TORCHELASTIC_ERROR_FILE`` (torchrun's error file,
      ``core/errorfile.py``) naming a file this host can read, which ``Scheduler.read_error_file``
      returns: a failed job's root cause is read from it.
    - ``separate_stderr``: logs are read with ``Stream.STDERR`` apart from stdout (the root
      cause shows the node's stderr from it; without, from the combined log).
    - ``prune``: the scheduler keeps records of ended jobs that it can remove
      (``Scheduler.prune``): ``airflow-torchx prune`` and ``[torchx] retain_finished`` remove
      those that ended long enough ago, through the contract alone.
    - ``shared_paths``: jobs run on other hosts that see this host's paths at the same place
      (a cluster's shared file systems, where ``job_dir`` lives): a checkpoint location may be
      a plain path, created here, without a mount (``checkpoints.place``).
    - ``prices_attempts``: without rates, a live job's description prices its running attempts
      itself (``usage_so_far``'s ``Attempt.price_per_hour``, or ``Attempt.no_price`` where it
      cannot): a ``max_cost`` guard can be held without rates (``Guards.require_priced``).

    What a DAG file's parse-time checks need (a literal ``cfg``) cannot wait for the scheduler
    to load: a scheduler declares its run options for them under its own name in the entry
    point group ``airflow_provider_torchx.run_options`` (``runner.RUN_OPTIONS_ENTRY_POINT_GROUP``),
    naming a light function that returns the same ``runopts`` as ``Scheduler.run_opts``.
    """

    host_bound: bool = False
    cheap_status: bool = False
    aws_session: bool = False
    error_files: bool = False
    separate_stderr: bool = False
    prune: bool = False
    shared_paths: bool = False
    prices_attempts: bool = False

    @property
    def host_paths(self) -> bool:
        """Whether the jobs see this host's paths as they are (``host_bound`` or
        ``shared_paths``): a path given to a job needs no mount."""
        return self.host_bound or self.shared_paths


#: The methods a capability makes the watchers call, which a scheduler declaring it must define
#: itself (``Scheduler``'s defaults answer "none here"): ``error_files``, the error file's read;
#: ``separate_stderr``, a log read by stream (``Stream.STDERR``, through ``log_iter``);
#: ``prune``, the removal of ended jobs' records.
CAPABILITY_METHODS: Mapping[str, tuple[str, ...]] = {
    "error_files": ("read_error_file",),
    "separate_stderr": ("log_iter",),
    "prune": ("prune",),
}


def _same(described: DescribeAppResponse | None) -> DescribeAppResponse | None:
    return described


def settle(future: concurrent.futures.Future[T], compute: Callable[[], T]) -> None:
    """Resolve ``future`` with what ``compute()`` returns or raises, unless its waiter
    cancelled it (then ``compute`` is not called)."""
    if not future.set_running_or_notify_cancel():
        return
    try:
        future.set_result(compute())
    except BaseException as err:
        future.set_exception(err)


def settle_on_loop(loop: asyncio.AbstractEventLoop, future: asyncio.Future[T], compute: Callable[[], T]) -> None:
    """``settle`` for an asyncio ``future`` of ``loop``, from any thread: ``compute()`` runs
    here, its result or error is set on the loop. Nothing happens if the waiter cancelled the
    future, or when the loop is closed (nobody waits any more)."""
    if future.cancelled():
        return
    try:
        value, error = compute(), None
    except BaseException as err:
        value, error = None, err
    with contextlib.suppress(RuntimeError):  # the loop is closed
        loop.call_soon_threadsafe(_resolve, future, value, error)


def _resolve(future: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(value)
    else:
        future.set_exception(error)


def filter_regex(regex: str | None, lines: Iterable[str]) -> Iterable[str]:
    """The lines matching ``regex`` (all when it is None)."""
    if not regex:
        return lines
    pattern = re.compile(regex)
    return (line for line in lines if pattern.search(line))


def labels_match(have: Mapping[str, str], want: Mapping[str, str] | None) -> bool:
    """Whether a job's labels ``have`` include every ``want`` pair."""
    return all(have.get(k) == v for k, v in (want or {}).items())


def newest(apps: Iterable[ListAppResponse], limit: int | None) -> list[ListAppResponse]:
    """``apps`` oldest first (by ``created``, then app id), only the newest ``limit`` of them
    (None: all); what ``Scheduler.list`` returns."""
    ordered = sorted(apps, key=_created_key)
    return ordered if limit is None else ordered[max(0, len(ordered) - limit) :]


def _created_key(app: ListAppResponse) -> tuple[float, str]:
    return (app.created or 0.0, app.app_id)


class Scheduler(abc.ABC, Generic[T]):
    """A scheduler backend, named ``backend``, for jobs of one session (``session_name``)."""

    #: Whether ``build_workspace_image`` builds roles' workspaces into images.
    supports_workspace: bool = False
    #: What watchers need to know of this scheduler (the default: none of the special cases).
    capabilities: ClassVar[SchedulerCapabilities] = SchedulerCapabilities()

    def __init__(self, backend: str, session_name: str) -> None:
        self.backend = backend
        self.session_name = session_name

    # ------------------------------------------------------------------ submit

    def run_opts(self) -> runopts:
        """The run options this scheduler accepts (types, defaults, help, required)."""
        return self._run_opts()

    @abc.abstractmethod
    def _run_opts(self) -> runopts: ...

    def submit_dryrun(
        self, app: AppDef, cfg: Cfg | None = None, labels: Mapping[str, str] | None = None
    ) -> AppDryRunInfo[T]:
        """Render ``app`` into this scheduler's native request without submitting it.

        1. ``cfg`` is resolved against ``run_opts()`` (defaults filled, types checked,
           required options present) before anything else: ``InvalidRunConfigError``.
        2. The app is validated (``validate_app`` and the backend's ``_validate``); invalid
           input raises a ``ValueError`` subclass naming the field (``InvalidSpecError``,
           ``InvalidRunConfigError``). Nothing is submitted.
        3. Each role's ``pre_proc`` may edit the request.
        4. ``app`` is used as given (the runner passes its own deep copy); the result carries
           it as ``info.app``, with the resolved cfg and ``labels``.
        5. Never blocks on a remote service.
        """
        resolved = self.run_opts().resolve(cfg)
        validate_app(app)
        self._validate(app, self.backend, resolved)
        checked_labels = {str(k): str(v) for k, v in (labels or {}).items()}
        info = self._submit_dryrun(app, resolved, checked_labels)
        for role in app.roles:
            info = role.pre_proc(self.backend, info)
        info._app = app
        info._cfg = resolved
        info._scheduler = self.backend
        info.labels = checked_labels
        return info

    @abc.abstractmethod
    def _submit_dryrun(self, app: AppDef, cfg: dict[str, CfgVal], labels: dict[str, str]) -> AppDryRunInfo[T]: ...

    def _validate(self, app: AppDef, scheduler: str, cfg: dict[str, CfgVal]) -> None:
        """Backend-specific checks (raise a ``ValueError`` subclass naming the field)."""

    @abc.abstractmethod
    def schedule(self, dryrun_info: AppDryRunInfo[T]) -> str:
        """Submit a dry-run request; return the app id.

        1. Submits ``dryrun_info.request`` as is (edits to ``dryrun_info.app`` are ignored).
        2. Returns once the scheduler accepted the job; does not wait for it to start.
        3. The app id never contains ``/`` or ``..``.
        4. A job the scheduler refuses before submitting it raises, leaving nothing behind:
           ``InvalidRunConfigError`` (``JobWontFitError``, ``UnknownQueueError``: its queue
           cannot run it), ``SchedulerSetupError`` (this host's setup), ``StoreError`` (the
           scheduler's own store of jobs cannot be written).
        """

    def submit(self, app: AppDef, cfg: Cfg | None = None, labels: Mapping[str, str] | None = None) -> str:
        """``schedule(submit_dryrun(app, cfg, labels))``."""
        return self.schedule(self.submit_dryrun(app, cfg, labels))

    def build_workspace_image(self, role: Role, cfg: Mapping[str, CfgVal]) -> str | None:
        """Build ``role.workspace`` into ``role.image``; return the new image, or None when
        this scheduler has no workspace support (the default). Does not edit ``role``."""
        return None

    # ------------------------------------------------------------------ observe

    @abc.abstractmethod
    def describe(self, app_id: str) -> DescribeAppResponse | None:
        """The app's state, roles and replica statuses, or None if there is no such app.

        1. Never raises for an unknown app id (returns None); a setup error of the scheduler
           (no credentials, a queue that does not exist) raises ``SchedulerSetupError``; a
           record of the app the scheduler cannot read raises ``CorruptEntryError`` (``cancel``
           and ``delete`` still act on such an app).
        2. ``msg`` names the failed role/replica and its exit code or the scheduler's reason.
        3. May block for one round trip to the scheduler.
        """

    def finalize(self, app_id: str) -> DescribeAppResponse | None:
        """Settle a job that ended without its scheduler recording the end (a local job whose
        supervisor died): stop what is left of it and record the end; return its description
        then, or None when there was nothing to settle (the default: the backend records
        every end itself).

        1. ``describe`` already reports such a job as ended; this is what acts on it.
        2. Blocks (may scan processes, kill and write): call it off any event loop, from
           whoever acts on a job's end (``Runner.wait``, a watcher's outcome, ``cancel``).
        """
        return None

    def describe_future(
        self, app_id: str, period: float | None = None
    ) -> concurrent.futures.Future[DescribeAppResponse | None] | None:
        """What ``describe`` would return, as a future resolved by a thread of the scheduler's
        own, so that many waiters (an event loop's tasks) hold no thread while they wait.

        1. Never blocks; returns None when the scheduler cannot answer this way (the default,
           or an app it cannot resolve without a blocking call): then call ``describe``.
        2. The future fails with the exception ``describe`` would raise.
        3. A future the caller cancelled is left alone.
        4. ``period`` None: a recent answer (the scheduler's cache or its next look). A
           ``period``: the answer of the scheduler's next look at the app, one ``period`` after
           its previous one (a watcher that asks again at once is looked at every ``period``,
           on the scheduler's schedule, not its own), or of any earlier look that sees it ended.

        A scheduler implements ``describe_future_as``; this is it without a mapping.
        """
        return self.describe_future_as(app_id, _same, period)

    def describe_future_as(
        self, app_id: str, then: Callable[[DescribeAppResponse | None], R], period: float | None = None
    ) -> concurrent.futures.Future[R] | None:
        """``describe_future`` whose future holds what ``then`` returns (or raises) for the
        answer, applied on the scheduler's thread: a watcher that wants less than the
        description (``Runner.status_on_loop``: the status) gets one future per look, not a
        chain. The same guarantees; the default: None."""
        return None

    def describe_on_loop_as(
        self,
        app_id: str,
        then: Callable[[DescribeAppResponse | None], R],
        loop: asyncio.AbstractEventLoop,
        period: float | None = None,
    ) -> asyncio.Future[R] | None:
        """``describe_future_as`` as a future of ``loop``, the running event loop (call it
        there), resolved on the loop: what a watcher on a loop awaits. The same guarantees;
        cancelling the future cancels the look. The default wraps ``describe_future_as``'s
        future (``asyncio.wrap_future``: two futures and a few callbacks per look); a
        scheduler answering many waiting looks resolves the loop's future itself
        (``settle_on_loop``), since whatever a look holds lives a whole poll."""
        import asyncio

        future = self.describe_future_as(app_id, then, period)
        return None if future is None else asyncio.wrap_future(future, loop=loop)

    def native_id(self, app_id: str) -> str | None:
        """The scheduler's own id of the app (AWS Batch: the job id), for a watcher in another
        process to hand to ``adopt_native_id`` so that it finds the app without a look-up;
        None (the default): the app id is all a watcher needs. May block for one look-up."""
        return None

    def wait_reason(self, app_id: str) -> str:
        """Why the app has not started yet, beyond its status message: what the scheduler can
        tell of what holds it (AWS Batch: the queue's and its compute environments' states and
        whether the job fits them). Asked once, when ``start_timeout`` trips; may block for a
        few calls; the default: nothing more to say."""
        return ""

    def adopt_native_id(self, app_id: str, native_id: str) -> None:
        """Take ``native_id`` (what ``native_id`` returned in another process) as the app's
        own id, so that watching it needs no look-up. Never blocks; the default ignores it."""

    def check_settings(self, cfg: Mapping[str, CfgVal]) -> str:
        """Check that jobs can be submitted with the resolved ``cfg`` (e.g. that a queue
        exists and runs jobs); return what was checked. Raises a ``ValueError`` subclass
        naming the field for a bad setting (``InvalidRunConfigError``, ``UnknownQueueError``),
        ``SchedulerSetupError`` for this host's setup. Used by a connection's test; may block
        for a round trip to the scheduler. The default checks nothing beyond ``cfg`` itself."""
        return f"scheduler {self.backend} is available; cfg {dict(cfg)} is valid"

    def describe_native(self, app_id: str) -> AppDryRunInfo[T] | None:
        """The native request read back for a submitted app, or None (unknown app, or the
        backend cannot read requests back: the default)."""
        return None

    def exists(self, app_id: str) -> bool:
        """Whether the scheduler knows the app."""
        return self.describe(app_id) is not None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Check the class against the contract when it is made (``check_contract``)."""
        super().__init_subclass__(**kwargs)
        check_contract(cls)

    @abc.abstractmethod
    def list(
        self, cfg: Cfg | None = None, labels: Mapping[str, str] | None = None, *, limit: int | None = None
    ) -> list[ListAppResponse]:
        """The apps of this scheduler whose labels include every ``labels`` pair, oldest first
        (by ``created``, then app id).

        ``cfg`` may narrow where to look (e.g. one Batch queue). ``limit``: only the newest
        ``limit`` matches, and a backend does work in proportion to them where it can (no
        answer built for the others); None: every match. Not a page: there is no cursor.
        """

    def count(self, cfg: Cfg | None = None, labels: Mapping[str, str] | None = None) -> int:
        """How many apps ``list(cfg, labels)`` returns, for a caller that shows only the newest
        and says how many it hid. The default lists them; a backend that can count without
        building the answers (local) does."""
        return len(self.list(cfg, labels))

    def list_live(self, cfg: Cfg | None = None) -> builtins.list[ListAppResponse]:
        """The apps of this scheduler that have not ended (whatever their labels), for a
        caller that looks at every live job in rounds (the orphaned-jobs reaper). The default
        filters ``list``; a backend that keeps ended jobs around (Batch) asks for live ones only."""
        return [app for app in self.list(cfg) if not app.state.is_terminal()]

    def wait_for_change(self, app_id: str, timeout: float) -> None:
        """Block up to ``timeout`` seconds or until the app may have changed state.

        The default sleeps; a backend that can be notified returns early, which lets
        ``Runner.wait`` learn of the end at once whatever its poll interval.
        """
        time.sleep(max(0.0, timeout))

    def change_fd(self, app_id: str) -> int | None:
        """A file descriptor that becomes readable when the app may have changed state (at
        least: when it ended), for an event loop to wait on (``loop.add_reader``) instead of
        sleeping a whole poll; the caller closes it. Quick: never waits on a remote service.
        None (the default): there is none, poll."""
        return None

    def read_error_file(self, app_id: str, role_name: str, k: int) -> tuple[str, float] | None:
        """The text of torchrun's error file of replica ``k`` of ``role_name`` (its
        ``TORCHELASTIC_ERROR_FILE``) and when it was written (epoch seconds), for a scheduler
        with the ``error_files`` capability. The scheduler reads it itself, from a place the job
        cannot redirect (docs/architecture.md, "Capabilities, not names": ``error_files``). None (the
        default): there is none to read here. Quick: never waits on a remote service."""
        return None

    def rank_stderr(self, app_id: str, role_name: str, k: int, local_rank: int, n: int) -> builtins.list[str] | None:
        """The last ``n`` lines local rank ``local_rank`` of replica ``k`` of ``role_name`` wrote
        to its own stderr (torchrun's per-rank file, ``--tee``), where this host reads it; None
        (the default) where there is none (the root cause then shows the node's stderr). Quick:
        never waits on a remote service."""
        return None

    def default_checkpoint_root(self) -> str | None:
        """Where a task's jobs checkpoint when no root is configured (``core/checkpoints.py``);
        None (the default): nowhere, and the replicas get no ``TORCHX_CHECKPOINT_DIR``."""
        return None

    def sidecar_dir(self, app_id: str) -> Path | None:
        """A directory beside the job where watchers (e.g. the Airflow trigger) may keep files
        of their own, such as log cursor files; it goes away with the job. None (the default):
        watchers keep them under the host's state dir. Never a file the backend writes."""
        return None

    # ------------------------------------------------------------------ logs

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
        """Lines (each ending in ``"\\n"``) of replica ``k`` of ``role_name``.

        1. ``should_tail=False``: what is there now; ``True``: blocks, following the log until
           the app is terminal and its log drained.
        2. Unknown app: ``UnknownAppError``; unknown role or replica: ``ValueError``.
        3. Backends without logs raise ``NotImplementedError`` (the default).
        """
        raise NotImplementedError(f"{self.backend} does not support log iteration")

    def read_log(
        self,
        app_id: str,
        role_name: str,
        k: int = 0,
        cursor: str | None = None,
        streams: Stream | None = None,
        max_lines: int | None = None,
    ) -> LogChunk:
        """Read on from ``cursor`` (None: the start); return the lines and the next cursor.

        1. Never blocks waiting for new lines: returns what is there (possibly nothing).
        2. A reader that saves each returned cursor and restarts from it sees every line
           exactly once, in order (built-in backends). This default, for backends with only
           ``log_iter``, re-reads the log and skips the lines counted in the cursor: it is
           at-least-once if the backend's log changes under it.
        3. At most ``max_lines`` lines when given.
        4. Unknown app: ``UnknownAppError``; a cursor this scheduler did not return:
           ``ValueError`` naming it.
        """
        try:
            skip = int(cursor_object(cursor)["skip"]) if cursor else 0
            if skip < 0:
                raise ValueError("negative")
        except (ValueError, KeyError, TypeError):
            raise ValueError(f"cursor: {shown(cursor)} is not a cursor read_log returned") from None
        desc = self.describe(app_id)
        if desc is None:
            raise UnknownAppError(f"app_id: no app {app_id!r} on {self.backend}")
        lines = list(self.log_iter(app_id, role_name, k, streams=streams))[skip:]
        done = desc.state.is_terminal()
        if max_lines is not None and len(lines) > max_lines:
            lines, done = lines[:max_lines], False
        return LogChunk(lines=lines, cursor=json.dumps({"skip": skip + len(lines)}), eof=done)

    # ------------------------------------------------------------------ stop

    def cancel(self, app_id: str, *, reason: str | None = None, by: CancelledBy | None = None) -> None:
        """Ask the scheduler to stop the app; it ends CANCELLED asynchronously.

        1. Idempotent: an unknown or already terminal app is logged and left alone (an app that
           ended unrecorded is finalised: ``finalize``).
        2. Returns once the request was made; does not wait for the app to end.
        3. ``reason`` says who or what asks (e.g. ``airflow-torchx cancel by alice``); a
           backend that can keep it records it with the request: ``describe`` then returns it
           as ``cancel_reason`` and the ended app's ``msg`` names it.
        4. ``by`` says who asks, in the closed vocabulary ``CancelledBy`` (None: not said); a
           backend that can keep it records it with the request: ``describe`` then returns it
           as ``cancelled_by``.
        5. A request that reached the app but could not be recorded raises
           ``CancelNotRecordedError`` (a ``StoreError``), one that reached it though a record of
           it was refused ``CancelDeliveredError`` (a ``CorruptEntryError``): the app stops all
           the same. ``CorruptEntryError`` itself: the request reached nothing (``delete``
           removes such an app). A backend that can keep it records the refusal with a
           request that reached the app: ``describe`` then returns it as
           ``stopped_while_refused`` once the app's record can be read again.
        """
        desc = self.describe(app_id)
        if desc is None:
            log.info("cancel: no app %s on %s; nothing to do", app_id, self.backend)
        elif desc.state.is_terminal():
            self.finalize(app_id)
            log.info("cancel: app %s is already %s; nothing to do", app_id, desc.state.name)
        else:
            self._cancel_existing(app_id, reason, by)

    @abc.abstractmethod
    def _cancel_existing(self, app_id: str, reason: str | None, by: CancelledBy | None) -> None:
        """Request the stop of a known app that has not ended, recording ``reason`` and ``by``
        where the backend can (see ``cancel``)."""

    def delete(self, app_id: str) -> None:
        """Cancel the app if it runs, then remove what the scheduler keeps of it.

        Idempotent: an unknown app is logged and left alone. ``StoreError``: the scheduler's
        own store of jobs cannot be written.
        """
        if not self.exists(app_id):
            log.info("delete: no app %s on %s; nothing to do", app_id, self.backend)
            return
        self.cancel(app_id)
        self._delete_existing(app_id)

    def _delete_existing(self, app_id: str) -> None:
        """Remove the app's record (default: nothing beyond the cancel)."""

    def prune(
        self, older_than: float, states: Iterable[str] = (), dry_run: bool = False
    ) -> builtins.list[tuple[str, int]]:
        """Remove what the scheduler keeps of its jobs that ended more than ``older_than``
        seconds ago, for a scheduler with the ``prune`` capability (``airflow-torchx prune``,
        ``[torchx] retain_finished``).

        1. Never a job that has not ended, and only this scheduler's jobs (another scheduler
           sharing its store prunes its own).
        2. ``states``: only jobs that ended in one of these ``AppState`` names (empty: any).
        3. ``dry_run``: removes nothing, returns the same.
        4. Returns ``(app_id, bytes freed)`` per job, oldest first.
        5. ``StoreError``: the scheduler's own store of jobs cannot be written.
        6. Blocks (a walk of the store); a job whose end is not yet recorded is finalised
           first (``finalize``).

        The default: nothing kept here, nothing removed.
        """
        return []

    def checkpoint_uses(self) -> dict[str, builtins.list[CheckpointUse]]:
        """The local checkpoint locations (``TORCHX_CHECKPOINT_DIR``, not a URI) that the jobs
        this scheduler keeps name, each with its jobs (``core/checkpoint_prune.py``: what
        ``prune --checkpoints`` and ``set-aside`` judge; a pruned job no longer names one).
        Blocks (reads the store). The default: none."""
        return {}

    def close(self) -> None:
        """Release what this instance holds (clients, threads). Safe to call twice."""

    def __enter__(self: Any) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_contract(cls: type[Scheduler[Any]]) -> None:
    """``TypeError`` naming ``cls``, unless each capability it declares has the methods it
    needs (``CAPABILITY_METHODS``) defined by ``cls`` or a base of its own, and its ``list``
    takes ``limit=`` (``Scheduler.list``): the contract is met by what a class says, never
    patched in behind its back."""
    name = f"{cls.__module__}.{cls.__qualname__}"
    for capability, methods in CAPABILITY_METHODS.items():
        if not getattr(cls.capabilities, capability):
            continue
        for method in methods:
            if getattr(cls, method) is getattr(Scheduler, method):
                raise TypeError(
                    f"{name} declares the capability {capability!r}, which needs the method {method}(); "
                    f"it has only Scheduler's default, which answers for a scheduler without it"
                )
    if "limit" not in inspect.signature(cls.list).parameters:
        raise TypeError(
            f"{name}.list takes no limit=: Scheduler.list takes `*, limit: int | None = None` (the newest "
            "`limit` matches, None: all); a list that builds every answer returns newest(apps, limit)"
        )
