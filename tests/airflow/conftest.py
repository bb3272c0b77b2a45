"""Fixtures of the Airflow-layer tests."""

from __future__ import annotations

import importlib.machinery
import sys
import types
from collections.abc import Callable, Iterator

import pytest

from airflow_provider_torchx.core.runner import Runner, get_runner
from airflow_provider_torchx.core.specs import AppState
from tests.airflow.helpers import CFG, Counter, gpu_app, wait_until


@pytest.fixture
def local_jobs() -> Iterator[tuple[Runner, list[str]]]:
    """A runner and a list for the handles a test submits; each is deleted (cancelled first)
    at the end."""
    runner = get_runner()
    handles: list[str] = []
    yield runner, handles
    for handle in handles:
        runner.delete(handle)


@pytest.fixture
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> Counter:
    """A 2-GPU host as far as the local GPU ledger knows; metrics counted."""
    monkeypatch.setenv("AIRFLOW_TORCHX_LOCAL_GPUS", "0,1")
    counter = Counter()
    monkeypatch.setattr("airflow_provider_torchx.metrics.stats", lambda: counter)
    return counter


@pytest.fixture
def holder(local_jobs: tuple[Runner, list[str]], two_gpus: Counter) -> Iterator[str]:
    """A local job holding both faked GPUs, running."""
    runner, handles = local_jobs
    handle = runner.run(gpu_app("holder", 2), "local_cwd", CFG)
    handles.append(handle)
    wait_until(lambda: (s := runner.status(handle)) and s.state == AppState.RUNNING, what="the holder to run")
    yield handle


@pytest.fixture(autouse=True)
def _reaper_done_after_each_test() -> Iterator[None]:
    """What the orphaned-jobs listeners handed the reaper's thread (``dag.test()`` announces its
    task instances' ends in this process) is finished within its test, never in the next one
    (whose stand-in channel or jobs it would otherwise meet)."""
    yield
    from airflow_provider_torchx.reaper import listeners as reaper

    if reaper._announced is not None:
        reaper._announced.shutdown(wait=True)
        reaper._announced = None


@pytest.fixture
def amazon_provider(monkeypatch: pytest.MonkeyPatch) -> Callable[[type], None]:
    """``install(AwsBaseHook)``: make ``airflow.providers.amazon.aws.hooks.base_aws`` importable
    with the given class standing in for the Amazon provider's hook (not installed here), which
    the hook uses as ``AwsBaseHook(aws_conn_id=, region_name=).get_session()``."""

    def install(hook_class: type) -> None:
        for name in ("airflow.providers.amazon", "airflow.providers.amazon.aws.hooks.base_aws"):
            module = types.ModuleType(name)
            module.__spec__ = importlib.machinery.ModuleSpec(name, None)
            module.AwsBaseHook = hook_class  # type: ignore[attr-defined]
            monkeypatch.setitem(sys.modules, name, module)

    return install
