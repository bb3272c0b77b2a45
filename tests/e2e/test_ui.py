"""The TorchX pages in a real browser (Debian's Chromium, Playwright) against a live Airflow
whose api-server loaded the provider's plugin, with real logins (an admin and a viewer).

One deferred DAG run's job, followed as a user would (``browser_ui.py`` drives the browser): the
jobs page lists it, its page shows both replicas and log lines arriving while it runs, the task
page's "TorchX Job" link opens that page and its "TorchX" tab lists the job, a viewer cannot
cancel (403 from the plugin's API), the admin's Cancel stops the job and the task fails saying
it was cancelled.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from urllib.parse import quote

import pytest

from tests.e2e.live import LiveAirflow, still_running

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


def test_jobs_page_job_page_link_and_cancel_in_a_browser(live_airflow_users: LiveAirflow) -> None:
    live, api = live_airflow_users, live_airflow_users.deployment
    run_id = live.trigger(DAG, {"lines": 600, "pause": 1, "replicas": 2})
    api.wait_for_state(DAG, run_id, "job", {"deferred"})
    handle = live.app_handle(DAG, run_id)
    live.wait_for_log(DAG, run_id, "deferred")
    procs = live.long_lived_processes(handle)

    seen = browse(
        {
            "base_url": api.base_url,
            "admin_token": api.token("admin"),
            "viewer_token": api.token("viewer"),
            "dag_id": DAG,
            "run_id": run_id,
            "task_id": "job",
            "handle": handle,
            "screenshots": os.environ.get(SCREENSHOTS_ENV),
        }
    )
    assert "error" not in seen, f"{seen.pop('error')}; saw {seen}"
    assert handle.rsplit("/", 1)[1] in str(seen["list_row"]) and "RUNNING" in str(seen["list_row"]), seen
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
