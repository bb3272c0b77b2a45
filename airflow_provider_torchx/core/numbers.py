"""The one rule for the positive numbers a user gives: every limit, interval and duration in
seconds (the guards' limits, the operator's ``poll_interval``, the CLI's flags) is read by
``positive_number``, so they accept and refuse the same values."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any


def positive_number(value: Any, *, seconds: bool = False) -> float | None:
    """``value`` (a number, a number's text or, where ``seconds``, a ``timedelta``) as a
    finite float > 0; None when it is none of those."""
    if seconds and isinstance(value, timedelta):
        number: Any = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return None
    else:
        return None
    return float(number) if math.isfinite(number) and number > 0 else None
