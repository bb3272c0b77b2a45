"""A local job's usage summary from its job store records (see ``core/usage.py``).

The launcher records when the job was created (``request.json``); the supervisor records each
replica's runs, wall-clock start, end and exit code, in ``state.json``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow_provider_torchx.core.specs import Role
from airflow_provider_torchx.core.usage import Attempt, Usage, compute_usage


def local_usage(rec: Mapping[str, Any], st: Mapping[str, Any], roles: Sequence[Role]) -> Usage:
    """The usage of the job with request record ``rec`` and (terminal) state ``st``."""
    attempts = [
        Attempt(
            role=role,
            replica=k,
            number=n,
            started=run.get("started"),
            ended=run.get("ended"),
            exit_code=run.get("exit_code"),
        )
        for role, reps in (st.get("replicas") or {}).items()
        for k, rep in enumerate(reps)
        for n, run in enumerate(rep.get("attempts") or [], start=1)
    ]
    return compute_usage(rec.get("created"), st.get("ended"), roles, attempts)
