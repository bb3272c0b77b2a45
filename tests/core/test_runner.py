"""The Runner against a small in-memory scheduler: copying, validation before submit, the
injected job id, labels, unknown apps, idempotent stops, ``wait``, workspaces and lifecycle."""

from __future__ import annotations

import copy
import itertools
import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_torchx.core.errors import (
    InvalidRunConfigError,
    InvalidSpecError,
    MalformedAppHandleError,
    SignalException,
    UnknownAppError,
    UnknownSchedulerError,
)
from airflow_provider_torchx.core.runner import JOB_ID_ENV, PARENT_RUN_ID_ENV, Runner, get_runner
from airflow_provider_torchx.core.runopts import CfgVal, runopts
from airflow_provider_torchx.core.schedulers.api import (
    CancelledBy,
    DescribeAppResponse,
    ListAppResponse,
    Scheduler,
    Stream,
    labels_match,
    newest,
)
from airflow_provider_torchx.core.specs import (
    AppDef,
    AppDryRunInfo,
    AppState,
    AppStatus,
    ReplicaStatus,
    Role,
    RoleStatus,
    macros,
    parse_app_handle,
)

SESSION = "sess"
CFG = {"queue": "q"}
RANK0_ENV = "FAKE_RANK0_HOST"


class FakeScheduler(Scheduler[dict[str, Any]]):
    """An in-memory backend that records every call.

    ``submit_dryrun`` renders each replica with the macros substituted (as every backend
    must); an app's state follows ``self.script[app_id]``, advancing one step per
    ``wait_for_change`` (a script of one state stays there, and then the wait really sleeps).
    """

    supports_workspace = True
    _ids = itertools.count()

    def __init__(self, session_name: str, backend: str = "fake", can_build: bool = True, **params: Any) -> None:
        super().__init__(backend, session_name)
        self.can_build = can_build
        self.params = params
        self.rendered: list[str] = []  # app ids rendered by _submit_dryrun
        self.scheduled: list[dict[str, Any]] = []
        self.built: list[tuple[str, str | None, dict[str, CfgVal]]] = []
        self.cancelled: list[str] = []
        self.reasons: list[str | None] = []
        self.by: list[CancelledBy | None] = []
        self.deleted: list[str] = []
        self.waits: list[float] = []
        self.sigterm_handler_at_schedule: object = None
        self.closed = 0
        self.apps: dict[str, dict[str, Any]] = {}
        self.script: dict[str, list[AppState]] = {}
        self.on_wait: Any = None

    def _run_opts(self) -> runopts:
        opts = runopts()
        opts.add("queue", str, "Queue to submit to.", required=True)
        opts.add("verbose", bool, "Say more.", default=False)
        opts.add("tags", list, "Extra tags.")
        return opts

    def _submit_dryrun(
        self, app: AppDef, cfg: dict[str, CfgVal], labels: dict[str, str]
    ) -> AppDryRunInfo[dict[str, Any]]:
        app_id = f"{app.name}-{next(self._ids)}"
        self.rendered.append(app_id)
        replicas = []
        for role in app.roles:
            for i in range(role.num_replicas):
                values = macros.Values(img_root=role.image, app_id=app_id, replica_id=str(i), rank0_env=RANK0_ENV)
                rendered = values.apply(role)
                replicas.append({"role": role.name, "cmd": [rendered.entrypoint, *rendered.args], "env": rendered.env})
        request = {"app_id": app_id, "replicas": replicas, "cfg": dict(cfg)}
        return AppDryRunInfo(request, fmt=lambda r: f"FakeRequest({r['app_id']})")

    def schedule(self, dryrun_info: AppDryRunInfo[dict[str, Any]]) -> str:
        self.sigterm_handler_at_schedule = signal.getsignal(signal.SIGTERM)
        request = dryrun_info.request
        app_id = request["app_id"]
        self.scheduled.append(request)
        self.apps[app_id] = {"request": request, "labels": dict(dryrun_info.labels), "app": dryrun_info.app}
        self.script.setdefault(app_id, [AppState.RUNNING])
        return str(app_id)

    def build_workspace_image(self, role: Role, cfg: Mapping[str, CfgVal]) -> str | None:
        if not self.can_build:
            return None
        self.built.append((role.image, role.workspace, dict(cfg)))
        return f"{role.image}@built{len(self.built)}"

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        if app_id not in self.apps:
            return None
        state = self.script[app_id][0]
        app: AppDef = self.apps[app_id]["app"]
        return DescribeAppResponse(
            app_id=app_id,
            state=state,
            num_restarts=0,
            msg=f"{app_id} is {state.name}",
            roles_statuses=[RoleStatus(r.name, [ReplicaStatus(0, state, r.name)]) for r in app.roles],
            roles=copy.deepcopy(app.roles),
            labels=self.apps[app_id]["labels"],
        )

    def list(
        self,
        cfg: Mapping[str, CfgVal] | None = None,
        labels: Mapping[str, str] | None = None,
        *,
        limit: int | None = None,
    ) -> list[Any]:
        apps = [
            ListAppResponse(app_id=app_id, state=self.script[app_id][0], labels=rec["labels"])
            for app_id, rec in self.apps.items()
            if labels_match(rec["labels"], labels)
        ]
        return newest(apps, limit)

    def wait_for_change(self, app_id: str, timeout: float) -> None:
        self.waits.append(timeout)
        if self.on_wait is not None:
            self.on_wait()
        states = self.script[app_id]
        if len(states) > 1:
            states.pop(0)
        else:
            super().wait_for_change(app_id, timeout)

    def _cancel_existing(self, app_id: str, reason: str | None, by: CancelledBy | None) -> None:
        self.cancelled.append(app_id)
        self.reasons.append(reason)
        self.by.append(by)
        self.script[app_id] = [AppState.CANCELLED]

    def _delete_existing(self, app_id: str) -> None:
        self.deleted.append(app_id)
        del self.apps[app_id]

    def log_iter(
        self,
        app_id: str,
        role_name: str,
        k: int = 0,
        regex: str | None = None,
        since: object = None,
        until: object = None,
        should_tail: bool = False,
        streams: Stream | None = None,
    ) -> Iterable[str]:
        if app_id not in self.apps:
            raise UnknownAppError(f"app_id: no app {app_id!r}")
        return [f"{role_name}[{k}] line {i}\n" for i in range(3)]

    def close(self) -> None:
        self.closed += 1


class Factory:
    """A scheduler factory that remembers the instances it made."""

    def __init__(self, backend: str = "fake", **fixed: Any) -> None:
        self.backend = backend
        self.fixed = fixed
        self.made: list[FakeScheduler] = []

    def __call__(self, session_name: str, **params: Any) -> FakeScheduler:
        sched = FakeScheduler(session_name, backend=self.backend, **self.fixed, **params)
        self.made.append(sched)
        return sched

    @property
    def sched(self) -> FakeScheduler:
        assert len(self.made) == 1, f"{len(self.made)} instances made"
        return self.made[0]


@pytest.fixture
def factory() -> Factory:
    return Factory()


@pytest.fixture
def runner(factory: Factory) -> Iterator[Runner]:
    with Runner(SESSION, scheduler_factories={"fake": factory, "other": Factory("other")}) as r:
        yield r


def _app(**role_kwargs: Any) -> AppDef:
    role = Role(
        "trainer",
        image="img:1",
        entrypoint="python",
        args=["-m", "train", "--id", macros.app_id, "--rank", macros.replica_id],
        env={"A": "1"},
        num_replicas=2,
        metadata={"m": "v"},
        overrides={"o": 1},
        **role_kwargs,
    )
    return AppDef("train", roles=[role, Role("ps", image="img:2", entrypoint="sh", args=["-c", "true"])])


# --------------------------------------------------------------------------- no mutation


def test_dryrun_works_on_a_deep_copy(runner: Runner, factory: Factory) -> None:
    app = _app(workspace="/src")
    before = copy.deepcopy(app)
    info = runner.dryrun(app, "fake", CFG)

    assert app == before  # nothing patched into the caller's app
    assert info.app is not app
    for mine, theirs in zip(app.roles, info.app.roles, strict=True):
        assert theirs is not mine
        assert theirs.env is not mine.env and theirs.args is not mine.args
        assert theirs.resource is not mine.resource and theirs.metadata is not mine.metadata
        assert theirs.overrides is mine.overrides  # the one shared part (as TorchX)
    assert info.app.roles[0].image == "img:1@built1"
    assert JOB_ID_ENV in info.app.roles[0].env and JOB_ID_ENV not in app.roles[0].env
    assert factory.sched.scheduled == []


def test_run_does_not_mutate_the_app(runner: Runner, factory: Factory) -> None:
    app = _app(workspace="/src")
    before = copy.deepcopy(app)
    handle = runner.run(app, "fake", CFG)
    assert app == before
    assert parse_app_handle(handle).app_id == factory.sched.scheduled[0]["app_id"]


def test_two_dryruns_are_independent(runner: Runner) -> None:
    app = _app()
    first = runner.dryrun(app, "fake", CFG)
    second = runner.dryrun(app, "fake", CFG)
    assert first.app is not second.app
    assert first.request["app_id"] != second.request["app_id"]
    first.app.roles[0].env["X"] = "y"
    assert "X" not in second.app.roles[0].env and "X" not in app.roles[0].env


def test_run_with_dryrun_returns_info_and_submits_nothing(runner: Runner, factory: Factory) -> None:
    info = runner.run(_app(), "fake", CFG, dryrun=True)
    assert isinstance(info, AppDryRunInfo)
    assert str(info).startswith("FakeRequest(train-")
    assert info.scheduler == "fake"
    assert info.cfg == {"queue": "q", "verbose": False, "tags": None}
    assert factory.sched.scheduled == []


def test_schedule_submits_the_request_as_is(runner: Runner, factory: Factory) -> None:
    info = runner.dryrun(_app(), "fake", CFG)
    info.request["patched"] = True
    info.app.roles[0].args.append("--ignored")
    handle = runner.schedule(info)
    (submitted,) = factory.sched.scheduled
    assert submitted["patched"] is True
    assert all("--ignored" not in rep["cmd"] for rep in submitted["replicas"])
    assert handle == f"fake://{SESSION}/{submitted['app_id']}"


def test_schedule_needs_a_scheduler(runner: Runner) -> None:
    with pytest.raises(ValueError, match="dryrun_info"):
        runner.schedule(AppDryRunInfo({"hand": "made"}))


# --------------------------------------------------------------------------- validation first


def _no_roles(app: AppDef) -> None:
    app.roles = []


def _empty_entrypoint(app: AppDef) -> None:
    app.roles[1].entrypoint = ""


def _zero_replicas(app: AppDef) -> None:
    app.roles[0].num_replicas = 0


def _negative_replicas(app: AppDef) -> None:
    app.roles[0].num_replicas = -1


@pytest.mark.parametrize(
    ("edit", "field_name"),
    [
        (_no_roles, "app.roles"),
        (_empty_entrypoint, "roles[1].entrypoint"),
        (_zero_replicas, "roles[0].num_replicas"),
        (_negative_replicas, "roles[0].num_replicas"),
    ],
)
@pytest.mark.parametrize("dryrun", [True, False])
def test_invalid_app_is_rejected_before_anything_happens(
    runner: Runner, factory: Factory, edit: Any, field_name: str, dryrun: bool
) -> None:
    app = _app(workspace="/src")
    edit(app)
    with pytest.raises(InvalidSpecError) as exc:
        runner.run(app, "fake", CFG, dryrun=dryrun)
    assert str(exc.value).startswith(field_name + ":")
    sched = factory.sched
    assert (sched.built, sched.rendered, sched.scheduled) == ([], [], [])


def test_unknown_scheduler_lists_known_ones(runner: Runner) -> None:
    for call in (
        lambda: runner.run(_app(), "kubernetes", CFG),
        lambda: runner.dryrun(_app(), "kubernetes", CFG),
        lambda: runner.status("kubernetes://sess/app-1"),
        lambda: runner.cfg_from_str("kubernetes", "a=b"),
        lambda: runner.list("kubernetes"),
    ):
        with pytest.raises(UnknownSchedulerError) as exc:
            call()
        assert "'kubernetes'" in str(exc.value)
        assert "known: fake, other" in str(exc.value)
        assert isinstance(exc.value, ValueError)


@pytest.mark.parametrize(
    ("cfg", "shown"),
    [
        ({"queue": "q", "queu": "x"}, "unknown option 'queu'"),
        ({"queue": "q", "verbose": "perhaps"}, "verbose='perhaps'"),
        ({"queue": 3}, "queue=3"),
        ({"verbose": True}, "required option 'queue' is missing"),
        (None, "required option 'queue' is missing"),
    ],
)
def test_bad_cfg_is_rejected_before_anything_is_built_or_submitted(
    runner: Runner, factory: Factory, cfg: dict[str, Any] | None, shown: str
) -> None:
    with pytest.raises(InvalidRunConfigError, match=shown):
        runner.run(_app(workspace="/src"), "fake", cfg)
    sched = factory.sched
    assert (sched.built, sched.rendered, sched.scheduled) == ([], [], [])


def test_malformed_handle(runner: Runner) -> None:
    with pytest.raises(MalformedAppHandleError, match="scheduler://session/app_id"):
        runner.status("fake:/sess/x")


# --------------------------------------------------------------------------- job id, labels, cfg


def test_job_id_env_holds_the_real_parseable_handle(runner: Runner, factory: Factory) -> None:
    handle = runner.run(_app(), "fake", CFG, parent_run_id="parent-7")
    (submitted,) = factory.sched.scheduled
    assert len(submitted["replicas"]) == 3
    for rep in submitted["replicas"]:
        assert rep["env"][JOB_ID_ENV] == handle
        assert rep["env"][PARENT_RUN_ID_ENV] == "parent-7"
        assert rep["env"].get("A") == ("1" if rep["role"] == "trainer" else None)
        assert parse_app_handle(rep["env"][JOB_ID_ENV]) == ("fake", SESSION, submitted["app_id"])
    assert submitted["replicas"][1]["cmd"] == ["python", "-m", "train", "--id", submitted["app_id"], "--rank", "1"]


def test_job_id_env_in_dryrun_app_is_the_macro_form(runner: Runner) -> None:
    info = runner.dryrun(_app(), "fake", CFG)
    assert info.app.roles[0].env[JOB_ID_ENV] == f"fake://{SESSION}/{macros.app_id}"
    assert PARENT_RUN_ID_ENV not in info.app.roles[0].env


def test_labels_pass_through_and_list_filters(runner: Runner, factory: Factory) -> None:
    labels = {"airflow.dag_id": "d", "airflow.task_id": "t"}
    info = runner.dryrun(_app(), "fake", CFG, labels=labels)
    assert info.labels == labels
    handle = runner.schedule(info)
    other = runner.run(_app(), "fake", CFG, labels={"airflow.dag_id": "d", "airflow.task_id": "u"})
    unlabelled = runner.run(_app(), "fake", CFG)

    found = runner.list("fake", labels={"airflow.task_id": "t"})
    assert [a.app_handle for a in found] == [handle]
    assert found[0].labels == labels
    assert {a.app_handle for a in runner.list("fake", labels={"airflow.dag_id": "d"})} == {handle, other}
    assert {a.app_handle for a in runner.list("fake")} == {handle, other, unlabelled}
    assert runner.list("fake", labels={"airflow.dag_id": "nope"}) == []
    # FakeScheduler.list cuts its full list with ``newest``; no ``created`` here: the newest
    # are the last by app id
    by_id = sorted([handle, other, unlabelled], key=lambda h: h.rsplit("/", 1)[1])
    assert [a.app_handle for a in runner.list("fake", limit=2)] == by_id[1:]
    assert runner.count("fake", labels={"airflow.dag_id": "d"}) == 2
    with pytest.raises(ValueError, match=r"limit: -1 is not allowed"):
        runner.list("fake", limit=-1)


def test_cfg_from_str_and_run_opts(runner: Runner) -> None:
    assert runner.cfg_from_str("fake", "queue=q1", "verbose=True,tags=a;b") == {
        "queue": "q1",
        "verbose": True,
        "tags": ["a", "b"],
    }
    with pytest.raises(InvalidRunConfigError, match="valid options: queue, tags, verbose"):
        runner.cfg_from_str("fake", "nope=1")
    opts = runner.scheduler_run_opts("fake")
    assert isinstance(opts, runopts) and "queue=QUEUE" in str(opts)


# --------------------------------------------------------------------------- observing


def test_status_and_describe(runner: Runner, factory: Factory) -> None:
    handle = runner.run(_app(), "fake", CFG)
    status = runner.status(handle)
    assert status is not None and status.state == AppState.RUNNING
    assert [r.role for r in status.roles] == ["trainer", "ps"]
    assert "is RUNNING" in status.msg
    desc = runner.describe(handle)
    assert desc is not None and [r.name for r in desc.roles] == ["trainer", "ps"]
    assert runner.describe_native(handle) is None  # FakeScheduler cannot read requests back


def test_unknown_app(runner: Runner) -> None:
    handle = f"fake://{SESSION}/no-such-app"
    assert runner.status(handle) is None
    assert runner.describe(handle) is None
    assert runner.describe_native(handle) is None
    assert runner.wait(handle, wait_interval=0.01) is None
    with pytest.raises(UnknownAppError, match="no-such-app"):
        runner.log_lines(handle, "trainer")
    with pytest.raises(UnknownAppError, match="no-such-app"):
        runner.read_log(handle, "trainer")


def test_logs(runner: Runner) -> None:
    handle = runner.run(_app(), "fake", CFG)
    assert list(runner.log_lines(handle, "ps", k=0)) == ["ps[0] line 0\n", "ps[0] line 1\n", "ps[0] line 2\n"]
    chunk = runner.read_log(handle, "trainer", k=1, max_lines=2)
    assert chunk.lines == ["trainer[1] line 0\n", "trainer[1] line 1\n"] and not chunk.eof
    rest = runner.read_log(handle, "trainer", k=1, cursor=chunk.cursor)
    assert rest.lines == ["trainer[1] line 2\n"]
    for bad in ("garbage", '{"skip": -1}', '{"nope": 1}', "[1]", "[" * 3000 + "]" * 3000):
        with pytest.raises(ValueError, match=r"cursor: .* is not a cursor read_log returned"):
            runner.read_log(handle, "trainer", k=1, cursor=bad)


# --------------------------------------------------------------------------- stopping


def test_cancel_is_idempotent(runner: Runner, factory: Factory) -> None:
    handle = runner.run(_app(), "fake", CFG)
    app_id = parse_app_handle(handle).app_id
    runner.cancel(handle, reason="a test", by=CancelledBy.USER)
    runner.cancel(handle)  # already CANCELLED: nothing more happens
    runner.cancel(f"fake://{SESSION}/no-such-app")
    assert (factory.sched.cancelled, factory.sched.reasons) == ([app_id], ["a test"])
    assert factory.sched.by == [CancelledBy.USER]
    status = runner.status(handle)
    assert status is not None and status.state == AppState.CANCELLED


def test_cancel_leaves_a_finished_app_alone(runner: Runner, factory: Factory) -> None:
    handle = runner.run(_app(), "fake", CFG)
    factory.sched.script[parse_app_handle(handle).app_id] = [AppState.SUCCEEDED]
    runner.cancel(handle)
    assert factory.sched.cancelled == []


def test_delete_is_idempotent(runner: Runner, factory: Factory) -> None:
    handle = runner.run(_app(), "fake", CFG)
    app_id = parse_app_handle(handle).app_id
    runner.delete(handle)
    runner.delete(handle)
    assert factory.sched.cancelled == [app_id]  # a running app is cancelled first
    assert factory.sched.deleted == [app_id]
    assert runner.status(handle) is None


def test_stop_is_a_deprecated_alias_of_cancel(runner: Runner, factory: Factory) -> None:
    handle = runner.run(_app(), "fake", CFG)
    with pytest.warns(DeprecationWarning, match="cancel"):
        runner.stop(handle)
    assert factory.sched.cancelled == [parse_app_handle(handle).app_id]


# --------------------------------------------------------------------------- wait


def test_wait_returns_the_terminal_status(runner: Runner, factory: Factory) -> None:
    info = runner.dryrun(_app(), "fake", CFG)
    factory.sched.script[info.request["app_id"]] = [
        AppState.PENDING,
        AppState.RUNNING,
        AppState.RUNNING,
        AppState.FAILED,
    ]
    handle = runner.schedule(info)
    status = runner.wait(handle, wait_interval=5)
    assert status is not None and status.state == AppState.FAILED
    # One wait per non-terminal status seen, each for the poll interval (no sleep here: the
    # fake scheduler answers at once, as one that can be notified does).
    assert factory.sched.waits == [5, 5, 5]


def test_wait_with_timeout_returns_the_last_non_terminal_status(runner: Runner, factory: Factory) -> None:
    handle = runner.run(_app(), "fake", CFG)
    status = runner.wait(handle, wait_interval=10, timeout=0.2)
    assert status is not None and status.state == AppState.RUNNING
    waits = factory.sched.waits
    assert waits and all(w > 0 for w in waits)
    assert sum(waits) <= 0.2  # never waits beyond the timeout


def test_wait_with_zero_timeout_does_not_block(runner: Runner, factory: Factory) -> None:
    handle = runner.run(_app(), "fake", CFG)
    status = runner.wait(handle, timeout=0)
    assert status is not None and status.state == AppState.RUNNING
    assert factory.sched.waits == []


def test_wait_restores_signal_handlers(runner: Runner, factory: Factory) -> None:
    handle = runner.run(_app(), "fake", CFG)
    before = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT))
    seen: list[object] = []
    factory.sched.on_wait = lambda: seen.append(signal.getsignal(signal.SIGTERM))
    runner.wait(handle, wait_interval=0.01, timeout=0.03)
    assert seen and seen[0] not in before  # installed during the wait (main thread default)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before

    seen.clear()
    runner.wait(handle, wait_interval=0.01, timeout=0.03, cancel_on_signal=False)
    assert seen and all(h == before[0] for h in seen)


def test_wait_in_another_thread_installs_no_signal_handler(runner: Runner, factory: Factory) -> None:
    handle = runner.run(_app(), "fake", CFG)
    before = signal.getsignal(signal.SIGTERM)
    seen: list[object] = []
    factory.sched.on_wait = lambda: seen.append(signal.getsignal(signal.SIGTERM))
    results: list[object] = []

    def wait() -> None:
        try:
            results.append(runner.wait(handle, wait_interval=0.01, timeout=0.03, cancel_on_signal=True))
        except Exception as exc:  # reported below, not swallowed
            results.append(exc)

    thread = threading.Thread(target=wait)
    thread.start()
    thread.join(timeout=10)
    (status,) = results
    assert isinstance(status, AppStatus) and status.state == AppState.RUNNING
    assert seen and all(h == before for h in seen)


def test_run_installs_no_signal_handler(runner: Runner, factory: Factory) -> None:
    before = signal.getsignal(signal.SIGTERM)
    runner.run(_app(), "fake", CFG)
    assert factory.sched.sigterm_handler_at_schedule == before


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_during_wait_cancels_the_job(runner: Runner, factory: Factory, sig: signal.Signals) -> None:
    handle = runner.run(_app(), "fake", CFG)

    def unhandled(signum: int, frame: object) -> None:
        raise AssertionError(f"the runner did not handle {sig.name}")  # instead of killing pytest

    original = signal.signal(sig, unhandled)
    try:
        factory.sched.on_wait = lambda: os.kill(os.getpid(), sig)
        with pytest.raises(SignalException) as exc:
            runner.wait(handle, wait_interval=1, timeout=5)
        assert exc.value.sigval == sig
        assert factory.sched.cancelled == [parse_app_handle(handle).app_id]
        assert signal.getsignal(sig) is unhandled
    finally:
        signal.signal(sig, original)


# --------------------------------------------------------------------------- workspaces


def test_dryrun_builds_workspaces_with_the_resolved_cfg(runner: Runner, factory: Factory) -> None:
    app = _app(workspace="/src")
    info = runner.dryrun(app, "fake", {"queue": "q", "verbose": "true"})
    assert info.app.roles[0].image == "img:1@built1"
    assert info.app.roles[1].image == "img:2"  # no workspace: left as is
    assert app.roles[0].image == "img:1" and app.roles[0].workspace == "/src"
    # The builder sees the cfg the job runs with: typed, defaults filled in.
    assert factory.sched.built == [("img:1", "/src", {"queue": "q", "verbose": True, "tags": None})]


def test_deprecated_workspace_argument(runner: Runner, factory: Factory) -> None:
    app = _app()
    with pytest.warns(DeprecationWarning, match="workspace"):
        info = runner.dryrun(app, "fake", CFG, workspace="/ws")
    assert info.app.roles[0].workspace == "/ws" and app.roles[0].workspace is None
    assert [b[:2] for b in factory.sched.built] == [("img:1", "/ws")]


def test_build_workspace_keys_by_image_and_workspace(runner: Runner, factory: Factory) -> None:
    app = AppDef(
        "ws",
        roles=[
            Role("a", image="base:1", entrypoint="", workspace="/w1"),  # not validated: entrypoint may be empty
            Role("b", image="base:1", entrypoint="x", workspace="/w1"),  # same pair: built once
            Role("c", image="base:2", entrypoint="x", workspace="/w1"),  # other image: built apart
            Role("d", image="base:1", entrypoint="x", workspace="/w2"),
            Role("e", image="base:1", entrypoint="x"),  # no workspace: left out
        ],
    )
    before = copy.deepcopy(app)
    built = runner.build_workspace(app, "fake", CFG)
    assert built == {
        ("base:1", "/w1"): "base:1@built1",
        ("base:2", "/w1"): "base:2@built2",
        ("base:1", "/w2"): "base:1@built3",
    }
    assert [b[:2] for b in factory.sched.built] == [("base:1", "/w1"), ("base:2", "/w1"), ("base:1", "/w2")]
    assert app == before


def test_build_workspace_of_a_role(runner: Runner, factory: Factory) -> None:
    role = Role("r", image="base:1", entrypoint="x", workspace="/w")
    assert runner.build_workspace(role, "fake", CFG) == "base:1@built1"
    assert role.image == "base:1"
    assert runner.build_workspace(Role("r", image="base:1", entrypoint="x"), "fake", CFG) is None
    assert len(factory.sched.built) == 1


def test_build_workspace_without_workspace_support() -> None:
    no_build = Factory(can_build=False)
    with Runner(SESSION, scheduler_factories={"fake": no_build}) as runner:
        app = AppDef("ws", roles=[Role("a", image="base:1", entrypoint="x", workspace="/w")])
        assert runner.build_workspace(app, "fake", CFG) == {}
        assert runner.build_workspace(app.roles[0], "fake", CFG) is None
        info = runner.dryrun(app, "fake", CFG)
        assert info.app.roles[0].image == "base:1"  # runs as is


# --------------------------------------------------------------------------- lifecycle


def test_schedulers_are_made_lazily_once_with_params() -> None:
    factory = Factory()
    with Runner(SESSION, scheduler_factories={"fake": factory}, scheduler_params={"client": "c1"}) as runner:
        assert factory.made == []
        runner.status(f"fake://{SESSION}/x")
        runner.run(_app(), "fake", CFG)
        assert len(factory.made) == 1
        assert factory.sched.session_name == SESSION
        assert factory.sched.params == {"client": "c1"}
        assert runner.session_name == SESSION


def test_context_manager_closes_schedulers() -> None:
    fake, other = Factory(), Factory("other")
    with Runner(SESSION, scheduler_factories={"fake": fake, "other": other}) as runner:
        runner.status(f"fake://{SESSION}/x")
        runner.status(f"other://{SESSION}/x")
    assert fake.sched.closed == 1 and other.sched.closed == 1
    runner.close()  # safe twice: nothing left to close
    assert fake.sched.closed == 1
    runner.status(f"fake://{SESSION}/x")  # a closed runner makes a new scheduler on use
    assert len(fake.made) == 2
    runner.close()


def test_scheduler_backends(runner: Runner) -> None:
    assert runner.scheduler_backends() == ["fake", "other"]


def test_get_runner_finds_the_builtin_schedulers_through_entry_points() -> None:
    with get_runner() as runner:
        backends = runner.scheduler_backends()
        assert {"local_cwd", "local_dir", "aws_batch"} <= set(backends)
        assert runner.session_name == "torchx"
    with get_runner("mine") as runner:
        assert runner.session_name == "mine"


def test_cfg_from_str_with_the_builtin_schedulers() -> None:
    with get_runner() as runner:
        # The runner seed's example, verbatim.
        assert runner.cfg_from_str("local_cwd", "log_dir=/tmp/foobar", "prepend_cwd=True") == {
            "log_dir": "/tmp/foobar",
            "prepend_cwd": True,
        }
        assert runner.cfg_from_str("aws_batch", "queue=q,ulimits=nofile:1024:2048,core:0:0,priority=5") == {
            "queue": "q",
            "ulimits": ["nofile:1024:2048", "core:0:0"],
            "priority": 5,
        }


def test_get_runner_loads_no_backend_until_used() -> None:
    code = textwrap.dedent(
        """
        import sys
        from airflow_provider_torchx.core.runner import get_runner
        with get_runner() as runner:
            runner.scheduler_backends()
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("boto3", "botocore", "docker", "moto")
                       or m.startswith("airflow_provider_torchx.core.schedulers.aws_batch")
                       or m.startswith("airflow_provider_torchx.core.schedulers.local"))
        print(heavy)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


# --------------------------------------------------------------------------- components


def test_run_component_from_a_file(runner: Runner, factory: Factory, tmp_path: Path) -> None:
    comp = tmp_path / "comp.py"
    comp.write_text(
        textwrap.dedent(
            '''
            from airflow_provider_torchx.core.specs import AppDef, Role


            def hello(msg: str = "hi", image: str = "img:1") -> AppDef:
                """Say something.

                Args:
                    msg: what to say
                    image: the image
                """
                return AppDef("hello", roles=[Role("hello", image=image, entrypoint="echo", args=[msg])])
            '''
        )
    )
    info = runner.dryrun_component(f"{comp}:hello", ["--msg", "hey"], "fake", CFG)
    assert info.app.roles[0].args == ["hey"]
    assert JOB_ID_ENV in info.app.roles[0].env
    assert factory.sched.scheduled == []
    handle = runner.run_component(f"{comp}:hello", {"msg": "yo"}, "fake", CFG, labels={"k": "v"})
    (submitted,) = factory.sched.scheduled
    assert submitted["replicas"][0]["cmd"] == ["echo", "yo"]
    assert parse_app_handle(handle).app_id == submitted["app_id"]
    assert runner.list("fake", labels={"k": "v"})[0].app_handle == handle
