"""Which checkpoint locations ``airflow-torchx prune --checkpoints`` removes, and removing them
without ever leaving the root.

A location belongs to its task instance (docs/checkpoints.md), not to a job: it is removed
only when that task instance can never run again without a clear and nothing wrote there
within the limit. ``decide`` is the rule, a pure function of what is known of one location
(``LocationView``): the local store's jobs that name it (a live one keeps it; the store's jobs
only find locations, their records being gone decides nothing), the newest write inside it,
and what Airflow says of its task instance and DAG run (``TaskState``). The Airflow layer reads
those, loaded through the entry point group ``TASK_STATES_GROUP`` (``load_task_states``):
where none loads, Airflow is not at hand and the rule is conservative, judging by the newest
write and the jobs' ends only. Each row of ``decide`` is a test in
``tests/core/test_checkpoint_prune.py``.

Walks never follow a symbolic link below the root (the root itself may be one): each
directory is opened relative to its parent with ``O_NOFOLLOW``, listed through its descriptor
and emptied relative to it. A link met on the way to a location skips it whole; one inside is
left as it is, and both are reported, never counted as removed.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, NamedTuple

from airflow_provider_torchx.core.checkpoints import is_uri, location_parts
from airflow_provider_torchx.core.identity import TaskIdentity
from airflow_provider_torchx.core.specs import AppState

#: Where the Airflow layer registers its reader of task instance states (``TaskStates``).
TASK_STATES_GROUP = "airflow_provider_torchx.task_states"
#: Task instance states from which only a clear runs the task again.
FINISHED_TASK_STATES = frozenset({"success", "failed", "skipped", "upstream_failed", "removed"})
#: DAG run states that are over.
ENDED_RUN_STATES = frozenset({"success", "failed"})
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class TaskState(NamedTuple):
    """What Airflow's database says of a location's task instance and its DAG run."""

    dag_known: bool
    #: None: no such DAG run (deleted).
    run_state: str | None = None
    #: Epoch seconds; None: not ended.
    run_ended_at: float | None = None
    #: False: the run has no such task instance.
    ti_found: bool = False
    #: None: no state (cleared, or not yet scheduled).
    ti_state: str | None = None


class Unreadable(NamedTuple):
    """Airflow is at hand, but what it says of the task instance could not be read."""

    why: str


#: The Airflow layer's reader: identities -> what Airflow says of each (raises when it cannot read).
TaskStates = Callable[[Iterable[TaskIdentity]], Mapping[TaskIdentity, TaskState]]


class LocationView(NamedTuple):
    """What is known of one checkpoint location when the rule is applied."""

    location: str
    #: The task instance whose location it is (None: the jobs naming it carry no Airflow labels).
    identity: TaskIdentity | None
    #: The newest modification time inside it, itself included (None: nothing is there).
    newest_write: float | None = None
    #: Why the walk did not reach it: a symbolic link (or not a directory) on the way.
    refused: str | None = None
    #: A job of the store naming it that has not ended.
    live_job: str | None = None
    #: When the last ended job naming it ended (epoch seconds).
    last_job_end: float | None = None
    #: What Airflow says (None: Airflow not at hand).
    task: TaskState | Unreadable | None = None


class Verdict(NamedTuple):
    """``decide``'s answer: remove the location or keep it, and why."""

    remove: bool
    reason: str


def decide(view: LocationView, *, now: float, older_than: float) -> Verdict:
    """Whether ``prune --checkpoints --older-than older_than`` removes ``view``'s location at
    ``now`` (epoch seconds), one row at a time, the first that applies:

    1. a URI: keep (its owner prunes it: an S3 lifecycle rule);
    2. the walk was refused (a link on the way): keep, untouched;
    3. a job naming it has not ended: keep;
    4. written within the limit: keep;
    5. a job naming it ended within the limit: keep;
    6. no job naming it is an Airflow task's: remove;
    7. Airflow not at hand: remove (rows 4 and 5 are the whole rule then);
    8. Airflow's answer unreadable: keep;
    9. its DAG is unknown to the database (another deployment's): keep;
    10. its DAG run is gone: remove;
    11. its task instance is in a state that can still run (up_for_retry, up_for_reschedule,
        none, scheduled, queued, running, deferred, restarting: any but the finished ones): keep;
    12. its DAG run is not over (queued, running: also after a clear): keep;
    13. its DAG run ended within the limit (or has no end): keep;
    14. its task instance is gone from the ended run: remove;
    15. its task instance is finished (success, failed, skipped, upstream_failed, removed): remove.
    """
    cutoff = now - older_than

    def ago(when: float) -> str:
        return f"{max(now - when, 0.0):.0f}s ago"

    if is_uri(view.location):
        return Verdict(False, "not a local path (its owner prunes it)")
    if view.refused is not None:
        return Verdict(False, view.refused)
    if view.live_job is not None:
        return Verdict(False, f"job {view.live_job}, which uses it, has not ended")
    if view.newest_write is not None and view.newest_write > cutoff:
        return Verdict(False, f"written {ago(view.newest_write)}")
    if view.last_job_end is not None and view.last_job_end > cutoff:
        return Verdict(False, f"a job using it ended {ago(view.last_job_end)}")
    written = "never written" if view.newest_write is None else f"last written {ago(view.newest_write)}"
    task = view.task
    if view.identity is None:
        return Verdict(True, f"no Airflow task's; {written}")
    if task is None:
        return Verdict(True, f"Airflow not at hand: judged by its writes and jobs only; {written}")
    if isinstance(task, Unreadable):
        return Verdict(False, f"its task instance's state cannot be read: {task.why}")
    if not task.dag_known:
        return Verdict(False, f"DAG {view.identity.dag_id!r} is not in this deployment's database")
    if task.run_state is None:
        return Verdict(True, f"its DAG run is gone; {written}")
    if task.ti_found and task.ti_state not in FINISHED_TASK_STATES:
        return Verdict(False, f"its task instance is {task.ti_state or 'without a state (cleared)'}: it can still run")
    if task.run_state not in ENDED_RUN_STATES:
        return Verdict(False, f"its DAG run is {task.run_state}")
    if task.run_ended_at is None or task.run_ended_at > cutoff:
        ended = "has no end date" if task.run_ended_at is None else f"ended {ago(task.run_ended_at)}"
        return Verdict(False, f"its DAG run {ended}")
    run = f"its DAG run ended {task.run_state} {ago(task.run_ended_at)}"
    if not task.ti_found:
        return Verdict(True, f"{run} without this task instance; {written}")
    return Verdict(True, f"{run}, the task instance {task.ti_state}; {written}")


def load_task_states() -> TaskStates | None:
    """The reader of task instance states registered in ``TASK_STATES_GROUP`` (the Airflow
    layer's); None where none loads (Airflow is not installed)."""
    for ep in metadata.entry_points(group=TASK_STATES_GROUP):
        try:
            reader: TaskStates = ep.load()
        except ImportError:
            continue
        return reader
    return None


# --------------------------------------------------------------------------- the walk


@dataclass
class Tally:
    """What a walk of a location found (or removed): its bytes on disk other than links, its
    newest write, the links it left and what could not be removed."""

    size: int = 0
    newest_write: float | None = None
    links: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def saw(self, st: os.stat_result) -> None:
        self.newest_write = st.st_mtime if self.newest_write is None else max(self.newest_write, st.st_mtime)


def _not_followed(path: str, name: str, dir_fd: int) -> str:
    """Why ``name`` (at ``path``) was not entered: a link, or not a directory."""
    try:
        link = stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode)
    except OSError:
        link = False
    return f"{path} is {'a symbolic link' if link else 'not a directory'}: not followed"


def _walk(fd: int, rel: str, tally: Tally, remove: bool) -> bool:
    """Walk the directory open at ``fd`` (``rel`` names it in the report), removing what is
    in it when ``remove``; True when nothing was left in it."""
    empty = True
    with os.scandir(fd) as it:
        entries = list(it)
    for entry in entries:
        path = posixpath.join(rel, entry.name)
        try:
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(st.st_mode):
            tally.links.append(path)
            empty = False
            continue
        tally.saw(st)
        tally.size += st.st_blocks * 512
        try:
            if stat.S_ISDIR(st.st_mode):
                child = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)
                try:
                    tally.saw(os.fstat(child))
                    inner = _walk(child, path, tally, remove)
                finally:
                    os.close(child)
                if remove and inner:
                    os.rmdir(entry.name, dir_fd=fd)
                empty = empty and inner
            elif remove:
                os.unlink(entry.name, dir_fd=fd)
        except FileNotFoundError:
            continue
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):  # swapped for a link meanwhile
                tally.links.append(path)
            else:
                tally.problems.append(f"{path}: {e.strerror}")
            empty = False
    return empty


def split_location(location: str, identity: TaskIdentity | None) -> tuple[str, list[str]]:
    """``(root, parts)``: the root a location was built under and its parts below it (those a
    walk opens without following links); a location not built from ``identity`` (the CLI's
    ``run --checkpoint_dir``) is its last part under its parent."""
    if identity is not None:
        parts = location_parts(identity)
        suffix = "/" + "/".join(parts)
        if location.endswith(suffix) and len(location) > len(suffix):
            return location[: -len(suffix)], parts
    return posixpath.dirname(location) or "/", [posixpath.basename(location)]


class Walked(NamedTuple):
    """A location's walk: whether it is there, why it was not entered, and its ``Tally``."""

    present: bool
    refused: str | None
    tally: Tally


def walk_location(location: str, identity: TaskIdentity | None, *, remove: bool = False) -> Walked:
    """Walk ``location`` without following links below its root (``split_location``); with
    ``remove``, remove what is in it, it, and the directories above it up to the root that
    this leaves empty (also when the location was never created)."""
    root, parts = split_location(location, identity)
    tally = Tally()
    fds: list[int] = []
    try:
        try:
            fds.append(os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
        except (FileNotFoundError, NotADirectoryError):
            return Walked(False, None, tally)
        path = root
        for part in parts:
            path = posixpath.join(path, part)
            try:
                fds.append(os.open(part, _DIR_FLAGS, dir_fd=fds[-1]))
            except FileNotFoundError:
                break
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                return Walked(True, _not_followed(path, part, fds[-1]), tally)
        present = len(fds) == len(parts) + 1
        empty = True
        if present:
            tally.saw(os.fstat(fds[-1]))
            empty = _walk(fds[-1], location, tally, remove)
        if remove and empty:
            for depth in reversed(range(len(fds) - 1)):  # the location, then its parents
                try:
                    os.rmdir(parts[depth], dir_fd=fds[depth])
                except OSError:
                    break  # not empty: another location lives there
        return Walked(present, None, tally)
    finally:
        for fd in fds:
            os.close(fd)


# --------------------------------------------------------------------------- the prune


_TERMINAL_NAMES = frozenset(s.name for s in AppState if s.is_terminal())


class Use(NamedTuple):
    """A job of the store naming a location: its task instance, whether it ended and when."""

    app_id: str
    identity: TaskIdentity | None
    ended: bool
    ended_at: float | None


def uses(locations: Mapping[str, str], summaries: Mapping[str, Mapping[str, Any]]) -> dict[str, list[Use]]:
    """A scheduler's jobs by the local location they name: ``locations`` ``{app_id: location}``,
    ``summaries`` ``{app_id: {"labels", "state" (an ``AppState`` name), "ended", "created"}}``."""
    found: dict[str, list[Use]] = {}
    for app_id, location in locations.items():
        entry = summaries.get(app_id)
        if entry is None or is_uri(location):
            continue
        ended = entry.get("state") in _TERMINAL_NAMES
        found.setdefault(location, []).append(
            Use(
                app_id,
                TaskIdentity.from_labels(entry.get("labels") or {}),
                ended,
                (entry.get("ended") or entry.get("created")) if ended else None,
            )
        )
    return found


class Outcome(NamedTuple):
    """What the prune did (or would do) with one location."""

    location: str
    verdict: Verdict
    #: Whether the walk was refused (a link on the way): nothing touched.
    skipped: bool
    #: Bytes removed (or that would be), links left, what could not be removed.
    tally: Tally
    present: bool


def _views(
    by_location: Mapping[str, Sequence[Use]], task_states: TaskStates | None
) -> list[tuple[LocationView, Walked]]:
    """Each location's view, with Airflow's answer read once for all of them."""
    identities = {
        loc: next((u.identity for u in found if u.identity is not None), None) for loc, found in by_location.items()
    }
    answers: Mapping[TaskIdentity, TaskState] | Unreadable | None = None
    wanted = {i for i in identities.values() if i is not None}
    if task_states is not None and wanted:
        try:
            answers = task_states(wanted)
        except Exception as e:  # the database is down or not this deployment's: keep them all
            answers = Unreadable(f"{type(e).__name__}: {e}")
    out = []
    for location in sorted(by_location):
        found, identity = by_location[location], identities[location]
        walked = walk_location(location, identity)
        live = next((u.app_id for u in found if not u.ended), None)
        ends = [u.ended_at for u in found if u.ended_at is not None]
        task: TaskState | Unreadable | None = None
        if isinstance(answers, Unreadable):
            task = answers
        elif answers is not None and identity is not None:
            task = answers.get(identity, TaskState(dag_known=False))
        view = LocationView(
            location,
            identity,
            newest_write=walked.tally.newest_write,
            refused=walked.refused,
            live_job=live,
            last_job_end=max(ends) if ends else None,
            task=task,
        )
        out.append((view, walked))
    return out


def prune(
    by_location: Mapping[str, Sequence[Use]],
    *,
    now: float,
    older_than: float,
    dry_run: bool,
    task_states: TaskStates | None,
) -> list[Outcome]:
    """Apply ``decide`` to every location of ``by_location`` (``uses``) and remove those it
    says (``dry_run``: none), each walked without following links; one ``Outcome`` each."""
    outcomes = []
    for view, walked in _views(by_location, task_states):
        verdict = decide(view, now=now, older_than=older_than)
        if verdict.remove and not dry_run:
            walked = walk_location(view.location, view.identity, remove=True)
        if walked.present or verdict.remove:
            outcomes.append(Outcome(view.location, verdict, walked.refused is not None, walked.tally, walked.present))
    return outcomes
