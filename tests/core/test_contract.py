"""The scheduler contract's checks when a backend class is made (``core/schedulers/api.py``:
``check_contract``), one test per rule: a capability without the methods it needs, a ``list``
without ``limit``, and the backends that meet it."""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Mapping
from typing import Any

import pytest

from airflow_provider_torchx.core.runopts import Cfg, CfgVal, runopts
from airflow_provider_torchx.core.schedulers.api import (
    CAPABILITY_METHODS,
    CancelledBy,
    DescribeAppResponse,
    ListAppResponse,
    Scheduler,
    SchedulerCapabilities,
    check_contract,
)
from airflow_provider_torchx.core.schedulers.aws_batch.scheduler import AWSBatchScheduler
from airflow_provider_torchx.core.schedulers.local.scheduler import LocalScheduler
from airflow_provider_torchx.core.specs import AppDef, AppDryRunInfo
from tests.plugin.acme_scheduler import AcmeScheduler


class Core(Scheduler[str]):
    """The required core and nothing else (no capability)."""

    def _run_opts(self) -> runopts:
        return runopts()

    def _submit_dryrun(self, app: AppDef, cfg: dict[str, CfgVal], labels: dict[str, str]) -> AppDryRunInfo[str]:
        return AppDryRunInfo(app.name, str)

    def schedule(self, dryrun_info: AppDryRunInfo[str]) -> str:
        return dryrun_info.request

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        return None

    def list(
        self, cfg: Cfg | None = None, labels: Mapping[str, str] | None = None, *, limit: int | None = None
    ) -> builtins.list[ListAppResponse]:
        return []

    def _cancel_existing(self, app_id: str, reason: str | None, by: CancelledBy | None) -> None:
        pass


class WithErrorFiles(Core):
    """Reads error files, so it may declare ``error_files`` (a subclass inherits the method)."""

    def read_error_file(self, app_id: str, role_name: str, k: int) -> tuple[str, float] | None:
        return None


def test_every_capability_that_needs_methods_names_methods_of_the_contract() -> None:
    assert set(CAPABILITY_METHODS) <= set(SchedulerCapabilities.__dataclass_fields__)
    assert all(callable(getattr(Scheduler, m)) for methods in CAPABILITY_METHODS.values() for m in methods)


def test_a_capability_without_its_method_is_refused_naming_class_capability_and_method() -> None:
    with pytest.raises(
        TypeError,
        match=r"\.NoErrorFiles declares the capability 'error_files', which needs the method read_error_file\(\)",
    ):

        class NoErrorFiles(Core):
            capabilities = SchedulerCapabilities(error_files=True)


def test_separate_stderr_without_a_log_reader_of_its_own_is_refused() -> None:
    with pytest.raises(TypeError, match=r"capability 'separate_stderr', which needs the method log_iter\(\)"):

        class NoLogs(Core):
            capabilities = SchedulerCapabilities(separate_stderr=True)


def test_prune_without_a_prune_of_its_own_is_refused() -> None:
    with pytest.raises(TypeError, match=r"\.NoPrune declares the capability 'prune', which needs the method prune\(\)"):

        class NoPrune(Core):
            capabilities = SchedulerCapabilities(prune=True)


def test_a_capability_whose_method_a_base_of_its_own_defines_is_met() -> None:
    class Inherits(WithErrorFiles):
        capabilities = SchedulerCapabilities(error_files=True)

    assert Inherits("inherits", "s").capabilities.error_files


def test_a_capability_with_its_method_defined_is_met() -> None:
    class Streams(Core):
        capabilities = SchedulerCapabilities(separate_stderr=True)

        def log_iter(self, *args: Any, **kwargs: Any) -> Iterable[str]:
            return []

    assert Streams("streams", "s").capabilities.separate_stderr


def test_a_list_without_limit_is_refused_not_rewritten() -> None:
    with pytest.raises(TypeError, match=r"\.OldList\.list takes no limit=: Scheduler\.list takes"):

        class OldList(Core):
            def list(self, cfg: Cfg | None = None, labels: Mapping[str, str] | None = None) -> Any:
                return []


@pytest.mark.parametrize("backend", [LocalScheduler, AWSBatchScheduler, AcmeScheduler])
def test_the_builtin_schedulers_and_the_example_plugin_meet_the_contract(backend: type[Scheduler[Any]]) -> None:
    check_contract(backend)
