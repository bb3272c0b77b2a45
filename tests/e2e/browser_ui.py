"""Drives the TorchX pages of a live Airflow in Debian's Chromium with Playwright, as a user would.

Run by ``tests/e2e/live.py``'s ``browse`` with the browser virtualenv's Python (``.venv-browser``, made by
``scripts/browser-venv.sh``), so the project's virtualenv needs no Playwright; it imports only
Playwright and the standard library. Reads one JSON object (the scenario's inputs) on stdin,
prints one JSON object (what it saw) on stdout; a step that fails ends the run with what was
seen so far and the error.

Scenario, on one running job of a DAG (two replicas printing ``r<k> line <i>`` each second),
a failed job of the same DAG (``failed_handle``) and a connection that cannot be listed
(``unrelated_conn``):
1. the jobs page, filtered by the DAG, lists the job with when it was submitted and started
   and a duration that advances; the unlisted connection is named once, collapsed, below the
   jobs; the job's page shows the times (its duration advancing), both replicas and log lines
   arriving while the job runs; the failed job (priced at rates) shows its cost in the list's
   cost column (the running one, without rates, none) and its page its root cause, times and
   usage, and its "Start over" sets its checkpoints aside;
2. the task page's "TorchX Job" link opens that job page, and its "TorchX" tab lists the job
   and no error of another source;
3. a viewer sees the Cancel button disabled and the plugin's API answers its cancel (sent as
   the page sends it) with 403, and the failed job's "Start over" disabled;
4. an admin's Cancel stops the job: the page shows CANCELLED.
5. with the system in dark mode the pages are dark (the jobs page on its own, the task's tab
   inside Airflow's UI), and light once light is chosen in Airflow's UI.
Screenshots of the pages go to ``screenshots`` when given.

Scenario ``csrf`` (``tests/e2e/test_ui_security.py``): log in as Airflow's login page does (the
``_token`` cookie set from JavaScript), then open each page of ``attackers`` (another site,
another port of the same site), which posts a cancel through a form and through a no-cors
fetch; report each answer's status and detail. Then open the jobs page with api/jobs
answering 6 s late, filter twice meanwhile, and report how many calls were ever in flight at
once.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from playwright.sync_api import Browser, BrowserContext, Locator, Page, sync_playwright

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
TIMEOUT_MS = 60_000
#: Makes every answer of api/jobs arrive 6 s late (longer than the page's poll interval) and
#: counts the calls and the most in flight at once.
SLOW_JOBS_API = """
window.__calls = 0; window.__inflight = 0; window.__max = 0;
const realFetch = window.fetch;
window.fetch = async (...args) => {
  if (!String(args[0]).includes("api/jobs")) return realFetch(...args);
  window.__calls++; window.__inflight++; window.__max = Math.max(window.__max, window.__inflight);
  try { const resp = await realFetch(...args); await new Promise((r) => setTimeout(r, 6000)); return resp; }
  finally { window.__inflight--; }
};
"""
#: The cancel the job page sends (same origin, JSON), sent from a viewer's page.
VIEWER_CANCEL = """async (handle) => {
  const resp = await fetch("api/cancel", {method: "POST", headers: {"Content-Type": "application/json"},
                                          body: JSON.stringify({handle})});
  return [resp.status, (await resp.json()).detail];
}"""


def context_for(browser: Browser, base_url: str, token: str) -> BrowserContext:
    """A browser context logged in as the token's user (Airflow's UI login cookie)."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    ctx.add_cookies([{"name": "_token", "value": token, "url": base_url}])
    ctx.set_default_timeout(TIMEOUT_MS)
    return ctx


def log_lines(page: Page) -> list[str]:
    return [line for line in page.locator("#log").inner_text().splitlines() if line]


def advanced(locator: Locator, timeout: float = 10) -> tuple[str, str]:
    """The text of ``locator`` now and once it changed (within ``timeout`` seconds; the same
    text twice when it never did)."""
    first = locator.inner_text()
    deadline = time.monotonic() + timeout
    later = first
    while later == first and time.monotonic() < deadline:
        time.sleep(0.25)
        later = locator.inner_text()
    return first, later


def described(page: Page, dl: str) -> dict[str, str]:
    """The name/value pairs of a ``<dl>`` of the job page."""
    return {dd.get_attribute("data-name") or "": dd.inner_text() for dd in page.locator(f"{dl} dd").all()}


def is_dark(color: str) -> bool:
    """Whether a CSS ``rgb(...)``/``rgba(...)`` color is dark (relative luminance under 0.3)."""
    r, g, b = (int(v) for v in re.findall(r"\d+", color)[:3])
    return (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255 < 0.3


BODY_BACKGROUND = "b => getComputedStyle(b).backgroundColor"
#: Whether a framed page is in dark mode: its root says so, its background lets Airflow's
#: panel show through, and its text is light (Airflow's own text color).
FRAMED_DARK = """b => {
  const cs = getComputedStyle(b), rgb = cs.color.match(/\\d+/g).map(Number);
  const light = (0.2126 * rgb[0] + 0.7152 * rgb[1] + 0.0722 * rgb[2]) / 255 > 0.6;
  return document.documentElement.classList.contains("dark") && cs.backgroundColor === "rgba(0, 0, 0, 0)" && light;
}"""


def source_errors(page: Page) -> dict[str, Any]:
    """How the jobs page shows the sources that could not be listed."""
    box, table = page.locator("#list-errors"), page.locator("#jobs-table")
    box.wait_for()
    box_y, table_box = box.bounding_box(), table.bounding_box()
    assert box_y is not None and table_box is not None
    return {
        "shown": box.is_visible(),
        "open": box.evaluate("e => e.open"),
        "below_jobs": box_y["y"] >= table_box["y"] + table_box["height"],
        "summary": page.locator("#list-errors-summary").inner_text(),
        "count": page.locator("#list-errors-body pre").count(),
        "detail": page.locator("#list-errors-body").text_content(),
    }


def run(spec: dict[str, Any], seen: dict[str, Any]) -> None:
    base, handle, dag_id = spec["base_url"], spec["handle"], spec["dag_id"]
    shots = Path(spec["screenshots"]) if spec.get("screenshots") else None
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            admin = context_for(browser, base, spec["admin_token"]).new_page()
            admin.on("dialog", lambda dialog: dialog.accept())

            # 1. the jobs page lists the job; its page shows the replicas and a live log
            admin.goto(f"{base}/torchx/?dag_id={dag_id}")
            row = admin.locator(f'#jobs tr[data-handle="{handle}"]')
            row.wait_for()
            seen["list_row"] = row.inner_text()
            failed_row = admin.locator(f'#jobs tr[data-handle="{spec["failed_handle"]}"]')
            failed_row.wait_for()
            # the cost column: the priced failed job's cost, blank for the running job without rates
            seen["list_costs"] = {
                "failed": failed_row.locator("td.cost").inner_text(),
                "running": row.locator("td.cost").inner_text(),
            }
            first, later = advanced(row.locator(".duration"))
            seen["list_times"] = {
                "submitted": row.locator("td.submitted").inner_text(),
                "started": row.locator("td.started").inner_text(),
                "duration_first": first,
                "duration_later": later,
            }
            seen["source_errors"] = source_errors(admin)
            if shots:
                admin.screenshot(path=str(shots / "jobs.png"))
                admin.locator("#list-errors summary").click()
                admin.screenshot(path=str(shots / "jobs-source-error-open.png"), full_page=True)
                admin.locator("#list-errors summary").click()
            row.locator("a").click()
            admin.wait_for_url(re.compile(r"/torchx/job\?handle="))
            admin.locator("#replicas tr").nth(1).wait_for()
            seen["replicas"] = [tr.inner_text().split("\t")[:3] for tr in admin.locator("#replicas tr").all()]
            admin.wait_for_function("() => document.querySelector('#log').innerText.includes('line')")
            first = log_lines(admin)
            started = time.monotonic()
            admin.wait_for_function(
                "n => document.querySelector('#log').innerText.split('\\n').filter(l => l).length > n", arg=len(first)
            )
            seen["log_first"], seen["log_later"] = first, log_lines(admin)
            seen["log_new_line_after_s"] = round(time.monotonic() - started, 1)
            seen["job_state_shown"] = admin.locator("#job-title .state").inner_text()
            first, later = advanced(admin.locator('#job-summary dd[data-name="duration"]'))
            times = described(admin, "#job-summary")
            seen["job_times"] = {
                "submitted": times.get("submitted"),
                "started": times.get("started"),
                "ended": times.get("ended"),
                "duration_first": first,
                "duration_later": later,
            }
            if shots:
                admin.screenshot(path=str(shots / "job.png"), full_page=True)
            job_url = admin.url

            # the failed job's page: root cause, times, usage
            admin.goto(f"{base}/torchx/job?handle={quote(spec['failed_handle'], safe='')}")
            admin.locator("#root-cause-text").wait_for()
            admin.locator("#job-usage dd").first.wait_for()
            failed = described(admin, "#job-summary")
            seen["failed_job"] = {
                "state": admin.locator("#job-title .state").inner_text(),
                "root_cause": admin.locator("#root-cause-text").inner_text(),
                "usage": described(admin, "#job-usage"),
                "ended": failed.get("ended"),
                "duration": failed.get("duration"),
                "failure_kind": failed.get("failure kind"),
                # the story first: the root cause above the job's summary
                "cause_on_top": admin.locator("#root-cause").bounding_box()["y"]  # type: ignore[index]
                < admin.locator("#job-summary").bounding_box()["y"],  # type: ignore[index]
            }
            if shots:
                admin.screenshot(path=str(shots / "job-failed.png"), full_page=True)
            # its task instance starts over: its checkpoints set aside (the dialog accepted)
            seen["start_over_enabled"] = admin.locator("#start-over").is_enabled()
            admin.locator("#start-over").click()
            admin.wait_for_function("() => document.querySelector('#start-over-msg').innerText.length > 0")
            seen["start_over_msg"] = admin.locator("#start-over-msg").inner_text()
            admin.goto(job_url)
            admin.locator("#replicas tr").nth(1).wait_for()

            # 2. the task page's extra link opens the job page
            task = context_for(browser, base, spec["admin_token"]).new_page()
            task.goto(f"{base}/dags/{dag_id}/runs/{spec['run_id']}/tasks/{spec['task_id']}/details")
            link = task.get_by_role("link", name="TorchX Job")
            link.wait_for()
            seen["task_link_href"] = link.get_attribute("href")
            if link.get_attribute("target") == "_blank":  # Airflow 3.1 opens every extra link in a new tab
                with task.context.expect_page() as opened:
                    link.click()
                job_tab = opened.value
            else:  # later lines open a same-origin link in place
                link.click()
                job_tab = task
            job_tab.wait_for_url(re.compile(r"/torchx/job\?handle="))
            job_tab.locator("#job-summary").get_by_text(handle).wait_for()
            seen["task_link_opened"] = job_tab.url

            # the task instance's TorchX tab lists its job (the plugin's page in Airflow's frame)
            task.goto(f"{base}/dags/{dag_id}/runs/{spec['run_id']}/tasks/{spec['task_id']}")
            task.get_by_role("tab", name="TorchX").or_(task.get_by_role("link", name="TorchX", exact=True)).click()
            frame = task.frame_locator("iframe")
            frame.locator(f'#jobs tr[data-handle="{handle}"]').wait_for()
            seen["task_tab_lists_job"] = True
            seen["task_tab_source_errors_shown"] = frame.locator("#list-errors").is_visible()
            if shots:
                task.screenshot(path=str(shots / "task-tab.png"))

            # 3. a viewer may look but not cancel
            viewer = context_for(browser, base, spec["viewer_token"]).new_page()
            viewer.goto(admin.url)
            viewer.locator("#replicas tr").first.wait_for()
            seen["viewer_cancel_disabled"] = viewer.locator("#cancel").is_disabled()
            seen["viewer_cancel_status"], seen["viewer_cancel_detail"] = viewer.evaluate(VIEWER_CANCEL, handle)
            viewer.goto(f"{base}/torchx/job?handle={quote(spec['failed_handle'], safe='')}")
            viewer.locator("#job-usage dd").first.wait_for()
            seen["viewer_start_over_disabled"] = viewer.locator("#start-over").is_disabled()

            # 5. Airflow's color mode: the system's, then the one chosen in Airflow's UI
            dark_ctx = browser.new_context(viewport={"width": 1280, "height": 800}, color_scheme="dark")
            dark_ctx.add_cookies([{"name": "_token", "value": spec["admin_token"], "url": base}])
            dark_ctx.set_default_timeout(TIMEOUT_MS)
            dark = dark_ctx.new_page()
            dark.goto(f"{base}/torchx/?dag_id={dag_id}")
            dark.locator(f'#jobs tr[data-handle="{handle}"]').wait_for()
            seen["dark_by_system"] = is_dark(dark.locator("body").evaluate(BODY_BACKGROUND))
            if shots:
                dark.screenshot(path=str(shots / "jobs-dark.png"))
            # the tab's own address (clicking it is step 2's; a task page streaming its log
            # re-renders its tabs, which a click may wait on)
            dark.goto(f"{base}/dags/{dag_id}/runs/{spec['run_id']}/tasks/{spec['task_id']}/plugin/torchx_task")
            dark_frame = dark.frame_locator("iframe")
            dark_frame.locator(f'#jobs tr[data-handle="{handle}"]').wait_for()
            seen["task_tab_dark"] = dark_frame.locator("body").evaluate(FRAMED_DARK)
            if shots:
                dark.screenshot(path=str(shots / "task-tab-dark.png"))
            dark.goto(f"{base}/torchx/job?handle={quote(spec['failed_handle'], safe='')}")
            dark.locator("#root-cause-text").wait_for()
            if shots:
                dark.screenshot(path=str(shots / "job-failed-dark.png"), full_page=True)
            dark.evaluate("() => localStorage.setItem('theme', 'light')")  # as Airflow's theme switch stores it
            dark.reload()
            dark.locator("#root-cause-text").wait_for()
            seen["light_by_airflow_choice"] = not is_dark(dark.locator("body").evaluate(BODY_BACKGROUND))

            # 4. the admin cancels from the page
            admin.locator("#cancel").click()
            admin.locator("#job-title .state", has_text="CANCELLED").wait_for()
            seen["cancelled_shown"] = True
        except Exception:
            if shots:
                for n, ctx in enumerate(browser.contexts):
                    for k, page in enumerate(ctx.pages):
                        page.screenshot(path=str(shots / f"failed-{n}-{k}.png"))
            raise
        finally:
            browser.close()


def csrf(spec: dict[str, Any], seen: dict[str, Any]) -> None:
    base = spec["base_url"]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            ctx = browser.new_context()
            ctx.set_default_timeout(TIMEOUT_MS)
            page = ctx.new_page()
            page.goto(f"{base}/torchx/api/jobs")
            page.evaluate("token => { document.cookie = '_token=' + token + '; path=/'; }", spec["token"])
            for name, url in spec["attackers"].items():
                attempts: dict[str, Any] = {}
                for how, action in (("form", "document.getElementById('f').submit()"), ("fetch", "attack()")):
                    page.goto(url)
                    with page.expect_response(lambda r: "/torchx/api/cancel" in r.url) as answer:
                        page.evaluate(action)
                    resp = answer.value
                    try:
                        detail = resp.json().get("detail")
                    except Exception:  # an opaque answer has no body to read
                        detail = None
                    attempts[how] = {"status": resp.status, "detail": detail}
                seen[name] = attempts

            # the jobs page keeps one call in flight, however slow the answers
            slow = ctx.new_page()
            slow.add_init_script(SLOW_JOBS_API)
            slow.goto(f"{base}/torchx/")
            slow.wait_for_function("() => window.__calls >= 1")  # functions: the page's CSP forbids eval
            for _ in range(2):  # filter twice while the first call is out
                slow.locator("#filters button[type=submit]").click()
            slow.wait_for_function("() => window.__calls >= 3", timeout=90_000)
            seen["jobs_calls"], seen["jobs_max_in_flight"] = slow.evaluate("[window.__calls, window.__max]")
        finally:
            browser.close()


def main() -> None:
    spec = json.load(sys.stdin)
    seen: dict[str, Any] = {}
    try:
        (csrf if spec.get("scenario") == "csrf" else run)(spec, seen)
    except Exception as err:
        seen["error"] = f"{type(err).__name__}: {err}"
    json.dump(seen, sys.stdout)


if __name__ == "__main__":
    main()
