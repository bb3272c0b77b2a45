"""The Airflow side of checkpoint locations and attempt numbers (``core/checkpoints.py``).

``TorchXRunOperator`` calls ``prepare`` before it submits a new job: the root by precedence
(the operator's ``checkpoint_root``, the connection's extra, ``[torchx] checkpoint_root``,
the scheduler's default), the task instance's location under it, and the attempt number this
job starts at; both go into every role's env. An adopted job (a retry reattaching to its
running job) is never changed: ``location_of`` reads what it was given. ``report`` puts the
location in the task log and XCom (``checkpoint_dir``); a dry run without a location says that
the job would get no ``TORCHX_CHECKPOINT_DIR``.

``task_states`` is what ``airflow-torchx prune --checkpoints`` asks Airflow's database of the
task instances whose locations it may remove (registered in the entry point group
``airflow_provider_torchx.task_states``; the rule is ``core/checkpoint_prune.py``'s).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from airflow_provider_torchx._compat import conf
from airflow_provider_torchx.core import checkpoints
from airflow_provider_torchx.core.checkpoint_prune import TaskState
from airflow_provider_torchx.core.errors import InvalidRunConfigError
from airflow_provider_torchx.core.identity import TaskIdentity

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_torchx.core.runner import Runner
    from airflow_provider_torchx.core.schedulers.api import DescribeAppResponse
    from airflow_provider_torchx.core.specs import AppDef
    from airflow_provider_torchx.hooks.torchx import TorchXHook

log = logging.getLogger(__name__)
#: Where ``[torchx] checkpoint_root`` is read.
CONFIG = ("torchx", "checkpoint_root")


def configured_root(operator_root: str | None, hook: TorchXHook, runner: Runner, scheduler: str) -> str | None:
    """The checkpoint root of a task (see the module docstring); ``InvalidRunConfigError``
    naming where a bad one was set."""
    return checkpoints.resolve_root(
        [
            ("checkpoint_root", operator_root),
            (f"connection {hook.torchx_conn_id!r} extra checkpoint_root", hook.settings.checkpoint_root),
            ("[torchx] checkpoint_root", conf.get(*CONFIG, fallback="") or None),
        ],
        runner.default_checkpoint_root(scheduler),
    )


def attempts_of(desc: DescribeAppResponse) -> int:
    """How many attempts the described job made: its restarts + 1."""
    return max(desc.num_restarts, 0) + 1


def earlier_attempts(runner: Runner, scheduler: str, cfg: dict[str, Any], identity: TaskIdentity) -> list[int]:
    """How many attempts each job task instance ``identity`` submitted before made
    (``attempts_of``), as the scheduler still knows them (listed by its labels)."""
    counts = []
    for app in runner.list(scheduler, cfg, identity.labels()):
        desc = runner.describe_app(app.app_handle)
        if desc is not None:
            counts.append(attempts_of(desc))
    return counts


def prepare(
    app: AppDef,
    *,
    operator_root: str | None,
    hook: TorchXHook,
    runner: Runner,
    scheduler: str,
    cfg: dict[str, Any],
    identity: TaskIdentity,
    try_number: int,
    dryrun: bool,
    fresh_start: bool = False,
    moved_attempts: Sequence[int] = (),
    earlier: Sequence[int] | None = None,
) -> str | None:
    """Give every role of the new job ``app`` the checkpoint location of task instance
    ``identity`` (when a root is known) and its first attempt number; return the location
    (None: no root). On a retry the attempt number counts the attempts of the task instance's
    earlier jobs (``checkpoints.attempt_offset``); a dry run only counts the earlier tries.
    ``fresh_start``: first set what the location holds aside (``checkpoints.set_aside``, on a
    scheduler whose jobs run on this host; ``InvalidRunConfigError`` elsewhere).
    ``moved_attempts``: the attempts of the jobs this try's capacity ladder moved the job from
    (``operators/climb.py``), which the attempt number continues past. ``earlier``: the
    attempts of the task instance's earlier jobs where the retry listed them already
    (``operators/adopt.py``, ``Earlier.attempts``); None: listed here (``earlier_attempts``)."""
    root = configured_root(operator_root, hook, runner, scheduler)
    location = checkpoints.checkpoint_dir(root, identity) if root is not None else None
    host_paths = runner.capabilities(scheduler).host_paths
    if fresh_start and location is not None and not dryrun:
        if not host_paths:
            raise InvalidRunConfigError(
                f"fresh_start: the checkpoints of a {scheduler} job ({location}) are not on this host: "
                "move them aside with the storage's own tools"
            )
        moved = checkpoints.set_aside(location, time.time())
        if moved is not None:
            log.info("Fresh start: set the checkpoints of this task instance aside: %s -> %s (kept)", location, moved)
    if try_number <= 1 or dryrun:
        earlier = ()
    elif earlier is None:
        try:
            earlier = earlier_attempts(runner, scheduler, cfg, identity)
        except Exception as e:  # the count is a courtesy: the try number still bounds it
            log.warning("could not count the earlier attempts of this task instance: %s", e)
            earlier = ()
    attempt = checkpoints.attempt_offset(try_number, [*earlier, *moved_attempts])
    if dryrun and location is None:
        log.info(
            "No checkpoint root (checkpoint_root=, the connection's extra, [torchx] checkpoint_root, "
            "no default for %s): the job would get no TORCHX_CHECKPOINT_DIR",
            scheduler,
        )
    checkpoints.place(app, location, attempt, host_paths=host_paths, create=not dryrun)
    return location


def first_try_of_run(ti: Any, retries: int) -> bool:
    """Whether ``ti``'s try is the first of its DAG run or of its latest clear (Airflow's own
    rule: a clear raises ``max_tries`` to the try number plus the retries), not a retry."""
    max_tries = getattr(ti, "max_tries", None)
    if max_tries is None:
        return bool(ti.try_number <= 1)
    return bool(ti.try_number == max_tries - (retries or 0) + 1)


def location_of(runner: Runner, app_handle: str) -> str | None:
    """The checkpoint location job ``app_handle`` was given (None: none, or unknown)."""
    try:
        desc = runner.describe_app(app_handle)
    except Exception as e:
        log.warning("could not read the checkpoint location of %s: %s", app_handle, e)
        return None
    return desc.checkpoint_dir if desc is not None else None


def report(context: Context, location: str | None, task_log: logging.Logger | Any) -> None:
    """Log the checkpoint location and push it to XCom (``checkpoint_dir``; nothing without one)."""
    if location is None:
        return
    task_log.info("Checkpoints of this task instance: %s (TORCHX_CHECKPOINT_DIR)", location)
    context["ti"].xcom_push(key=checkpoints.XCOM_KEY, value=location)


def task_states(identities: Iterable[TaskIdentity]) -> dict[TaskIdentity, TaskState]:
    """What Airflow's database says of each task instance and its DAG run, in three queries
    whatever their number (an identity whose DAG or run is missing gets what is known).
    Raises when the database cannot be read."""
    from airflow.models.dag import DagModel
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    from airflow_provider_torchx.reaper.views import _epoch, _state

    wanted = set(identities)
    if not wanted:
        return {}
    dag_ids, run_ids = {i.dag_id for i in wanted}, {i.run_id for i in wanted}
    columns = [getattr(TaskInstance, c) for c in ("dag_id", "task_id", "run_id", "map_index", "state")]
    with create_session() as session:
        dags = set(session.scalars(select(DagModel.dag_id).where(DagModel.dag_id.in_(dag_ids))))
        runs = {
            (row.dag_id, row.run_id): (_state(row.state), _epoch(row.end_date))
            for row in session.execute(
                select(DagRun.dag_id, DagRun.run_id, DagRun.state, DagRun.end_date).where(
                    DagRun.dag_id.in_(dag_ids), DagRun.run_id.in_(run_ids)
                )
            )
        }
        tis = {
            TaskIdentity(row.dag_id, row.task_id, row.run_id, row.map_index): _state(row.state)
            for row in session.execute(
                select(*columns).where(
                    TaskInstance.dag_id.in_(dag_ids),
                    TaskInstance.run_id.in_(run_ids),
                    TaskInstance.task_id.in_({i.task_id for i in wanted}),
                )
            )
        }
    out = {}
    for ident in wanted:
        run = runs.get((ident.dag_id, ident.run_id))
        if run is None:
            out[ident] = TaskState(dag_known=ident.dag_id in dags)
            continue
        out[ident] = TaskState(True, run[0], run[1], ident in tis, tis.get(ident))
    return out
