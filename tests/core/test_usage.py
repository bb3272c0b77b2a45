"""``core/usage.py``: the summary's figures from attempts and requested resources."""

from __future__ import annotations

import dataclasses
import re

import pytest

from airflow_provider_torchx.core.rates import RATES_LABEL, Rates, parse_rates, rates_of
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


def test_a_priced_job_costs_its_reserved_resources_times_seconds_times_rates() -> None:
    """Each attempt costs (GPUs x gpu_hour + vCPUs x vcpu_hour + GiB x memory_gb_hour) x its
    hours; a role and the job sum their attempts; the summary carries the dollars."""
    roles = [Role("trainer", num_replicas=2, resource=Resource(cpu=8, gpu=4, memMB=64 * 1024))]
    attempts = [
        Attempt("trainer", 0, 1, started=100.0, ended=1900.0, exit_code=0),  # 0.5 h
        Attempt("trainer", 1, 1, started=100.0, ended=3700.0, exit_code=0),  # 1 h
    ]
    rates = Rates(gpu_hour=2.0, vcpu_hour=0.05, memory_gb_hour=0.01)
    usage = dataclasses.replace(compute_usage(90.0, 3700.0, roles, attempts), rates=rates)
    per_hour = 4 * 2.0 + 8 * 0.05 + 64 * 0.01  # 9.04
    assert [usage.attempt_cost_usd(a) for a in usage.attempts] == [pytest.approx(per_hour / 2), pytest.approx(per_hour)]
    assert usage.role_cost_usd("trainer") == pytest.approx(1.5 * per_hour)
    assert usage.cost_usd == pytest.approx(1.5 * per_hour)
    d = usage.to_dict()
    assert d["cost_usd"] == pytest.approx(13.56) and d["rates"] == {
        "gpu_hour": 2.0,
        "vcpu_hour": 0.05,
        "memory_gb_hour": 0.01,
    }
    assert d["roles"][0]["cost_usd"] == pytest.approx(13.56) and d["attempts"][1]["cost_usd"] == pytest.approx(9.04)
    text = usage.format()
    assert "GB-h memory, $13.56\n" in text and "trainer[1] #1: 3600.00 s, $9.04, exit 0" in text


def test_an_unpriced_job_has_no_cost_and_says_no_dollars() -> None:
    usage = compute_usage(
        0.0, 10.0, [Role("r", resource=Resource(cpu=1, gpu=1, memMB=1024))], [Attempt("r", 0, 1, 0.0, 10.0)]
    )
    assert usage.cost_usd is None and usage.to_dict()["cost_usd"] is None and "$" not in usage.format()


def test_the_cost_so_far_counts_open_attempts_until_now() -> None:
    roles = [Role("r", resource=Resource(cpu=-1, gpu=2, memMB=-1))]
    live = dataclasses.replace(
        compute_usage(0.0, None, roles, [Attempt("r", 0, 1, started=0.0, ended=None)]), rates=Rates(gpu_hour=3.0)
    )
    assert live.cost_so_far(1800.0) == pytest.approx(3.0)  # 2 GPUs x 0.5 h x $3
    assert live.cost_so_far(3600.0) == pytest.approx(6.0)


ONE_GPU = [Role("r", resource=Resource(cpu=4, gpu=1, memMB=1024))]


def test_an_attempt_priced_by_its_scheduler_costs_its_price_times_hours() -> None:
    """No rates: each attempt at its own ``price_per_hour`` (a Spot one, then an on-demand one)."""
    attempts = [
        Attempt("r", 0, 1, 0.0, 1800.0, price_per_hour=1.0),
        Attempt("r", 0, 2, 1800.0, 9000.0, price_per_hour=3.0),
    ]
    usage = compute_usage(0.0, 9000.0, ONE_GPU, attempts)
    assert [usage.attempt_cost_usd(a) for a in usage.attempts] == [pytest.approx(0.5), pytest.approx(6.0)]
    assert usage.cost_usd == pytest.approx(6.5) and usage.role_cost_usd("r") == pytest.approx(6.5)
    assert "Total:" in usage.format() and "$6.50" in usage.format()


def test_rates_given_win_over_the_schedulers_price() -> None:
    attempt = Attempt("r", 0, 1, 0.0, 3600.0, price_per_hour=100.0)
    usage = dataclasses.replace(compute_usage(0.0, 3600.0, ONE_GPU, [attempt]), rates=Rates(gpu_hour=2.0))
    assert usage.cost_usd == pytest.approx(2.0)


def test_an_attempt_its_scheduler_could_not_price_is_na_and_leaves_no_total() -> None:
    attempts = [Attempt("r", 0, 1, 0.0, 3600.0, price_per_hour=1.0), Attempt("r", 0, 2, 3600.0, 7200.0)]
    usage = compute_usage(0.0, 7200.0, ONE_GPU, attempts)
    assert usage.attempt_cost_usd(usage.attempts[0]) == pytest.approx(1.0)
    assert usage.attempt_cost_usd(usage.attempts[1]) is None
    assert usage.cost_usd is None and usage.role_cost_usd("r") is None
    assert usage.to_dict()["attempts"][1]["cost_usd"] is None


def test_an_attempt_that_never_started_costs_nothing_in_a_priced_job() -> None:
    attempts = [Attempt("r", 0, 1, None, None), Attempt("r", 0, 2, 0.0, 3600.0, price_per_hour=2.0)]
    assert compute_usage(0.0, 3600.0, ONE_GPU, attempts).cost_usd == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ({"gpu_hour": -1}, r"conn: rate gpu_hour=-1 is not allowed; expected a number of US dollars >= 0"),
        ({"gpu_hour": "high"}, r"conn: rate gpu_hour='high' is not allowed"),
        ({"gpu_hour": float("nan")}, r"rate gpu_hour=nan is not allowed"),
        ({"gpu_hour": True}, r"rate gpu_hour=True is not allowed"),
        ({"gpu_hours": 1}, r"conn: unknown rate 'gpu_hours'; allowed: gpu_hour, vcpu_hour, memory_gb_hour"),
        ("[1, 2]", r"conn: rates must be a JSON object of US dollars per gpu_hour, vcpu_hour, memory_gb_hour"),
        ("gpu_hour=2", r"conn: rates must be a JSON object"),
    ],
)
def test_bad_rates_are_refused_naming_the_key_and_value(value: object, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_rates(value, "conn")


def test_rates_from_json_text_or_a_mapping_and_none_for_nothing() -> None:
    assert parse_rates('{"gpu_hour": 2.5}', "x") == Rates(gpu_hour=2.5)
    assert parse_rates({"vcpu_hour": 0, "memory_gb_hour": 0.01}, "x") == Rates(memory_gb_hour=0.01)
    assert parse_rates(None, "x") is None and parse_rates("  ", "x") is None


def test_rates_travel_as_a_job_label_and_read_back_the_same() -> None:
    rates = Rates(gpu_hour=2.5, vcpu_hour=0.04, memory_gb_hour=0.005)
    labels = rates.labels()
    assert labels == {RATES_LABEL: "gpu_hour=2.5 vcpu_hour=0.04 memory_gb_hour=0.005"}
    assert re.fullmatch(r"[\w .:/=+\-@]*", labels[RATES_LABEL])  # what an AWS tag value may hold
    assert rates_of(labels) == rates
    assert rates_of({}) is None
    assert rates_of({RATES_LABEL: "gpu_hour=cheap"}) is None and rates_of({RATES_LABEL: "gpu=1"}) is None


def test_a_live_jobs_status_says_what_it_used_so_far_and_an_ended_ones_does_not() -> None:
    """``status`` (plain: ``Used so far``; ``--json``: ``usage_so_far``) of a job whose two
    GPUs have run for half an hour at $3 a GPU-hour; nothing once it ended."""
    from airflow_provider_torchx.core.jobviews import so_far_line, usage_so_far
    from airflow_provider_torchx.core.schedulers.api import DescribeAppResponse
    from airflow_provider_torchx.core.specs import AppState

    so_far = compute_usage(0.0, None, [Role("w", resource=Resource(1, 2, 64))], [Attempt("w", 0, 1, 0.0, None)])
    live = DescribeAppResponse(
        app_id="a", state=AppState.RUNNING, usage_so_far=dataclasses.replace(so_far, rates=Rates(gpu_hour=3.0))
    )
    assert usage_so_far(live, 1800.0) == {"gpu_hours": pytest.approx(1.0), "cost_usd": pytest.approx(3.0)}
    assert so_far_line(live, 1800.0) == "  Used so far: 1.0000 GPU-h, $3.00"
    unpriced = dataclasses.replace(live, usage_so_far=so_far)
    assert so_far_line(unpriced, 1800.0) == "  Used so far: 1.0000 GPU-h"
    ended = dataclasses.replace(live, state=AppState.SUCCEEDED)
    assert usage_so_far(ended, 1800.0) is None and so_far_line(ended, 1800.0) == ""
