"""The ``airflow-torchx`` command: run components and watch, tail, cancel and list jobs
without Airflow (the same core the operator uses).

Exit codes: 0 success (also when the reader of the output went away, as ``| head`` does); 1
the job FAILED or was CANCELLED, or no such job; 2 a usage or validation error (the message
goes to stderr, without a traceback); 3 the system refused (a full or read-only job store: the
message names the path and the cause; an AWS setup error: no region or credentials, expired
or rejected credentials, access denied, an unknown queue, an unreachable endpoint: one line
saying what to set); 128 + the signal number when SIGINT or SIGTERM
interrupted an attached ``run --wait`` (the job is cancelled first).

``dryrun``, ``describe``, ``log`` and ``run --log`` print the job's secrets (``core/masking.py``:
values of env vars with sensitive names, of sensitive flags in the command, URL passwords) as
``***`` unless given ``--show-secrets``.

Plain-text output shows what comes from a job (names, labels, messages, the roles in log
prefixes, prefixed log lines) through ``jobviews.printable``: control characters other than
tab are escaped, so a job cannot forge lines of the CLI's own output. A replica's lines printed
alone (``log HANDLE/ROLE/K``) are the job's own output and are printed as they are.
"""

from __future__ import annotations

import argparse
import collections
import copy
import getpass
import json
import logging
import os
import re
import signal
import socket
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any, TextIO

from airflow_provider_torchx.core import jobviews
from airflow_provider_torchx.core.errors import (
    CancelDeliveredError,
    CancelNotRecordedError,
    ComponentError,
    CorruptEntryError,
    SchedulerSetupError,
    SignalException,
    UnknownAppError,
)
from airflow_provider_torchx.core.identity import task_label
from airflow_provider_torchx.core.jobviews import map_strings, printable, printable_tree
from airflow_provider_torchx.core.numbers import positive_number
from airflow_provider_torchx.core.runner import Runner, get_runner
from airflow_provider_torchx.core.schedulers.api import CancelledBy, DescribeAppResponse, Stream
from airflow_provider_torchx.core.specs import AppDef, AppState, AppStatus, parse_app_handle

if TYPE_CHECKING:
    from airflow_provider_torchx.core import checkpoint_prune
    from airflow_provider_torchx.core.errorfile import RootCause
    from airflow_provider_torchx.core.logstream import LogLine

# Components, log streaming, masking and durations are imported by the commands that use them:
# ``list`` and ``status`` start without them (benchmarks/ui_scale.py measures ``list``).

log = logging.getLogger(__name__)

PROG = "airflow-torchx"
DEFAULT_SCHEDULER = "local_cwd"
#: Seconds between two looks of ``log --tail`` at the job and its logs.
TAIL_POLL = 0.5
#: How long an interrupted ``run --wait`` waits for the cancelled job to end.
CANCEL_WAIT_SECONDS = 30.0
EXIT_OK, EXIT_JOB_FAILED, EXIT_USAGE = 0, 1, 2
EXIT_SYSTEM = 3
#: ``list`` shows this many of the newest jobs unless given ``--all``.
LIST_DEFAULT_LIMIT = 100
_LOG_TARGET = re.compile(r"^(?P<handle>[^/:]+://[^/]*/[^/]+)(?:/(?P<role>[^/]+)(?:/(?P<k>\d+))?)?$")


class _NoSuchJobError(Exception):
    """The handle names no job the scheduler knows (exit code 1)."""


# --------------------------------------------------------------------------- argument parsing


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not key=value")
    return key, value


def _add_submit_args(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "-s",
        "--scheduler",
        default=DEFAULT_SCHEDULER,
        help=f"the scheduler backend (default: {DEFAULT_SCHEDULER}); see `{PROG} runopts`",
    )
    sub.add_argument(
        "-cfg",
        "--scheduler_args",
        action="append",
        default=[],
        metavar="K=V[,K=V...]",
        help="scheduler run options (repeatable); see `runopts SCHEDULER`",
    )
    sub.add_argument(
        "--label", action="append", type=_label, default=[], metavar="K=V", help="a job label (repeatable)"
    )
    sub.add_argument("--parent_run_id", default=None, help="set as TORCHX_PARENT_RUN_ID in every replica")
    _add_show_secrets(sub)
    sub.add_argument("component", help="a component name (see `builtins`) or path/to/file.py:function")
    sub.add_argument(
        "component_args",
        nargs=argparse.REMAINDER,
        help="the component's arguments (`COMPONENT --help` shows them)",
    )


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return int(text)


def _positive_seconds(text: str) -> float:
    """A duration flag's value: a finite number of seconds > 0 (a zero or negative interval
    would poll without pause or never)."""
    seconds = positive_number(text)
    if seconds is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed: give a number of seconds > 0 (e.g. 0.5 or 2)")
    return seconds


def _add_json(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--json", action="store_true", help="print one JSON document (keys: docs/cli.md)")


def _add_show_secrets(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "--show-secrets",
        action="store_true",
        help="print the values of secret env vars (passwords, tokens, keys...) instead of ***",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__, allow_abbrev=False)
    parser.add_argument(
        "--log_level",
        default="WARNING",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="level of the core's own log messages on stderr (default: WARNING)",
    )
    subs = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def sub(name: str, help_text: str) -> argparse.ArgumentParser:
        return subs.add_parser(name, help=help_text, description=help_text, allow_abbrev=False)

    run = sub("run", "submit a component as a job and print its handle")
    run.add_argument("--dryrun", action="store_true", help="print the request instead of submitting it")
    run.add_argument(
        "--checkpoint_dir",
        default=None,
        metavar="DIR",
        help="set as TORCHX_CHECKPOINT_DIR in every replica: an absolute path or a URI (s3://...)",
    )
    run.add_argument("--wait", action="store_true", help="wait for the job to end, showing its state changes")
    run.add_argument("--log", action="store_true", help="stream every replica's log while waiting (implies --wait)")
    run.add_argument(
        "--poll_interval",
        type=_positive_seconds,
        default=1.0,
        metavar="SECONDS",
        help="seconds between status/log polls, > 0 (default: 1)",
    )
    _add_submit_args(run)
    _add_submit_args(sub("dryrun", "print the request a component would submit (like run --dryrun)"))

    for name, help_text in (
        ("status", "print a job's status"),
        ("describe", "print a job's app definition as the scheduler keeps it"),
        ("cancel", "cancel a job (it ends CANCELLED)"),
        ("delete", "cancel a job if it runs and remove it from the scheduler"),
    ):
        handle_cmd = sub(name, help_text)
        handle_cmd.add_argument("app_handle", help="scheduler://session/app_id")
        if name in ("status", "describe"):
            _add_json(handle_cmd)
            _add_show_secrets(handle_cmd)

    log_cmd = sub("log", "print (or follow) the logs of a job's replicas")
    log_cmd.add_argument(
        "target", metavar="HANDLE[/ROLE[/K]]", help="a job handle, optionally narrowed to a role and replica"
    )
    shown = log_cmd.add_mutually_exclusive_group()
    shown.add_argument("-t", "--tail", action="store_true", help="follow the logs until the job ends")
    shown.add_argument(
        "-n", "--lines", type=_positive_int, default=None, metavar="N", help="only the last N lines of each replica"
    )
    log_cmd.add_argument("--regex", default=None, help="only lines matching this regular expression")
    log_cmd.add_argument(
        "--streams", choices=[s.value for s in Stream], default=None, help="which output (default: the scheduler's)"
    )
    _add_show_secrets(log_cmd)

    list_cmd = sub("list", "list a scheduler's jobs")
    list_cmd.add_argument("-s", "--scheduler", default=DEFAULT_SCHEDULER, help=f"default: {DEFAULT_SCHEDULER}")
    list_cmd.add_argument("-cfg", "--scheduler_args", action="append", default=[], metavar="K=V[,K=V...]")
    list_cmd.add_argument("--label", action="append", type=_label, default=[], metavar="K=V", help="filter")
    _add_json(list_cmd)
    list_cmd.add_argument(
        "--all",
        action="store_true",
        help=f"every job (default: the newest {LIST_DEFAULT_LIMIT}; a note counts the rest)",
    )

    prune = sub(
        "prune",
        "remove ended jobs of the schedulers that keep their records (never a live one) and report the space freed",
    )
    prune.add_argument("--older-than", required=True, metavar="DURATION", help="ended this long ago: 30d, 12h, 90m")
    prune.add_argument(
        "--state",
        action="append",
        default=[],
        choices=[s.name for s in AppState if s.is_terminal()],
        type=str.upper,
        help="only jobs that ended in this state (repeatable; default: any)",
    )
    prune.add_argument("--dry-run", action="store_true", help="list what would be removed; remove nothing")
    prune.add_argument(
        "--checkpoints",
        action="store_true",
        help="also remove the local checkpoint locations those schedulers' jobs name whose task instance cannot run "
        "again and that nothing wrote to within --older-than (docs/checkpoints.md)",
    )

    aside = sub(
        "set-aside",
        "set a task instance's local checkpoint location aside (renamed beside it, kept, never deleted) "
        "so that its next job starts over",
    )
    which = aside.add_mutually_exclusive_group(required=True)
    which.add_argument("--job", metavar="HANDLE", help="the location this job was given (its TORCHX_CHECKPOINT_DIR)")
    which.add_argument("--dir", metavar="PATH", help="the location itself (XCom checkpoint_dir)")

    sub("runopts", "print the run options of every (or one) scheduler").add_argument(
        "scheduler", nargs="?", default=None
    )
    sub("builtins", "list the available components (or show one's arguments)").add_argument(
        "component", nargs="?", default=None
    )
    return parser


# --------------------------------------------------------------------------- output helpers


def _out(text: str = "", stream: TextIO | None = None) -> None:
    print(text, file=stream or sys.stdout, flush=True)


def _cancel_reason(command: str) -> str:
    """Who cancels, in words: ``airflow-torchx COMMAND by USER@HOST`` (the job's message names
    it; the cancel itself says ``by=CancelledBy.USER``)."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # no login name and no passwd entry (some containers)
        user = f"uid {os.getuid()}"
    return f"airflow-torchx {command} by {user}@{socket.gethostname()}"


def _show_warning(message: Warning | str, *args: object, **kwargs: object) -> None:
    """A Python warning as one line ``warning: ...`` on stderr (no source file or line)."""
    _err("warning: " + " ".join(str(message).split()))


def _err(text: str) -> None:
    _out(text, sys.stderr)


def _format_app(
    app: AppDef,
    show_secrets: bool = False,
    desc: DescribeAppResponse | None = None,
    as_json: str | None = None,
    root_cause: RootCause | None = None,
) -> str:
    """The app (with the job's status and root cause when ``desc`` is given) as plain lines,
    or as the JSON of ``describe --json`` for the handle ``as_json``; secrets masked unless
    ``show_secrets``."""
    from airflow_provider_torchx.core.masking import mask_tree

    shown = app if show_secrets else mask_tree(app)
    if as_json is not None and desc is not None:
        text = json.dumps(jobviews.describe_dict(as_json, shown, desc, root_cause), indent=2)
    else:
        text = jobviews.describe_text(printable_tree(shown), printable_tree(desc), printable_tree(root_cause))
    return _hide_secrets(text, app, show_secrets, as_json is not None)


def _hide_secrets(text: str, app: AppDef | None, show_secrets: bool, as_json: bool) -> str:
    """``text`` with the secrets of ``app`` (``core/masking.py``) as ``***``, each in the form
    the output writes it (JSON-escaped or ``printable``), unless ``show_secrets``."""
    if show_secrets or app is None:
        return text
    from airflow_provider_torchx.core.masking import redact, secret_values

    return redact(text, [json.dumps(s)[1:-1] if as_json else printable(s) for s in secret_values(app)])


def _root_cause(runner: Runner, handle: str, status: AppStatus) -> RootCause | None:
    """A FAILED job's root cause, as the task's failure message shows it (``core/errorfile.py``:
    the failing rank's exception from torchrun's error file or summary); None otherwise."""
    if status.state != AppState.FAILED:
        return None
    from airflow_provider_torchx.core.errorfile import find_root_cause

    return find_root_cause(runner, handle, status)


def _described(runner: Runner, handle: str) -> DescribeAppResponse:
    desc = runner.describe_app(handle)
    if desc is None:
        raise _NoSuchJobError(handle)
    return desc


def _status_or_fail(runner: Runner, handle: str) -> AppStatus:
    """The job's status, read without side effects: a job that ended unrecorded (its
    supervisor died) is reported ended; ``cancel`` and ``delete`` settle it (``finalize``)."""
    status = runner.status(handle)
    if status is None:
        raise _NoSuchJobError(handle)
    return status


# --------------------------------------------------------------------------- commands


def _submit(runner: Runner, args: argparse.Namespace, dryrun: bool) -> int:
    if _wants_help(args.component, args.component_args):
        return _builtins(argparse.Namespace(component=args.component))
    cfg = runner.cfg_from_str(args.scheduler, *args.scheduler_args)
    labels = dict(args.label)
    app = runner.component_app(args.component, args.component_args)
    checkpoint_dir = getattr(args, "checkpoint_dir", None)
    if checkpoint_dir is not None:
        from airflow_provider_torchx.core import checkpoints

        location = checkpoints.check_root(checkpoint_dir, "--checkpoint_dir")
        host_paths = runner.capabilities(args.scheduler).host_paths
        checkpoints.place(app, location, 0, host_paths=host_paths, create=not dryrun)
    info = runner.dryrun(app, args.scheduler, cfg, parent_run_id=args.parent_run_id, labels=labels)
    if dryrun:
        _out("=== APPLICATION ===")
        _out(_format_app(info.app, args.show_secrets))
        _out("=== SCHEDULER REQUEST ===")
        if args.show_secrets:
            _out(str(info))
        else:
            from airflow_provider_torchx.core.masking import mask_tree, redact, secret_values

            masked = copy.copy(info)
            masked.request = mask_tree(info.request)
            _out(redact(str(masked), secret_values(info.app)))
        return EXIT_OK
    handle = runner.schedule(info)
    _out(handle)
    if not (args.wait or args.log):
        return EXIT_OK
    return _attach(runner, handle, args.log, args.poll_interval, _masker(runner, handle, args.show_secrets))


def _wants_help(component: str, component_args: list[str]) -> bool:
    """Whether ``--help`` is one of the component's options (not a word of its ``*args``,
    as in ``utils.sh grep --help``)."""
    options = component_args[: component_args.index("--")] if "--" in component_args else component_args
    if "--help" not in options:
        return False
    from airflow_provider_torchx.core.components import get_app

    try:
        get_app(component, component_args)
    except ComponentError:
        return True
    return False


def _raise_signal(signum: int, frame: FrameType | None) -> None:
    raise SignalException(f"got {signal.Signals(signum).name}", signal.Signals(signum))


def _masker(runner: Runner, handle: str, show_secrets: bool) -> Callable[[str], str]:
    """What a log line of the job goes through before it is printed: the job's secrets
    (``core/masking.py``, ``secret_values`` of its app as the scheduler keeps it) redacted, unless
    ``show_secrets``."""
    if show_secrets:
        return str
    from airflow_provider_torchx.core.masking import redact, secret_values

    app = runner.describe(handle)
    secrets = secret_values(app) if app is not None else set()
    return lambda line: redact(line, secrets)


def _attach(runner: Runner, handle: str, stream_logs: bool, poll_interval: float, mask: Callable[[str], str]) -> int:
    """Wait for the job, printing its state changes (stderr) and, with ``stream_logs``, every
    replica's new lines (stdout, ``[role/k] line``). SIGINT/SIGTERM cancel the job."""
    # The one watching path (core/logstream.py): lines at the speed of stdout, and every line
    # of the ended job (no time limit on the final drain).
    from airflow_provider_torchx.core.logstream import JobWatch, last_lines

    def print_lines(lines: list[LogLine]) -> None:
        for line in lines:
            _out(_prefixed(line.role, line.k, mask(line.line)))

    watch = JobWatch(runner, handle, print_lines, stream_logs=stream_logs)
    last_state: list[AppState] = []

    def on_poll(status: AppStatus) -> None:
        if status.state not in last_state[-1:]:
            _err(f"{handle}: {status.state.name}")
            last_state.append(status.state)

    # Runner.wait cancels on a signal that lands inside it; these handlers cover the moments
    # between waits (printing logs), so a signal always cancels.
    previous = {sig: signal.signal(sig, _raise_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        found = watch.wait(poll_interval, on_poll=on_poll, cancel_on_signal=True)
        if found is None:
            raise _NoSuchJobError(handle)
        status = found
        on_poll(status)
    except SignalException as sig:
        return _cancelled(runner, handle, sig, previous)
    finally:
        for sig_num, handler in previous.items():
            signal.signal(sig_num, handler)
    if status.state == AppState.SUCCEEDED:
        return EXIT_OK
    _err(printable_tree(status).format())
    root = _root_cause(runner, handle, status)
    if root is not None:
        _err(printable_tree(map_strings(root, mask)).format())
    failed = status.failed_replica()
    if failed and not stream_logs:
        tail = last_lines(runner, handle, failed.role, failed.id)
        shown = "\n".join(_log_text(mask(line)) for line in tail)
        _err(f"last {len(tail)} lines of {printable(failed.role)}/{failed.id}:\n{shown}")
    return EXIT_JOB_FAILED


def _cancelled(runner: Runner, handle: str, sig: SignalException, previous: dict[Any, Any]) -> int:
    for sig_num, handler in previous.items():  # a second Ctrl-C stops waiting for the cancel
        signal.signal(sig_num, handler)
    # Runner.wait may have cancelled it already: cancel is idempotent
    runner.cancel(handle, reason=_cancel_reason(f"run --wait ({sig.sigval.name})"), by=CancelledBy.USER)
    _err(f"{handle}: {sig.sigval.name} received, cancelling the job")
    try:
        final = runner.wait(handle, wait_interval=1, timeout=CANCEL_WAIT_SECONDS, cancel_on_signal=False)
        _err(f"{handle}: {final.state.name if final else 'gone'}")
    except KeyboardInterrupt:
        pass
    return 128 + int(sig.sigval)


def _log_text(line: str) -> str:
    """A log line as plain output shows it: without its line ending, ``printable``."""
    return printable(line.rstrip("\r\n"))


def _prefixed(role: str, k: int, line: str) -> str:
    """``[role/k] line``, both ``printable``: neither the role nor the line can forge another
    replica's prefix (a carriage return, an escape sequence moving the cursor)."""
    return f"[{printable(role)}/{k}] {_log_text(line)}"


def _replicas(runner: Runner, handle: str, role: str | None) -> list[tuple[str, int]]:
    """``(role, k)`` of every replica of ``handle`` (of ``role`` only, when given)."""
    status = _status_or_fail(runner, handle)
    found = [(r.role, rep.id) for r in status.roles for rep in r.replicas]
    if not found:
        app = runner.describe(handle)
        found = [(r.name, k) for r in (app.roles if app else []) for k in range(r.num_replicas)]
    if role is None:
        return found
    chosen = [(name, k) for name, k in found if name == role]
    if not chosen:
        roles = sorted({name for name, _ in found})
        raise ValueError(f"role: {handle} has no role {role!r}; its roles: {', '.join(roles) or '(none yet)'}")
    return chosen


def _log(runner: Runner, args: argparse.Namespace) -> int:
    m = _LOG_TARGET.match(args.target)
    handle: str = m["handle"] if m else args.target
    role: str | None = m["role"] if m else None
    parse_app_handle(handle)  # raises, showing the expected form
    replicas: list[tuple[str, int]]
    if m and role and m["k"] is not None:  # one replica named: its lines as they are
        _status_or_fail(runner, handle)
        replicas, prefixed = [(role, int(m["k"]))], False
    else:
        replicas, prefixed = _replicas(runner, handle, role), True
    streams = Stream(args.streams) if args.streams else None
    mask = _masker(runner, handle, args.show_secrets)

    def show(role_name: str, k: int, line: str) -> None:
        _out(_prefixed(role_name, k, mask(line)) if prefixed else mask(line).rstrip("\n"))

    if args.tail:
        narrowed = None if role is None else replicas  # else every replica, those that start late too
        return _tail(runner, handle, narrowed, show, streams, args.regex)
    for role_name, k in replicas:
        lines = runner.log_lines(handle, role_name, k, regex=args.regex, streams=streams)
        for line in collections.deque(lines, maxlen=args.lines) if args.lines else lines:
            show(role_name, k, line)
    return EXIT_OK


def _tail(
    runner: Runner,
    handle: str,
    replicas: list[tuple[str, int]] | None,
    show: Callable[[str, int, str], None],
    streams: Stream | None,
    regex: str | None,
) -> int:
    """Follow the replicas' logs until the job ended and every line was printed (``show``
    prints one): the watching rules of ``run --wait --log`` (``JobWatch``: bounded reads
    through cursors, the drain rule), a look every ``TAIL_POLL`` seconds. A read: the job is
    neither cancelled nor settled."""
    from airflow_provider_torchx.core.logstream import JobWatch

    pattern = re.compile(regex) if regex else None

    def write(lines: list[LogLine]) -> None:
        for line in lines:
            if pattern is None or pattern.search(line.line):
                show(line.role, line.k, line.line)

    JobWatch(runner, handle, write, replicas=replicas, streams=streams, finalize=False).wait(TAIL_POLL)
    return EXIT_OK


def _list(runner: Runner, args: argparse.Namespace) -> int:
    cfg = runner.cfg_from_str(args.scheduler, *args.scheduler_args)
    labels = dict(args.label)
    # One more than shown tells whether older jobs are hidden; only then are they counted.
    apps = runner.list(args.scheduler, cfg, labels, limit=None if args.all else LIST_DEFAULT_LIMIT + 1)
    if not apps and not args.json:
        _err(f"no jobs on {args.scheduler}")
        return EXIT_OK
    if len(apps) > LIST_DEFAULT_LIMIT and not args.all:
        apps = apps[-LIST_DEFAULT_LIMIT:]  # oldest first: the newest are at the end
        hidden = runner.count(args.scheduler, cfg, labels) - LIST_DEFAULT_LIMIT
        _err(f"{hidden} older job(s) not shown: `{PROG} list --all` shows every job")
    if args.json:
        _out(json.dumps(jobviews.list_dict(apps), indent=2))
        return EXIT_OK
    rows = [
        (
            printable(a.app_handle),
            a.state.name,
            jobviews.when(a.created),
            printable(task_label(a.labels) or "-"),
            printable(a.name),
        )
        for a in apps
    ]
    widths = [max(len(row[i]) for row in [_LIST_HEADER, *rows]) for i in range(4)]
    for row in [_LIST_HEADER, *rows]:
        _out("  ".join(f"{cell:<{w}}" for cell, w in zip(row, widths, strict=False)) + f"  {row[4]}")
    return EXIT_OK


_LIST_HEADER = ("APP HANDLE", "STATE", "SUBMITTED", "AIRFLOW TASK", "NAME")


def _timing(runner: Runner, handle: str) -> str | None:
    """``Started: ...; duration: 12s`` (so far, while it runs) of a job that started."""
    desc = runner.describe_app(handle)
    if desc is None or desc.started is None or desc.state in (AppState.SUBMITTED, AppState.PENDING):
        return None  # a PENDING job has not started (a local one waiting for GPUs has a supervisor)
    if desc.usage is not None and desc.usage.first_running is None:
        return None  # ended before any replica ran (cancelled while PENDING)
    end = desc.ended if desc.ended is not None else time.time()
    running = "" if desc.ended is not None else " so far"
    return f"  Started: {jobviews.when(desc.started)}; duration: {max(0.0, end - desc.started):.0f}s{running}"


def _prune(runner: Runner, args: argparse.Namespace) -> int:
    """``prune``: the ended jobs older than ``--older-than`` of every scheduler that keeps
    records to prune (``Scheduler.prune``), one line each, then each scheduler's total; with
    ``--checkpoints``, also the local checkpoint locations those jobs name, as
    ``core/checkpoint_prune.py`` decides (never one whose task instance can still run), each
    with why."""
    from airflow_provider_torchx.core.durations import parse_duration

    older_than = parse_duration(args.older_than, "--older-than")
    names = _pruning_schedulers(runner)
    if args.checkpoints:
        from airflow_provider_torchx.core import checkpoint_prune

        by_location = _checkpoint_uses(runner, names)  # before the prune forgets the jobs naming them
    verb = "would remove" if args.dry_run else "removed"
    freed = "would free" if args.dry_run else "freed"
    for name in names:
        pruned = runner.prune(name, older_than, args.state, dry_run=args.dry_run)
        for app_id, size in pruned:
            _out(f"{app_id}  {_megabytes(size)}")
        total = sum(size for _, size in pruned)
        _out(f"{verb} {len(pruned)} ended job(s) of {name}; {freed} {_megabytes(total)}")
    if args.checkpoints:
        outcomes = checkpoint_prune.prune(
            by_location,
            now=time.time(),
            older_than=older_than,
            dry_run=args.dry_run,
            task_states=checkpoint_prune.load_task_states(),
        )
        removed = [o for o in outcomes if o.present and o.verdict.remove]
        for o in outcomes:
            if not o.present:
                continue
            if o.skipped:
                _out(f"skipped {o.location}: {o.verdict.reason}")
            elif not o.verdict.remove:
                _out(f"kept {o.location}: {o.verdict.reason}")
            else:
                rest = f"; left {len(o.tally.links)} symbolic link(s), not followed: " if o.tally.links else ""
                rest += ", ".join(o.tally.links)
                rest += f"; could not remove: {', '.join(o.tally.problems)}" if o.tally.problems else ""
                _out(f"{o.location}  {_megabytes(o.tally.size)}: {o.verdict.reason}{rest}")
        size = sum(o.tally.size for o in removed)
        partly = sum(1 for o in removed if o.tally.links or o.tally.problems)
        some = f" (and {partly} in part: what is left in them is named above)" if partly else ""
        _out(f"{verb} {len(removed) - partly} checkpoint dir(s){some}; {freed} {_megabytes(size)}")
    return EXIT_OK


def _pruning_schedulers(runner: Runner) -> list[str]:
    """``Runner.pruning_schedulers``, each one that failed to load named on stderr."""
    names, failed = runner.pruning_schedulers()
    for name, err in failed.items():
        _err(f"{PROG}: {name}: left out, it failed to load: {err}")
    return names


def _checkpoint_uses(runner: Runner, names: Iterable[str] | None = None) -> dict[str, list[checkpoint_prune.Use]]:
    """The local checkpoint locations the jobs of the schedulers ``names`` (default: every one
    with the ``prune`` capability) name, with those jobs (``Runner.checkpoint_uses``)."""
    return runner.checkpoint_uses(_pruning_schedulers(runner) if names is None else names)


def _set_aside(runner: Runner, args: argparse.Namespace) -> int:
    """``set-aside``: rename the location (``checkpoints.set_aside``) unless a job that uses it
    has not ended (of a scheduler with the ``prune`` capability, the ones that keep their
    jobs' records); say where it went."""
    from airflow_provider_torchx.core import checkpoints

    if args.job:
        location = _given_location(runner, args.job)
        if location is None:
            _err(f"{PROG}: {args.job} was given no TORCHX_CHECKPOINT_DIR: nothing to set aside")
            return EXIT_JOB_FAILED
    else:
        location = checkpoints.check_root(args.dir, "--dir")
    try:
        moved = checkpoints.set_aside_unused(location, time.time(), _checkpoint_uses(runner).get(location, []))
    except checkpoints.CheckpointsInUseError as err:
        _err(f"{PROG}: {err}")
        return EXIT_JOB_FAILED
    if moved is None:
        _out(f"nothing at {location}: the next job starts over anyway")
    else:
        _out(f"set aside {location} -> {moved} (kept; the task instance's next job starts over)")
    return EXIT_OK


def _given_location(runner: Runner, handle: str) -> str | None:
    """The checkpoint location job ``handle`` was given (None: none); ``_NoSuchJobError``."""
    desc = runner.describe_app(handle)
    if desc is None:
        raise _NoSuchJobError(handle)
    return desc.checkpoint_dir


def _megabytes(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


def _runopts(runner: Runner, args: argparse.Namespace) -> int:
    names = [args.scheduler] if args.scheduler else runner.scheduler_backends()
    code = EXIT_OK
    for name in names:
        try:
            opts = runner.scheduler_run_opts(name)
        except (ImportError, AttributeError) as err:  # a backend missing or broken
            _err(f"{name}: unavailable: {err}")
            code = EXIT_JOB_FAILED
            continue
        _out(f"{name}:")
        _out("    " + str(opts).rstrip("\n").replace("\n", "\n    "))
        _out()
    return code


def _builtins(args: argparse.Namespace) -> int:
    from airflow_provider_torchx.core.components import get_component, list_components

    if args.component:
        _out(get_component(args.component).usage)
        return EXIT_OK
    components = list_components()
    _out(f"Found {len(components)} components:")
    width = max((len(n) for n in components), default=0)
    for name, comp in sorted(components.items()):
        _out(f"  {name:<{width}}  {comp.description}")
    return EXIT_OK


def _handle_command(runner: Runner, args: argparse.Namespace) -> int:
    handle: str = args.app_handle
    try:
        status = _status_or_fail(runner, handle)
    except CorruptEntryError:
        if args.command == "cancel":
            _cancel(runner, handle)  # reaches the supervisor without the refused file, or raises
            return EXIT_OK
        if args.command != "delete":
            raise
        runner.delete(handle)  # a corrupt job can only be deleted
        _out(f"{handle}: deleted")
        return EXIT_OK
    if args.command == "status":
        root = _root_cause(runner, handle, status)
        if args.json:
            text = json.dumps(jobviews.status_dict(handle, _described(runner, handle), root), indent=2)
        else:
            shown = [
                printable_tree(status).format(),
                printable_tree(root).format() if root else "",
                printable(jobviews.failure_line(runner.describe_app(handle), root)),
                _timing(runner, handle),
                jobviews.so_far_line(_described(runner, handle), time.time()),
            ]
            text = "\n".join(part for part in shown if part)
        _out(_hide_secrets(text, runner.describe(handle), args.show_secrets, args.json))
    elif args.command == "describe":
        app = runner.describe(handle)
        if app is None:
            raise _NoSuchJobError(handle)
        root = _root_cause(runner, handle, status)
        _out(_format_app(app, args.show_secrets, _described(runner, handle), handle if args.json else None, root))
        if status.usage is not None and not args.json:
            _out(printable_tree(status.usage).format())
    elif args.command == "cancel":
        if status.is_terminal():
            runner.finalize(handle)  # stops what is left of a job whose supervisor died
            _out(f"{handle}: already {status.state.name}; nothing to cancel")
        else:
            _cancel(runner, handle)
    else:
        runner.delete(handle)
        _out(f"{handle}: deleted")
    return EXIT_OK


def _cancel(runner: Runner, handle: str) -> None:
    """Cancel the job; a cancel delivered although the store could not record it, or although
    a file of the job was refused, is printed with why."""
    try:
        runner.cancel(handle, reason=_cancel_reason("cancel"), by=CancelledBy.USER)
    except (CancelNotRecordedError, CancelDeliveredError) as err:  # delivered all the same
        _out(f"{handle}: cancel requested ({err})")
    else:
        _out(f"{handle}: cancel requested")


def _dispatch(runner: Runner, args: argparse.Namespace) -> int:
    command = args.command
    if command in ("run", "dryrun"):
        return _submit(runner, args, dryrun=command == "dryrun" or args.dryrun)
    if command == "log":
        return _log(runner, args)
    if command == "list":
        return _list(runner, args)
    if command == "runopts":
        return _runopts(runner, args)
    if command == "prune":
        return _prune(runner, args)
    if command == "builtins":
        return _builtins(args)
    if command == "set-aside":
        return _set_aside(runner, args)
    return _handle_command(runner, args)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); return the exit code."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2, already printed)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    logging.basicConfig(level=args.log_level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        with get_runner() as runner, warnings.catch_warnings():
            warnings.showwarning = _show_warning
            return _dispatch(runner, args)
    except (_NoSuchJobError, UnknownAppError) as err:
        _err(f"{PROG}: no such job: {err}")
        return EXIT_JOB_FAILED
    except SchedulerSetupError as err:  # AWS region, credentials, permissions, queue, endpoint
        _err(f"{PROG}: error: {err}")
        return EXIT_SYSTEM
    except ValueError as err:
        _err(f"{PROG}: error: {err}")
        return EXIT_USAGE
    except BrokenPipeError:  # the reader went away (`| head`): stop quietly, as Unix tools do
        _silence_stdout()
        return EXIT_OK
    except OSError as err:  # a full or read-only job store (its message names the path), ...
        _err(f"{PROG}: error: {err}")
        return EXIT_SYSTEM
    except KeyboardInterrupt:
        return 128 + int(signal.SIGINT)


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush finds no closed pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
