"""The TorchX pages in a real browser (Debian's Chromium, Playwright) against a live Airflow
whose api-server loaded the provider's plugin, with real logins (an admin and a viewer).

One deferred DAG run's job, followed as a user would (``browser_ui.py`` drives the browser): the
jobs page lists it with when it was submitted and started and a duration that advances, its page
shows both replicas, the times and log lines arriving while it runs, the task page's "TorchX
Job" link opens that page and its "TorchX" tab lists the job, a viewer cannot cancel (403 from
the plugin's API), the admin's Cancel stops the job and the task fails saying it was cancelled.
Beside it, in the same store, a failed job of the same DAG (its page shows the root cause and
the usage), and an unrelated ``torchx`` connection to AWS Batch that cannot be listed: its
error shows once, collapsed, below the jobs, and not at all on the task's tab. The pages follow
Airflow's color mode (the system's, and the one chosen in Airflow's UI).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path
from urllib.parse import quote

import pytest

from airflow_provider_torchx.core.specs import AppDef, Resource, Role
from tests.e2e.deployment import wait_until
from tests.e2e.live import LiveAirflow, still_running, task_labels

pytestmark = [pytest.mark.airflow, pytest.mark.airflow_line]  # the pages on each line's api-server

REPO = Path(__file__).resolve().parents[2]
BROWSER_PYTHON = REPO / ".venv-browser" / "bin" / "python"
DAG = "torchx_e2e_deferred"
#: Where to write the docs' screenshots (``docs/img``) when set; the test never needs them.
SCREENSHOTS_ENV = "TORCHX_UI_SCREENSHOTS"


def browse(spec: dict[str, object]) -> dict[str, object]:
    """Run the browser scenario with the browser virtualenv's Python; return what it saw."""
    if not BROWSER_PYTHON.exists() or not Path("/usr/bin/chromium").exists():
        pytest.fail("no browser: run scripts/browser-venv.sh (Debian's chromium + Playwright in .venv-browser)")
    proc = subprocess.run(
        [str(BROWSER_PYTHON), str(Path(__file__).with_name("browser_ui.py"))],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    seen: dict[str, object] = json.loads(proc.stdout)
    return seen


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


def failed_job(live: LiveAirflow) -> str:
    """Submit (to the deployment's job store) a job of ``DAG`` whose one replica fails with a
    root cause; return its handle once it ended."""
    record = f"printf '%s\\n' {shlex.quote(ERROR_FILE)} > \"$TORCHELASTIC_ERROR_FILE\""
    script = f"echo step 1; echo 'loss is NaN' >&2; sleep 1; {record}; exit 3"
    role = Role("trainer", image="/", entrypoint="sh", args=["-c", script], resource=Resource(cpu=1, gpu=0, memMB=128))
    app_id = live.scheduler.submit(AppDef("ui-failed", roles=[role]), labels=task_labels(DAG, "manual-failed"))
    wait_until(lambda: live.scheduler.describe(app_id).state.is_terminal(), 60, "the failed job to end")
    return f"local_cwd://torchx/{app_id}"


def test_jobs_page_job_page_link_and_cancel_in_a_browser(live_airflow_users: LiveAirflow) -> None:
    live, api = live_airflow_users, live_airflow_users.deployment
    extra = {"scheduler": "aws_batch", "cfg": "queue=elsewhere,profile=torchx-ui-no-such-profile"}
    conn = {"connection_id": UNRELATED_CONN, "conn_type": "torchx", "extra": json.dumps(extra)}
    api.api("POST", "/connections", conn)
    failed = failed_job(live)
    run_id = live.trigger(DAG, {"lines": 600, "pause": 1, "replicas": 2})
    api.wait_for_state(DAG, run_id, "job", {"deferred"})
    handle = live.app_handle(DAG, run_id)
    live.wait_for_log(DAG, run_id, "deferred")
    procs = live.long_lived_processes(handle)
    link_line = f"TorchX Job: {api.base_url}/torchx/job?handle={quote(handle, safe='')}&conn_id=torchx_default"
    assert any(link_line in line for line in live.log(DAG, run_id)), "the task log's link is a full address"

    seen = browse(
        {
            "base_url": api.base_url,
            "admin_token": api.token("admin"),
            "viewer_token": api.token("viewer"),
            "dag_id": DAG,
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
        f"'viewer' may not cancel this job: needs edit rights on the task instances of DAG '{DAG}'"
    )
    assert seen["cancelled_shown"] is True

    ti = api.wait_for_state(DAG, run_id, "job", {"failed"}, timeout=120)
    assert live.job_state(handle)["state"] == "CANCELLED"
    assert not still_running(procs), "the job's processes outlived the cancel"
    path = f"/dags/{DAG}/dagRuns/{run_id}/taskInstances/job/logs/{ti['try_number']}?full_content=true"
    end = json.dumps(api.api("GET", path)["content"][-10:])  # the exception is in its event's error_detail
    assert "Task failed with exception" in end and f"{handle} ended CANCELLED: cancelled by request" in end, end
    print(f"a new log line showed {seen['log_new_line_after_s']}s after the first ones")
