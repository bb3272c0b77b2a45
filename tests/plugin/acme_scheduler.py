"""``acme``: a minimal scheduler written only against the public scheduler contract.

Each app is one replica of one role, run as ``sh -c`` in a new session with its output in a
file; the job directory (under ``$ACME_JOBS_DIR``) holds the pid, the exit code, torchrun's
error file (``TORCHELASTIC_ERROR_FILE``) and a cancel mark holding the cancel's reason. It
declares its capabilities (host-bound: its jobs are processes of this host; error files: this
host reads them; prune: it removes its ended jobs' directories) and its run options for
parse-time checks (``acme_options``, registered in the ``airflow_provider_torchx.run_options``
entry point group), and leaves everything else to the contract's defaults (``read_log`` from
``log_iter``, status read on the watchers' thread pool).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from airflow_provider_torchx.core.errorfile import ERROR_FILE_ENV
from airflow_provider_torchx.core.runopts import Cfg, CfgVal, runopts
from airflow_provider_torchx.core.schedulers.api import (
    CancelledBy,
    DescribeAppResponse,
    ListAppResponse,
    Scheduler,
    SchedulerCapabilities,
    Stream,
    labels_match,
    newest,
)
from airflow_provider_torchx.core.specs import AppDef, AppDryRunInfo, AppState, ReplicaStatus, RoleStatus
from tests.plugin import acme_options

_WRAPPER = '"$3" -c "$1" > "$2/out.log" 2>&1; echo $? > "$2/exit.tmp"; mv "$2/exit.tmp" "$2/exit"'


class AcmeScheduler(Scheduler[dict[str, Any]]):
    """Jobs are ``sh -c`` processes of this host (see the module docstring)."""

    capabilities = SchedulerCapabilities(host_bound=True, error_files=True, prune=True)

    def __init__(self, session_name: str) -> None:
        super().__init__("acme", session_name)
        self.root = Path(os.environ["ACME_JOBS_DIR"])

    def _run_opts(self) -> runopts:
        return acme_options.run_opts()

    def _submit_dryrun(self, app: AppDef, cfg: dict[str, CfgVal], labels: dict[str, str]) -> AppDryRunInfo[Any]:
        role = app.roles[0]
        request = {"name": app.name, "cmd": [role.entrypoint, *role.args], "labels": labels, "shell": cfg["shell"]}
        return AppDryRunInfo(request, json.dumps)

    def schedule(self, dryrun_info: AppDryRunInfo[dict[str, Any]]) -> str:
        app_id = f"{dryrun_info.request['name']}-{uuid.uuid4().hex[:8]}"
        job = self.root / app_id
        job.mkdir(parents=True)
        (job / "request.json").write_text(json.dumps(dryrun_info.request))
        command = " ".join(_quote(a) for a in dryrun_info.request["cmd"])
        env = {**os.environ, ERROR_FILE_ENV: str(job / "error.json")}
        shell = str(dryrun_info.request["shell"])
        argv = ["sh", "-c", _WRAPPER, "acme", command, str(job), shell]
        # Nothing of the submitter's (its stdio: an Airflow task's output pipes, which its
        # supervisor reads to the end, would stay open as long as the job runs).
        quiet = subprocess.DEVNULL
        proc = subprocess.Popen(argv, start_new_session=True, env=env, stdin=quiet, stdout=quiet, stderr=quiet)
        (job / "pid").write_text(str(proc.pid))
        return app_id

    def read_error_file(self, app_id: str, role_name: str, k: int) -> tuple[str, float] | None:
        path = self.root / app_id / "error.json"
        if (role_name, k) != ("main", 0) or not path.is_file():
            return None
        return path.read_text(), path.stat().st_mtime

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        job = self.root / app_id
        if not (job / "request.json").exists():
            return None
        request = json.loads((job / "request.json").read_text())
        code = int((job / "exit").read_text()) if (job / "exit").exists() else None
        cancel = (job / "cancelled").read_text() if (job / "cancelled").exists() else None  # its reason
        by = (job / "cancelled_by").read_text() if (job / "cancelled_by").exists() else None
        if cancel is not None:
            state = AppState.CANCELLED
        elif code is None:
            state = AppState.RUNNING
        else:
            state = AppState.SUCCEEDED if code == 0 else AppState.FAILED
        replica = ReplicaStatus(id=0, state=state, role="main", exit_code=code)
        return DescribeAppResponse(
            app_id=app_id,
            state=state,
            msg="" if code in (0, None) else f"main/0 exited with {code}",
            roles_statuses=[RoleStatus("main", [replica])],
            labels=dict(request["labels"]),
            cancel_requested=cancel is not None,
            cancel_reason=cancel or None,
            cancelled_by=CancelledBy.parse(by),
        )

    def list(
        self, cfg: Cfg | None = None, labels: Mapping[str, str] | None = None, *, limit: int | None = None
    ) -> list[ListAppResponse]:
        apps = []
        for job in self.root.iterdir() if self.root.is_dir() else ():
            desc = self.describe(job.name)
            if desc is not None and labels_match(desc.labels, labels):
                request = json.loads((job / "request.json").read_text())
                created = (job / "request.json").stat().st_mtime
                apps.append(
                    ListAppResponse(job.name, desc.state, name=request["name"], labels=desc.labels, created=created)
                )
        return newest(apps, limit)

    def prune(self, older_than: float, states: Iterable[str] = (), dry_run: bool = False) -> list[tuple[str, int]]:
        """The ended jobs' directories, by when their exit code or cancel mark was written."""
        cutoff, wanted = time.time() - older_than, {s.upper() for s in states}
        ended = []
        for app in self.list():
            job = self.root / app.app_id
            mark = job / ("cancelled" if app.state is AppState.CANCELLED else "exit")
            wanted_state = app.state.is_terminal() and (not wanted or app.state.name in wanted)
            if wanted_state and mark.exists() and mark.stat().st_mtime <= cutoff:
                ended.append((mark.stat().st_mtime, app.app_id))
        pruned = []
        for _, app_id in sorted(ended):
            job = self.root / app_id
            pruned.append((app_id, sum(f.stat().st_size for f in job.iterdir())))
            if not dry_run:
                shutil.rmtree(job)
        return pruned

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
        path = self.root / app_id / "out.log"
        return path.read_text().splitlines(keepends=True) if path.exists() else []

    def _cancel_existing(self, app_id: str, reason: str | None, by: CancelledBy | None) -> None:
        job = self.root / app_id
        if by is not None:
            (job / "cancelled_by").write_text(by.value)
        (job / "cancelled").write_text(reason or "")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int((job / "pid").read_text()), signal.SIGKILL)


def _quote(word: str) -> str:
    return "'" + word.replace("'", "'\\''") + "'"


def create_scheduler(session_name: str, **kwargs: object) -> AcmeScheduler:
    """The plugin's entry point (unknown kwargs are ignored, as every factory does)."""
    return AcmeScheduler(session_name)
