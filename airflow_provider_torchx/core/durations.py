"""Durations as people write them: ``30d``, ``12h``, ``90m``, ``45s``, ``2w`` (one number, one
unit), used by ``airflow-torchx prune --older-than`` and the ``[torchx] retain_finished``
setting."""

from __future__ import annotations

import re

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")


def parse_duration(text: str, name: str) -> float:
    """Seconds in ``text``; ``ValueError`` naming ``name`` (the option) and the value otherwise."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"{name}: {text!r} is not a duration: a number and a unit of s, m, h, d or w (e.g. 30d, 12h)")
    return float(match.group(1)) * _UNITS[match.group(2)]
