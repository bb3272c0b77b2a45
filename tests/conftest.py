"""Shared fixtures: each area keeps its own in ``tests/fixtures/`` and they are exported here.
Tests marked ``gpu`` run only with ``TORCHX_TEST_GPU=1`` (``scripts/gpu-check.sh``)."""

import os

import pytest

from tests.fixtures.airflow import *  # noqa: F403
from tests.fixtures.aws import *  # noqa: F403
from tests.fixtures.clock import *  # noqa: F403
from tests.fixtures.slurm import *  # noqa: F403
from tests.fixtures.torch import *  # noqa: F403
from tests.fixtures.triggerer import *  # noqa: F403


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("TORCHX_TEST_GPU") == "1":
        return
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if gpu:
        config.hook.pytest_deselected(items=gpu)
        items[:] = [item for item in items if not item.get_closest_marker("gpu")]
