"""``core/usage.py``: the summary's figures from attempts and requested resources."""

from __future__ import annotations

import pytest

from airflow_provider_torchx.core.specs import NULL_RESOURCE, Resource, Role
from airflow_provider_torchx.core.usage import Attempt, compute_usage


def test_figures_from_known_attempts() -> None:
    roles = [
        Role("trainer", num_replicas=2, resource=Resource(cpu=8, gpu=4, memMB=64 * 1024)),
        Role("ps", resource=Resource(cpu=2, gpu=0, memMB=2048)),
    ]
    attempts = [
        Attempt("trainer", 0, 1, started=110.0, ended=1910.0, exit_code=0),  # 1800 s
        Attempt("trainer", 1, 1, started=112.0, ended=1912.0, exit_code=0),  # 1800 s
        Attempt("ps", 0, 1, started=105.0, ended=165.0, exit_code=1, reason="OOM"),  # 60 s
        Attempt("ps", 0, 2, started=170.0, ended=None, exit_code=None),  # cut short: ends with the job
    ]
    usage = compute_usage(100.0, 2000.0, roles, attempts)
    assert usage.queue_wait_s == 5.0
    assert usage.run_time_s == 1895.0
    trainer, ps = usage.roles
    assert trainer.node_seconds == 3600.0
    assert (trainer.vcpu_hours, trainer.gpu_hours, trainer.memory_gb_hours) == (8.0, 4.0, 64.0)
    assert ps.node_seconds == 60.0 + 1830.0
    assert ps.gpu_hours == 0.0
    assert ps.memory_gb_hours == pytest.approx(2 * 1890 / 3600)
    assert usage.gpu_hours == 4.0
    assert usage.vcpu_hours == pytest.approx(8.0 + 2 * 1890 / 3600)
    assert [(a.role, a.number) for a in usage.attempts] == [("ps", 1), ("trainer", 1), ("trainer", 1), ("ps", 2)]
    d = usage.to_dict()
    assert d["attempts_count"] == 4 and d["gpu_hours"] == 4.0 and d["attempts"][0]["reason"] == "OOM"
    text = usage.format()
    assert "Queue wait:  5.00 s" in text and "ps[0] #1: 60.00 s, exit 1 (OOM)" in text


def test_unknown_amounts_and_a_job_that_never_ran() -> None:
    usage = compute_usage(100.0, 130.0, [Role("r", resource=NULL_RESOURCE)], [Attempt("r", 0, 1, None, None)])
    assert usage.queue_wait_s is None and usage.run_time_s is None
    assert usage.node_seconds == 0.0
    assert usage.vcpu_hours is None and usage.gpu_hours is None and usage.memory_gb_hours is None
    text = usage.format()
    assert "n/a vCPU-h" in text
    assert "Queue wait:  n/a (no replica ran) (submitted" in text and "Run time:    n/a (no replica ran) (" in text
    assert " s (" not in text.split("Total:")[0]  # no unit after n/a
    assert "Replica runs: 1 (role[replica] #attempt: one line per run)" in text
