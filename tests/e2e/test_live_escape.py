"""A job whose record is refused is still a job, on a live deployment (REST API only, real
processes): two deferred tasks with ``max_gpu_hours`` and retries left, whose jobs' ``state.json``
and job directory are swapped, each in one step (a writer never sees the path missing), for
symbolic links while the jobs run on 2 GPUs each. The triggerer cannot describe them, yet
stops them (found by their supervisors' identity), and only then fails each task without
retry; a retry, had the try failed otherwise, finds the refused job, stops it and fails the
same way. No process of either job is left, each task ends ``failed`` saying why, and no second
job is ever submitted.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator

import pytest

from airflow_provider_torchx.core.schedulers.local import store
from tests.e2e.conftest import _deployment
from tests.e2e.deployment import wait_until
from tests.e2e.live import LiveAirflow, still_running, task_labels
from tests.fixtures.files import swap_dir_for_symlink, swap_file_for_symlink

# airflow_line: the live stack: the trigger's stop, the resumed task's failure without retry.
pytestmark = [pytest.mark.airflow, pytest.mark.airflow_line]

ESCAPE = "torchx_e2e_escape"
#: How soon after the swap the job must be gone: the trigger's next look (1 s), its supervisor's
#: grace period (10 s), and time for a loaded host.
STOPPED_WITHIN = 90.0


@pytest.fixture(scope="module")
def live_airflow_gpus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveAirflow]:
    """A live deployment for local jobs on a fake 4-GPU host."""
    env = {"AIRFLOW_TORCHX_LOCAL_GPUS": "0,1,2,3"}
    with _deployment(tmp_path_factory.mktemp("live-airflow-escape"), env) as live:
        yield live


def test_deferred_jobs_whose_record_is_refused_are_stopped_and_their_tasks_fail_without_a_second_job(
    live_airflow_gpus: LiveAirflow, tmp_path_factory: pytest.TempPathFactory
) -> None:
    live, api = live_airflow_gpus, live_airflow_gpus.deployment
    runs = {how: live.start_watched(ESCAPE, {}) for how in ("state", "dir")}
    procs = {how: live.job_processes(handle) for how, (_, handle) in runs.items()}
    assert all(len(p) >= 2 for p in procs.values()), procs  # a supervisor and its replica each
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    state_file = live.job_dir(runs["state"][1]) / store.STATE
    (elsewhere / "state.json").write_bytes(state_file.read_bytes())
    swap_file_for_symlink(state_file, elsewhere / "state.json")
    swap_dir_for_symlink(live.job_dir(runs["dir"][1]), elsewhere / "moved")

    for how, (run_id, handle) in runs.items():
        with contextlib.suppress(TimeoutError):
            wait_until(lambda p=procs[how]: not still_running(p), STOPPED_WITHIN, f"the {how}-swapped job to stop")
        assert not still_running(procs[how]), f"{how}: the job escaped its task: {still_running(procs[how])}"
        ti = api.wait_for_state(ESCAPE, run_id, "job", {"failed"}, timeout=STOPPED_WITHIN)
        last = ti["try_number"]
        path = f"/dags/{ESCAPE}/dagRuns/{run_id}/taskInstances/job/logs/{last}?full_content=true"
        end = json.dumps(api.api("GET", path)["content"][-10:])  # the exception is in its event's error_detail
        said = re.search(rf"TorchX job {re.escape(handle)} cannot be (watched|adopted): job ", end)
        assert said and "cancelled it. Not retried" in end and "AirflowFailException" in end, f"try {last}: {end}"
    state_jobs = [a.app_id for a in live.scheduler.list(labels=task_labels(ESCAPE, runs["state"][0]))]
    assert state_jobs == [live.job_dir(runs["state"][1]).name], f"a second job of the state-swapped task: {state_jobs}"
    assert len(live.scheduler.store.app_ids()) == 2, f"a second job was submitted: {live.scheduler.store.app_ids()}"
    assert live.scheduler.list_live() == [], "a job of the store still runs"
