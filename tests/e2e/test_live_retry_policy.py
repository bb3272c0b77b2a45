"""``torchx_retry_policy`` on a live Airflow 3.3 deployment (deferred tasks, driven through the
REST API): an app error fails the task after one try and its log says why; a replica killed by
SIGKILL is retried, and the next try's job resumes from the task instance's checkpoint and
succeeds."""

from __future__ import annotations

import pytest

from tests.e2e.live import LiveAirflow

try:
    from airflow.sdk import RetryPolicy  # noqa: F401 - Airflow >= 3.3
except ImportError:
    POLICIES = False
else:
    POLICIES = True

pytestmark = [
    pytest.mark.airflow,
    pytest.mark.airflow_line,
    pytest.mark.skipif(not POLICIES, reason="retry policies arrived in Airflow 3.3"),
]


def test_an_app_error_fails_after_one_try_saying_why(live_airflow: LiveAirflow) -> None:
    live, api = live_airflow, live_airflow.deployment
    run_id = live.trigger("torchx_e2e_policy_app", {})
    ti = api.wait_for_state("torchx_e2e_policy_app", run_id, "job", {"failed"}, timeout=240)
    logs = ["\n".join(live.log("torchx_e2e_policy_app", run_id, n)) for n in range(1, ti["try_number"] + 1)]
    assert ti["try_number"] == 1, "\n\n".join(logs)[-6000:]
    log = logs[0]
    assert "Failure kind: app (exit code 1 on w/0)" in log, log[-3000:]
    assert "not retried: app failure — exit code 1 on w/0" in log, log[-3000:]


def test_a_killed_replica_is_retried_and_resumes_from_its_checkpoint(live_airflow: LiveAirflow) -> None:
    live, api = live_airflow, live_airflow.deployment
    run_id = live.trigger("torchx_e2e_policy_killed", {})
    ti = api.wait_for_state("torchx_e2e_policy_killed", run_id, "job", {"success"}, timeout=300)
    assert ti["try_number"] == 2, ti
    first = "\n".join(live.log("torchx_e2e_policy_killed", run_id, 1))
    assert "checkpoint at step 6 written" in first and "retried: infra failure — SIGKILL on w/0" in first, first[-3000:]
    second = "\n".join(live.log("torchx_e2e_policy_killed", run_id, 2))
    assert "resumed from step 6" in second, second[-3000:]
