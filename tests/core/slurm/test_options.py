"""Slurm's ``--time`` formats, as the ``time`` run option takes them."""

from __future__ import annotations

import pytest

from airflow_provider_torchx.core.schedulers.slurm.options import time_minutes


@pytest.mark.parametrize(
    ("text", "minutes"),
    [
        ("30", 30),
        ("30:30", 30.5),
        ("1:00:00", 60),
        ("2-0", 2880),
        ("1-01:30", 1530),
        ("1-00:00:30", 1440.5),
        ("UNLIMITED", float("inf")),
    ],
)
def test_slurm_time_formats(text: str, minutes: float) -> None:
    assert time_minutes(text) == minutes


@pytest.mark.parametrize("text", ["", "1h", "1:2:3:4", "-5", "1-", "a-1"])
def test_what_slurm_would_refuse(text: str) -> None:
    with pytest.raises(ValueError):
        time_minutes(text)
