"""``[torchx] cancel_orphaned_jobs`` and ``[torchx] orphan_grace``, read and checked."""

from __future__ import annotations

from dataclasses import dataclass

from airflow_provider_torchx._compat import conf

#: ``[torchx] orphan_grace``'s and ``cancel_orphaned_jobs``'s defaults (provider_info declares them).
DEFAULT_GRACE = 30.0
DEFAULT_ENABLED = True


@dataclass(frozen=True)
class ReaperSettings:
    """``[torchx] cancel_orphaned_jobs`` and ``[torchx] orphan_grace`` (seconds)."""

    enabled: bool
    grace: float


def reaper_settings() -> ReaperSettings:
    """The two settings, checked: a bad value raises ``ValueError`` naming the option."""
    enabled = conf.getboolean("torchx", "cancel_orphaned_jobs", fallback=DEFAULT_ENABLED)
    raw = conf.get("torchx", "orphan_grace", fallback=str(DEFAULT_GRACE))
    try:
        grace = float(raw)
    except ValueError:
        raise ValueError(f"[torchx] orphan_grace: {raw!r} is not a number of seconds (>= 0)") from None
    if grace < 0 or grace != grace:
        raise ValueError(f"[torchx] orphan_grace: {raw!r} must be a number of seconds >= 0")
    return ReaperSettings(bool(enabled), grace)
