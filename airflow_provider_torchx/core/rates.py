"""What hardware costs, in US dollars: the rates that turn a job's resource-hours into money.

A team prices the hardware it owns (a GPU box, a Slurm cluster) or overrides a cloud's prices
with one JSON object: ``{"gpu_hour": 2.5, "vcpu_hour": 0.04, "memory_gb_hour": 0.005}``. A key
left out costs nothing (a team that counts only its GPUs gives ``gpu_hour`` alone). Rates are
checked where they are read: a negative or non-numeric rate or an unknown key is an error that
names it, before anything is submitted.

A job carries the rates it was submitted at in its labels (``RATES_LABEL``), so whoever
describes it later (the task, the CLI, the UI) prices it the same way (``Runner`` does).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

#: The keys a rates object may hold: US dollars per GPU-hour, vCPU-hour and GiB-hour of memory.
RATE_KEYS = ("gpu_hour", "vcpu_hour", "memory_gb_hour")
#: The job label holding the rates a job was submitted at: ``gpu_hour=2.5 vcpu_hour=0.04 ...``
#: (the characters an AWS tag value allows).
RATES_LABEL = "torchx.rates"


@dataclass(frozen=True)
class Rates:
    """US dollars per hour of one GPU, one vCPU and one GiB of memory a job reserved."""

    gpu_hour: float = 0.0
    vcpu_hour: float = 0.0
    memory_gb_hour: float = 0.0

    def per_node_hour(self, gpus: float | None, vcpus: float | None, memory_gb: float | None) -> float:
        """What one replica reserving ``gpus``, ``vcpus`` and ``memory_gb`` (None: none
        asked) costs per hour."""
        return (
            (gpus or 0.0) * self.gpu_hour + (vcpus or 0.0) * self.vcpu_hour + (memory_gb or 0.0) * self.memory_gb_hour
        )

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    def labels(self) -> dict[str, str]:
        """The job label that carries these rates (``rates_of`` reads it back)."""
        return {RATES_LABEL: " ".join(f"{k}={v!r}" for k, v in self.to_dict().items())}


def rates_of(labels: Mapping[str, str]) -> Rates | None:
    """The rates a job's ``labels`` carry (``Rates.labels``); None when it carries none or
    they do not read as rates (a label set by hand: the job is then not priced)."""
    text = labels.get(RATES_LABEL)
    if not text:
        return None
    try:
        pairs = dict(part.split("=", 1) for part in text.split())
        return parse_rates({k: float(v) for k, v in pairs.items()}, RATES_LABEL)
    except ValueError:
        return None


def parse_rates(value: Any, source: str) -> Rates | None:
    """``value`` (a mapping, or its JSON text; None or empty: no rates) as ``Rates``.
    ``ValueError`` naming ``source``, the key and the bad value, and what is allowed, for text
    that is not a JSON object, an unknown key, or a rate that is not a finite number >= 0."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            value = None
    if not isinstance(value, Mapping):
        raise ValueError(
            f"{source}: rates must be a JSON object of US dollars per {', '.join(RATE_KEYS)} "
            '(e.g. {"gpu_hour": 2.5}); got ' + repr(value)
        )
    unknown = sorted(str(k) for k in value if k not in RATE_KEYS)
    if unknown:
        raise ValueError(f"{source}: unknown rate {unknown[0]!r}; allowed: {', '.join(RATE_KEYS)}")
    rates: dict[str, float] = {}
    for key, rate in value.items():
        number = rate if isinstance(rate, int | float) and not isinstance(rate, bool) else None
        if number is None or not math.isfinite(number) or number < 0:
            raise ValueError(f"{source}: rate {key}={rate!r} is not allowed; expected a number of US dollars >= 0")
        rates[key] = float(number)
    return Rates(**rates)
