"""Fixtures of the Airflow-layer tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from airflow_provider_torchx.core.runner import Runner, get_runner


@pytest.fixture
def local_jobs() -> Iterator[tuple[Runner, list[str]]]:
    """A runner and a list for the handles a test submits; each is deleted (cancelled first)
    at the end."""
    runner = get_runner()
    handles: list[str] = []
    yield runner, handles
    for handle in handles:
        runner.delete(handle)
