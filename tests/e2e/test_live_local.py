"""Local-scheduler jobs on a live Airflow deployment, driven through the REST API only.

Deferred tasks stream replica lines into the task log while deferred, each line once, through a
triggerer restart that neither cancels the job nor repeats a line, and on a triggerer just
started from the trigger's first look on; marking a deferred task failed cancels its job and
its log says why; a 2 x 2 DDP job (real PyTorch, ``scripts/torch-venv.sh``) succeeds with every
rank's lines once; 50 deferred tasks at once (8 on the older Airflow lines: ``SECRET_TASKS``)
whose jobs print their secrets leave the triggerer up, succeed, and show the secrets masked in
every task log. (A SIGKILLed task whose retry adopts its running job: ``test_live_orphans.py``.)

The TorchX pages in a real browser (Debian's Chromium, Playwright), on the same deployment with
real logins (an admin and a viewer). One deferred DAG run's job, followed as a user would
(``browser_ui.py`` drives the browser): the jobs page lists it with when it was submitted and
started and a duration that advances, its page shows both replicas, the times and log lines
arriving while it runs, the task page's "TorchX Job" link opens that page and its "TorchX" tab
lists the job, a viewer cannot cancel (403 from the plugin's API), the admin's Cancel stops the
job and the task fails saying it was cancelled. Beside it, in the same store, a failed job of
the same DAG (priced at rates: the list shows its cost; its page the root cause and the usage),
and an unrelated ``torchx`` connection to AWS Batch that cannot be listed: its error shows once,
collapsed, below the jobs, and not at all on the task's tab. The pages follow Airflow's color
mode (the system's, and the one chosen in Airflow's UI). The browser test runs last: it adds
that connection.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psutil
import pytest

from airflow_provider_torchx.core import checkpoints
from airflow_provider_torchx.core.rates import Rates
from airflow_provider_torchx.core.specs import AppDef, Resource, Role
from tests.e2e.deployment import COMPONENTS, TERMINAL_TI_STATES, wait_until
from tests.e2e.live import (
    E2E_SETTING,
    REPLICA_LINE,
    SECRET_TASKS,
    TRIGGER_STARTED,
    LiveAirflow,
    assert_each_line_once,
    browse,
    expected_lines,
    processes_of,
    still_running,
    task_labels,
)
from tests.fixtures.torch import nodes_stderr

pytestmark = [pytest.mark.airflow, pytest.mark.airflow_line]  # the live stack and the pages on each line's api-server

DEFERRED = "torchx_e2e_deferred"
DDP = "torchx_e2e_ddp"
SECRETS = "torchx_e2e_secrets"
#: How long the job's processes may outlive marking the task failed (Airflow's on_kill timeout
#: is 30 s; the cancel grace period 10 s).
CANCEL_WITHIN = 35
#: The most seconds from a trigger's start to its first replica line in the task log that the
#: fresh-triggerer test allows: the first look comes at once, before the start check's Task SDK
#: request, whose first answer a fresh triggerer takes seconds to give.
FIRST_LOOK_WITHIN = 3.0


def test_a_fresh_triggerers_first_look_shows_a_short_jobs_lines_while_deferred(
    live_airflow: LiveAirflow, tmp_path: Path
) -> None:
    """On a triggerer just started, a 2-replica job that prints its lines over a few seconds
    shows them in the task log while the task is deferred, the first within
    ``FIRST_LOOK_WITHIN`` seconds of the trigger's start: the trigger's start check (a Task
    SDK request, whose first answer a fresh triggerer takes seconds to give while it writes no
    log line) does not come before the first look. The gate holds the job until the test
    has looked, however slowly the triggerer starts; then every line is in the log once."""
    live, api = live_airflow, live_airflow.deployment
    api.stop_component("triggerer", signal.SIGTERM)
    api.start_component("triggerer")
    gate = tmp_path / "gate"
    try:
        run_id, _ = live.start_watched(DEFERRED, {"lines": 20, "pause": 0.2, "replicas": 2, "gate": str(gate)})
        events = api.timed_task_log(DEFERRED, run_id, "job", 1)
        # An event before the scheduler took in the deferral fails the resumed task (apache/airflow#72716).
        wait_until(
            lambda: -1 in api.deferrals_taken_in(run_id),
            120,
            "the scheduler to take in the deferral",
            seen=lambda: api.log_tails("scheduler"),
        )
    finally:
        gate.touch()
    started = next(t for t, e in events if t is not None and TRIGGER_STARTED.match(e))
    first = next(t for t, e in events if t is not None and REPLICA_LINE.match(e))
    first_look = (first - started).total_seconds()
    print(f"first replica line {first_look:.2f}s after the trigger started")
    assert 0 <= first_look <= FIRST_LOOK_WITHIN, "\n".join(e for _, e in events[-40:])

    api.wait_for_state(DEFERRED, run_id, "job", {"success"}, timeout=180)
    assert_each_line_once(live.log(DEFERRED, run_id), expected_lines(20, 2), run_id)


def test_deferred_job_logs_while_deferred_and_each_line_once_through_a_triggerer_restart(
    live_airflow: LiveAirflow, tmp_path: Path
) -> None:
    """Lines show in the task log while the task is deferred; stopping the triggerer neither
    cancels the job nor stops a replica, and the restarted one goes on from the saved position:
    in the end every line is in the log once and the job succeeded. The job ends only once the
    test opens its gate, after the restart (however slowly the triggerer starts its trigger)."""
    live, api = live_airflow, live_airflow.deployment
    gate = tmp_path / "gate"
    run_id, handle = live.start_watched(DEFERRED, {"lines": 20, "pause": 1, "replicas": 2, "gate": str(gate)})
    replicas = live.replica_processes(handle)
    procs = live.long_lived_processes(handle)

    api.stop_component("triggerer", signal.SIGTERM)
    try:
        status = live.scheduler.describe(live.job_dir(handle).name)
        assert status is not None and status.state.name == "RUNNING", status
        assert not status.cancel_requested, "stopping the triggerer cancelled the job"
        assert still_running(procs) == procs, "the supervisor or a replica ended with the triggerer"
    finally:
        api.start_component("triggerer")
    gate.touch()

    api.wait_for_state(DEFERRED, run_id, "job", {"success"}, timeout=180)
    assert live.replica_processes(handle) == replicas
    assert live.job_state(handle)["state"] == "SUCCEEDED"
    assert_each_line_once(live.log(DEFERRED, run_id), expected_lines(20, 2), run_id)


@pytest.mark.timeout(1800)  # within its own waits' deadlines (900 + 300 + 600 s), not the default 300 s
def test_many_deferred_jobs_with_secrets_keep_the_triggerer_up_and_their_logs_masked(
    live_airflow: LiveAirflow, tmp_path: Path
) -> None:
    """The triggerer watches ``SECRET_TASKS`` jobs at once whose env holds secrets (``MY_PASSWORD`` from a
    Variable, ``HF_TOKEN``; the tasks take their scheduler from a ``torchx`` connection):
    registering the secrets must not crash it (a synchronous Task SDK call from the watch pool
    did, on Airflow 3.1), every task succeeds and no task log shows a secret."""
    live, api = live_airflow, live_airflow.deployment
    triggerer = api.procs["triggerer"]
    token = "hf_e2e_token_q7Z2xW"
    gate = tmp_path / "gate"
    run_id = live.trigger(SECRETS, {"gate": str(gate), "hf_token": token})

    def states() -> list[str]:
        assert triggerer.poll() is None, "the triggerer exited:\n" + api.component_log("triggerer")[-6000:]
        tis = api.task_instances(SECRETS, run_id)
        ended = [ti for ti in tis if ti["state"] in TERMINAL_TI_STATES]
        assert not ended, f"{[(ti['map_index'], ti['state']) for ti in ended]} ended before the gate opened"
        return [ti["state"] for ti in tis]

    try:
        wait_until(
            lambda: states().count("deferred") == SECRET_TASKS,
            900,
            f"{SECRET_TASKS} tasks deferred at once",
            seen=lambda: f"task states {Counter(states())}" + api.log_tails("scheduler", "triggerer"),
        )
        everyone = set(range(SECRET_TASKS))
        wait_until(
            lambda: api.deferrals_taken_in(run_id) >= everyone,
            300,
            "the scheduler to take in every deferral",
            seen=lambda: f"taken in: {sorted(api.deferrals_taken_in(run_id))}" + api.log_tails("scheduler"),
        )
    finally:
        gate.touch()  # also on a failure: held jobs would keep the next tests' tasks from slots

    def done() -> list[dict[str, Any]] | None:
        assert triggerer.poll() is None, "the triggerer exited:\n" + api.component_log("triggerer")[-6000:]
        tis = api.task_instances(SECRETS, run_id)
        return tis if all(ti["state"] in TERMINAL_TI_STATES for ti in tis) else None

    tis = wait_until(
        done,
        600,
        "every task to end",
        seen=lambda: (
            f"task states {Counter(ti['state'] for ti in api.task_instances(SECRETS, run_id))}"
            + api.log_tails("scheduler", "triggerer")
        ),
    )
    failed = sorted((ti["map_index"], ti["state"]) for ti in tis if ti["state"] != "success")
    assert not failed, (
        f"not successful: {failed}\n"
        + "\n".join(api.task_log(SECRETS, run_id, "job", 1, failed[0][0]))
        + api._known_races(run_id)
    )
    assert api.procs["triggerer"] is triggerer and triggerer.poll() is None
    assert psutil.pid_exists(triggerer.pid)
    triggerer_log = api.component_log("triggerer")
    for i in range(SECRET_TASKS):
        events = api.task_log(SECRETS, run_id, "job", 1, i)
        text = "\n".join(events)
        assert E2E_SETTING not in text and token not in text, f"task {i} shows a secret:\n{text}"
        # Each line once in the task's own log, the last one too: the trigger logs nothing in
        # the round that finds the job ended (the triggerer closes its log file then), the
        # resumed task does.
        for line in (f"[sh/0] job {i} started", f"[sh/0] job {i} password *** token ***"):
            elsewhere = " (it is in the triggerer's log)" if line in triggerer_log else ""
            assert events.count(line) == 1, f"task {i}: {line!r} {events.count(line)} times{elsewhere}:\n{text[-4000:]}"
    for name in COMPONENTS:
        assert E2E_SETTING not in api.component_log(name) and token not in api.component_log(name), name


@pytest.mark.torch
@pytest.mark.usefixtures("torch_venv")
def test_ddp_on_two_nodes_succeeds_with_every_ranks_lines_once(live_airflow: LiveAirflow) -> None:
    live, api = live_airflow, live_airflow.deployment
    run_id = live.trigger(DDP, {})
    try:
        api.wait_for_state(DDP, run_id, "job", {"success"}, timeout=300)
    except AssertionError as err:
        raise AssertionError(f"{err}\n{nodes_stderr(live.job_dir(live.app_handle(DDP, run_id)))}") from None
    events = live.log(DDP, run_id)
    ranks = [e for e in events if re.match(r"^\[ddp_train/[01]\] rank \d of 4: all_reduce sum 6$", e)]
    assert sorted(e.split("] ")[1] for e in ranks) == [f"rank {r} of 4: all_reduce sum 6" for r in range(4)], ranks
    for r in range(4):
        steps = [e for e in events if re.match(rf"^\[ddp_train/[01]\] rank {r} step \d loss ", e)]
        assert len(steps) == 3, steps  # the script's 3 steps, each line once


def test_marking_the_deferred_task_failed_cancels_its_job(live_airflow: LiveAirflow) -> None:
    """Marking the deferred task failed ends its job's processes within ``CANCEL_WITHIN``
    seconds, the job ``CANCELLED`` and the task ``failed``; the task's log says that the job
    was cancelled and why, in the words of the job's record (whichever cancel came first: the
    api-server's reaper, the trigger's ``on_kill`` on 3.3, its cancel on 3.1/3.2)."""
    live, api = live_airflow, live_airflow.deployment
    run_id, handle = live.start_watched(DEFERRED, {"lines": 600, "pause": 1, "replicas": 2})
    procs = live.job_processes(handle)
    replicas = live.replica_processes(handle)
    assert {p.pid for p in procs} >= {pid for pid, _ in replicas} and len(replicas) == 2, procs

    api.set_state(DEFERRED, run_id, "job", "failed")
    marked = time.monotonic()
    try:
        wait_until(lambda: not still_running(procs), CANCEL_WITHIN, "the job's processes to end")
    except TimeoutError:
        pytest.fail(f"still running {CANCEL_WITHIN}s after the task was marked failed: {still_running(procs)}")
    assert not processes_of(live.job_dir(handle))
    print(f"job processes gone {time.monotonic() - marked:.1f}s after marking the task failed")
    assert live.job_state(handle)["state"] == "CANCELLED"
    assert api.task_instance(DEFERRED, run_id, "job")["state"] == "failed"
    desc = live.scheduler.describe(live.job_dir(handle).name)
    assert desc is not None and desc.cancel_reason, desc
    reason = desc.cancel_reason
    said = wait_until(
        lambda: [e for e in live.log(DEFERRED, run_id) if handle in e and "ancel" in e and reason in e],
        30,
        f"the task log to say that {handle} was cancelled: {reason}",
        seen=lambda: "\n".join(live.log(DEFERRED, run_id)[-20:]),
    )
    print(f"the task log says: {said}")


#: Where to write the docs' screenshots (``docs/img``) when set; the test never needs them.
SCREENSHOTS_ENV = "TORCHX_UI_SCREENSHOTS"
#: A connection of AWS Batch whose jobs no one asked for, which cannot be listed (a profile it
#: cannot use: an error raised before any call leaves the host).
UNRELATED_CONN = "torchx_unrelated_batch"
#: What the failed job's replica writes to its error file (as a rank recorded by torchrun), then
#: it exits 3.
ERROR_FILE = json.dumps(
    {
        "message": {
            "message": "RuntimeError: loss is NaN",
            "errorCode": 3,
            "extraInfo": {
                "py_callstack": 'Traceback (most recent call last):\n  File "train.py", line 9, in step\n'
                "    raise RuntimeError('loss is NaN')\nRuntimeError: loss is NaN",
                "timestamp": "1700000000",
            },
        }
    }
)


def failed_job(live: LiveAirflow) -> tuple[str, Path]:
    """Submit (to the deployment's job store) a job of the ``DEFERRED`` DAG whose one replica saves a
    checkpoint and fails with a root cause, priced at rates; return its handle once it ended, and
    its checkpoint location."""
    record = f"printf '%s\\n' {shlex.quote(ERROR_FILE)} > \"$TORCHELASTIC_ERROR_FILE\""
    save = 'mkdir -p "$TORCHX_CHECKPOINT_DIR" && echo w > "$TORCHX_CHECKPOINT_DIR/step-1.pt"'
    script = f"echo step 1; {save}; echo 'loss is NaN' >&2; sleep 1; {record}; exit 3"
    role = Role("trainer", image="/", entrypoint="sh", args=["-c", script], resource=Resource(cpu=1, gpu=0, memMB=128))
    app = AppDef("ui-failed", roles=[role])
    location = live.state_dir.parent / "ui-checkpoints" / "failed"
    checkpoints.place(app, str(location), 0, host_paths=True)
    labels = task_labels(DEFERRED, "manual-failed") | Rates(vcpu_hour=360.0).labels()  # 10 cents a vCPU-second
    app_id = live.scheduler.submit(app, labels=labels)
    wait_until(lambda: live.scheduler.describe(app_id).state.is_terminal(), 60, "the failed job to end")
    return f"local_cwd://torchx/{app_id}", location


def test_jobs_page_job_page_link_and_cancel_in_a_browser(live_airflow: LiveAirflow) -> None:
    live, api = live_airflow, live_airflow.deployment
    extra = {"scheduler": "aws_batch", "cfg": "queue=elsewhere,profile=torchx-ui-no-such-profile"}
    conn = {"connection_id": UNRELATED_CONN, "conn_type": "torchx", "extra": json.dumps(extra)}
    api.api("POST", "/connections", conn)
    failed, location = failed_job(live)
    run_id = live.trigger(DEFERRED, {"lines": 600, "pause": 1, "replicas": 2})
    api.wait_for_state(DEFERRED, run_id, "job", {"deferred"})
    handle = live.app_handle(DEFERRED, run_id)
    live.wait_for_log(DEFERRED, run_id, "deferred")
    procs = live.long_lived_processes(handle)
    link_line = f"TorchX Job: {api.base_url}/torchx/job?handle={quote(handle, safe='')}&conn_id=torchx_default"
    assert any(link_line in line for line in live.log(DEFERRED, run_id)), "the task log's link is a full address"

    seen = browse(
        {
            "base_url": api.base_url,
            "admin_token": api.token("admin"),
            "viewer_token": api.token("viewer"),
            "dag_id": DEFERRED,
            "run_id": run_id,
            "task_id": "job",
            "handle": handle,
            "failed_handle": failed,
            "unrelated_conn": UNRELATED_CONN,
            "screenshots": os.environ.get(SCREENSHOTS_ENV),
        }
    )
    assert "error" not in seen, f"{seen.pop('error')}; saw {seen}"
    assert handle.rsplit("/", 1)[1] in str(seen["list_row"]) and "RUNNING" in str(seen["list_row"]), seen
    times = seen["list_times"]
    assert isinstance(times, dict) and times["submitted"] and times["started"], seen
    assert times["duration_first"] != times["duration_later"] and times["duration_later"].endswith("s"), times
    sources = seen["source_errors"]
    assert isinstance(sources, dict) and sources["shown"] and not sources["open"] and sources["below_jobs"], sources
    assert f"connection {UNRELATED_CONN}" in sources["summary"] and sources["count"] == 1, sources
    assert "profile='torchx-ui-no-such-profile'" in str(sources["detail"]), sources
    assert seen["task_tab_source_errors_shown"] is False, "another source's error on a task's tab whose jobs were found"
    job_times = seen["job_times"]
    assert isinstance(job_times, dict) and job_times["submitted"] and job_times["started"], seen
    assert job_times["duration_first"] != job_times["duration_later"] and not job_times["ended"], job_times
    cause = seen["failed_job"]
    assert isinstance(cause, dict) and cause["state"] == "FAILED", seen
    head = "Root cause (replica trainer/0, exit code 3): RuntimeError: loss is NaN"
    assert cause["root_cause"].startswith(head), cause
    assert 'File "train.py", line 9, in step' in cause["root_cause"], cause
    assert cause["usage"]["attempts"] == "1" and "GPU-h" in cause["usage"]["GPU-hours"], cause
    assert cause["ended"] and cause["duration"].endswith("s"), cause
    assert cause["failure_kind"] == "app" and cause["cause_on_top"] is True, cause
    # Start over: a viewer may not; the admin's sets the ended job's checkpoints aside, kept
    assert seen["viewer_start_over_disabled"] is True and seen["start_over_enabled"] is True, seen
    shown = str(seen["start_over_msg"])
    assert shown.startswith(f"set aside: {location} \u2192 {location}+set-aside-"), shown
    moved = shown.split(" \u2192 ")[1].split(" (kept;")[0]
    assert Path(moved, "step-1.pt").exists() and not location.exists(), shown
    costs = seen["list_costs"]
    assert isinstance(costs, dict) and costs["running"] == "", costs  # no rates: blank
    assert costs["failed"].startswith("$") and costs["failed"] == cause["usage"]["cost"], (costs, cause)
    assert seen["dark_by_system"] is True and seen["light_by_airflow_choice"] is True, seen
    assert seen["task_tab_dark"] is True, "the TorchX tab follows Airflow's color mode"
    assert seen["replicas"] == [["sh", "0", "RUNNING"], ["sh", "1", "RUNNING"]], seen
    first, later = seen["log_first"], seen["log_later"]
    assert isinstance(first, list) and isinstance(later, list)
    assert first[0] == "r0 line 1" and later[: len(first)] == first and len(later) > len(first), seen
    assert seen["task_link_href"] == f"/torchx/job?handle={quote(handle, safe='')}&conn_id=torchx_default", seen
    assert seen["task_tab_lists_job"] is True
    assert seen["viewer_cancel_disabled"] is True and seen["viewer_cancel_status"] == 403, seen
    assert seen["viewer_cancel_detail"] == (
        f"'viewer' may not cancel this job: needs edit rights on the task instances of DAG '{DEFERRED}'"
    )
    assert seen["cancelled_shown"] is True

    ti = api.wait_for_state(DEFERRED, run_id, "job", {"failed"}, timeout=120)
    assert live.job_state(handle)["state"] == "CANCELLED"
    assert not still_running(procs), "the job's processes outlived the cancel"
    path = f"/dags/{DEFERRED}/dagRuns/{run_id}/taskInstances/job/logs/{ti['try_number']}?full_content=true"
    end = json.dumps(api.api("GET", path)["content"][-10:])  # the exception is in its event's error_detail
    assert "Task failed with exception" in end and f"{handle} ended CANCELLED: cancelled by request" in end, end
    print(f"a new log line showed {seen['log_new_line_after_s']}s after the first ones")
