"""Shared fixtures: each area keeps its own in ``tests/fixtures/`` and they are exported here."""

from tests.fixtures.airflow import *  # noqa: F403
from tests.fixtures.aws import *  # noqa: F403
from tests.fixtures.torch import *  # noqa: F403
