"""Fixtures of the local scheduler tests: a private job store per test, a marker env var on
every job a test starts, and a sweep that fails the test if any of its processes is left."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from airflow_provider_torchx.core.schedulers.local import LocalScheduler, create_cwd_scheduler, create_dir_scheduler
from tests.processes import processes_with_env

MARK = "LOCAL_TEST_MARK"


def marked_processes(mark: str, **env: str) -> list[psutil.Process]:
    """Every live process on the host whose environment carries ``MARK=mark`` (and ``env``)."""
    return processes_with_env(**{MARK: mark}, **env)


def wait_gone(mark: str, timeout: float) -> list[psutil.Process]:
    """Wait up to ``timeout`` for the marked processes to be gone; return those left."""
    deadline = time.monotonic() + timeout
    while True:
        left = marked_processes(mark)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point the job store at a fresh directory for each test."""
    path = tmp_path / "state"
    monkeypatch.setenv("AIRFLOW_TORCHX_STATE_DIR", str(path))
    return path


@pytest.fixture
def mark(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A marker set in this test's environment (so every job inherits it); after the test,
    any process still carrying it is killed and the test fails."""
    value = uuid.uuid4().hex
    monkeypatch.setenv(MARK, value)
    yield value
    survivors = []
    for p in wait_gone(value, 3.0):
        try:  # a process that ended meanwhile, a zombie awaiting its parent among them, survived nothing
            survivors.append(p.cmdline())
            p.kill()
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    assert not survivors, f"processes left behind: {survivors}"


@pytest.fixture
def sched(mark: str) -> Iterator[LocalScheduler]:
    """A ``local_cwd`` scheduler with a short cancel grace period."""
    with create_cwd_scheduler("test", cancel_grace_period=2.0) as s:
        yield s


@pytest.fixture
def dir_sched(mark: str) -> Iterator[LocalScheduler]:
    """A ``local_dir`` scheduler with a short cancel grace period."""
    with create_dir_scheduler("test", cancel_grace_period=2.0) as s:
        yield s


def no_jobs_on_disk(state: Path) -> bool:
    """Whether the store holds no job."""
    root = state / "local"
    return not root.exists() or not any(root.iterdir())
