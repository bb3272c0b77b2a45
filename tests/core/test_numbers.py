"""The one rule for the positive numbers a user gives (``core/numbers.py``), row by row."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from airflow_provider_torchx.core.numbers import positive_number


@pytest.mark.parametrize(
    ("value", "seconds", "expected"),
    [
        (2, False, 2.0),
        (0.5, False, 0.5),
        ("1.5", False, 1.5),
        (timedelta(seconds=3), True, 3.0),
        (timedelta(seconds=3), False, None),
        (0, False, None),
        (-2, False, None),
        (float("nan"), False, None),
        (float("inf"), False, None),
        ("soon", False, None),
        (True, False, None),
        (None, False, None),
    ],
)
def test_a_positive_number_is_finite_above_zero_and_nothing_else(
    value: Any, seconds: bool, expected: float | None
) -> None:
    assert positive_number(value, seconds=seconds) == expected
